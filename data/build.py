"""``build_data(cfg.dataset, seed)``: source -> protocol splits -> datasets + stats."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from torch.utils.data import Dataset

from lpmetrics.data.datasets import ImageDataset, TabularDataset
from lpmetrics.data.imbalance import relabel
from lpmetrics.data.source import SourceData
from lpmetrics.data.splits import build_splits


@dataclass
class DataBundle:
    """What the trainer and ``eval.py`` use. Each split's items are ``(x float32, y int64 scalar)``
    and each split has ``labels`` (numpy int64, the task's labels). ``val`` is empty under
    ``dataset.split=authors`` (no hold-out).

    ``stats[split] = {"n", "class_counts", "pos_fraction" (binary only: fraction of label 1)}``;
    ``groups[k]`` lists the original classes of label ``k``; ``origin`` says where the data came from.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, ...]
    task: str
    stats: dict
    name: str
    groups: list[list[int]] = field(default_factory=list)
    origin: str = ""

    def to(self, device) -> "DataBundle":
        """Move every split's data to ``device`` once (in place; returns ``self``): training
        batches and evaluation are then gathered there (:mod:`data.stream`)."""
        for split in (self.train, self.val, self.test):
            if hasattr(split, "to"):
                split.to(device)
        return self


def _plain(cfg: Any) -> dict:
    """A DictConfig (resolved) or mapping as a plain dict."""
    try:
        from omegaconf import DictConfig, OmegaConf
        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with hydra
        pass
    if not isinstance(cfg, Mapping):
        raise TypeError(f"build_data expects the dataset config (DictConfig or dict), got {type(cfg)}")
    return dict(cfg)


def split_stats(labels: np.ndarray, num_classes: int, task: str) -> dict:
    counts = np.bincount(labels, minlength=num_classes)
    out = {"n": int(len(labels)), "class_counts": [int(c) for c in counts]}
    if task == "binary":
        out["pos_fraction"] = float(counts[1] / max(len(labels), 1))
    return out


def load_source(cfg: Mapping) -> SourceData:
    """Call ``cfg["source"]["_target_"]`` with its options plus ``root``/``download``/``cache_dir``."""
    from hydra.utils import get_method

    source = dict(cfg.get("source") or {})
    if "_target_" not in source:
        raise ValueError(f"dataset '{cfg.get('name')}' has no source._target_ (e.g. "
                         "source: {_target_: lpmetrics.data.images.cifar10}); see configs/dataset/*.yaml")
    # Resolve _target_ with Hydra but call it ourselves: hydra.utils.call would wrap our typed
    # DatasetNotFoundError / SplitError in an InstantiationException.
    fn = get_method(source.pop("_target_"))
    return fn(**source, root=cfg.get("root"), download=bool(cfg.get("download", False)),
              cache_dir=cfg.get("cache_dir"))


def build_data(cfg_dataset: Any, seed: int) -> DataBundle:
    """Build the train / val / test datasets of the paper's protocol.

    Args:
        cfg_dataset: the ``dataset`` config (``configs/dataset/*.yaml``): ``name``, ``root``,
            ``download``, ``task``, ``neg_keep``, ``drop_rate``, ``val_size``, ``augment``,
            optional ``groups``, ``cache_dir``, ``crop_padding``, ``split`` (``paper`` |
            ``authors``: :mod:`data.splits`), ``normalize`` (``per_channel`` | ``per_image``:
            :mod:`data.datasets`), and ``source`` (``_target_`` + options).
        seed: seeds the validation hold-out and the imbalance dropping (not the data itself).

    Raises:
        DatasetNotFoundError: the source's files are missing (the message names them).
        SplitError: a split lacks one of the task's classes.

    Example::

        >>> bundle = build_data({"name": "digits", "task": "binary", "neg_keep": 0.1,
        ...                      "val_size": 360, "source": {"_target_": "lpmetrics.data.tabular.digits"}}, 0)
        >>> bundle.input_shape, bundle.num_classes, round(bundle.stats["train"]["pos_fraction"], 2)
        ((64,), 2, 0.91)
    """
    cfg = _plain(cfg_dataset)
    task = cfg.get("task", "binary")
    src = load_source(cfg)
    splits = build_splits(src.y_train, src.y_test, task=task,
                          neg_keep=float(cfg.get("neg_keep", 1.0)),
                          drop_rate=float(cfg.get("drop_rate", 0.0)),
                          val_size=cfg.get("val_size", 0.1), seed=int(seed),
                          groups=cfg.get("groups"), num_classes=src.num_classes,
                          protocol=str(cfg.get("split", "paper")))
    normalize = str(cfg.get("normalize", "per_channel"))
    parts = {"train": (src.x_train, src.y_train, splits.train),
             "val": (src.x_train, src.y_train, splits.val),
             "test": (src.x_test, src.y_test, splits.test)}
    datasets, stats = {}, {}
    for split, (x, y, idx) in parts.items():
        labels = relabel(y[idx], splits.groups)
        if src.kind == "image":
            datasets[split] = ImageDataset(x[idx], labels, src.mean, src.std,
                                           augment=split == "train" and bool(cfg.get("augment", False)),
                                           pad=int(cfg.get("crop_padding", 4)), normalize=normalize)
        else:
            datasets[split] = TabularDataset(x[idx], labels, src.mean, src.std, normalize=normalize)
        stats[split] = split_stats(labels, len(splits.groups), task)
    return DataBundle(**datasets, num_classes=len(splits.groups), input_shape=src.input_shape,
                      task=task, stats=stats, name=str(cfg.get("name", "")),
                      groups=splits.groups, origin=src.origin)
