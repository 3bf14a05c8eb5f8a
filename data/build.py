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
from lpmetrics.errors import ConfigError

#: The ``dataset`` keys :func:`build_data` reads: every ``configs/dataset/*.yaml`` sets them, and
#: there is no default in code (``configs/dataset/cifar10.yaml`` says what each one means).
KEYS = ("name", "root", "download", "cache_dir", "source", "task", "neg_keep", "drop_rate",
        "val_size", "groups", "split", "normalize", "augment")
#: read for image sources only (flat features are not cropped)
IMAGE_KEYS = ("crop_padding",)


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


def missing_keys(cfg: Mapping, keys: tuple[str, ...] = KEYS) -> list[str]:
    """The ``keys`` that the dataset config ``cfg`` lacks."""
    return [key for key in keys if key not in cfg]


def _require(cfg: Mapping, keys: tuple[str, ...]) -> None:
    missing = missing_keys(cfg, keys)
    if missing:
        raise ConfigError(f"dataset config {cfg.get('name')!r} lacks {', '.join('dataset.' + k for k in missing)}: "
                          "every configs/dataset/*.yaml sets them (configs/dataset/cifar10.yaml says what each "
                          "means); add them to the dataset's YAML, or to the mapping given to build_data")


def load_source(cfg: Mapping) -> SourceData:
    """Call ``cfg["source"]["_target_"]`` with its options plus ``root``/``download``/``cache_dir``."""
    from hydra.utils import get_method

    source = dict(cfg["source"] or {})
    if "_target_" not in source:
        raise ValueError(f"dataset '{cfg['name']}' has no source._target_ (e.g. "
                         "source: {_target_: lpmetrics.data.images.cifar10}); see configs/dataset/*.yaml")
    # Resolve _target_ with Hydra but call it ourselves: hydra.utils.call would wrap our typed
    # DatasetNotFoundError / SplitError in an InstantiationException.
    fn = get_method(source.pop("_target_"))
    return fn(**source, root=cfg["root"], download=bool(cfg["download"]), cache_dir=cfg["cache_dir"])


def build_data(cfg_dataset: Any, seed: int) -> DataBundle:
    """Build the train / val / test datasets of the paper's protocol.

    Args:
        cfg_dataset: the ``dataset`` config (``configs/dataset/*.yaml``), every key of
            :data:`KEYS` (no defaults here: the YAML holds them): ``name``, ``root``,
            ``download``, ``cache_dir``, ``source`` (``_target_`` + options), ``task``,
            ``neg_keep``, ``drop_rate``, ``val_size``, ``groups``, ``split`` (``paper`` |
            ``authors``: :mod:`data.splits`), ``normalize`` (``per_channel`` | ``per_image``:
            :mod:`data.datasets`), ``augment``; image sources also ``crop_padding``.
        seed: seeds the validation hold-out and the imbalance dropping (not the data itself).

    Raises:
        ConfigError: ``cfg_dataset`` lacks one of those keys (the message names them).
        DatasetNotFoundError: the source's files are missing (the message names them).
        SplitError: a split lacks one of the task's classes.

    Example::

        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.load("configs/dataset/digits.yaml")
        >>> bundle = build_data(OmegaConf.merge(cfg, {"neg_keep": 0.1}), 0)
        >>> bundle.input_shape, bundle.num_classes, round(bundle.stats["train"]["pos_fraction"], 2)
        ((64,), 2, 0.91)
    """
    cfg = _plain(cfg_dataset)
    _require(cfg, KEYS)
    task = cfg["task"]
    src = load_source(cfg)
    if src.kind == "image":
        _require(cfg, IMAGE_KEYS)
    splits = build_splits(src.y_train, src.y_test, task=task, neg_keep=float(cfg["neg_keep"]),
                          drop_rate=float(cfg["drop_rate"]), val_size=cfg["val_size"], seed=int(seed),
                          groups=cfg["groups"], num_classes=src.num_classes, protocol=str(cfg["split"]))
    normalize = str(cfg["normalize"])
    parts = {"train": (src.x_train, src.y_train, splits.train),
             "val": (src.x_train, src.y_train, splits.val),
             "test": (src.x_test, src.y_test, splits.test)}
    datasets, stats = {}, {}
    for split, (x, y, idx) in parts.items():
        labels = relabel(y[idx], splits.groups)
        if src.kind == "image":
            datasets[split] = ImageDataset(x[idx], labels, src.mean, src.std,
                                           augment=split == "train" and bool(cfg["augment"]),
                                           pad=int(cfg["crop_padding"]), normalize=normalize)
        else:
            datasets[split] = TabularDataset(x[idx], labels, src.mean, src.std, normalize=normalize)
        stats[split] = split_stats(labels, len(splits.groups), task)
    return DataBundle(**datasets, num_classes=len(splits.groups), input_shape=src.input_shape,
                      task=task, stats=stats, name=str(cfg["name"]),
                      groups=splits.groups, origin=src.origin)
