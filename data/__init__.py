"""Datasets and the paper's imbalanced splits (Meng et al. 2021, §5; Liu et al. 2019 protocol).

Public API::

    from lpmetrics.data import build_data, DatasetNotFoundError, SplitError
    bundle = build_data(cfg.dataset, seed)      # train / val / test datasets, stats, shapes

Modules, one concept each:

* :mod:`data.build` -- ``build_data`` and ``DataBundle``.
* :mod:`data.splits` -- val hold-out + imbalance + checks (pure function of labels, config, seed).
* :mod:`data.imbalance` -- class grouping (halves / thirds) and stratified dropping.
* :mod:`data.datasets` -- in-memory uint8 image / float tabular ``Dataset`` s (batch gather, ``to(device)``).
* :mod:`data.augment` -- batched random crop + flip (one gather, any device).
* :mod:`data.stream` -- the training batch stream, a pure function of (seed, step).
* :mod:`data.source` -- ``SourceData`` and the image lookup (torchvision folder -> pack -> download).
* :mod:`data.images` -- CIFAR-10, CIFAR-100, STL-10, Cat&Dog sources.
* :mod:`data.torchvision_format` -- readers of torchvision's on-disk layouts.
* :mod:`data.packed` -- ``.npz`` packs, decoded once and cached as ``.npy``.
* :mod:`data.tabular` -- scikit-learn digits (offline default) and svmlight files.
* :mod:`data.synthetic` -- Song et al. 2016's random ReLU-teacher data.
"""
if not __name__.startswith("lpmetrics."):   # one identity per class (lpmetrics/__init__.py)
    raise ImportError(f"import lpmetrics.{__name__}, not the bare folder name {__name__!r}")
from lpmetrics.data.build import DataBundle, build_data
from lpmetrics.data.errors import DatasetNotFoundError, SplitError

__all__ = ["build_data", "DataBundle", "DatasetNotFoundError", "SplitError"]
