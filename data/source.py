"""What a dataset source returns, and the lookup every image source shares.

A *source* is a function ``f(root, download, cache_dir, **options) -> SourceData`` named by
``dataset.source._target_``. It returns the official train and test splits with their original
labels; the protocol (val hold-out, grouping, imbalance) is applied later by
:func:`data.splits.build_splits`, identically for every source.

Image lookup order (:func:`locate`): torchvision's own folder under ``root`` -> the ``.npz`` pack
under ``root`` -> torchvision's download when ``download=True`` -> :class:`DatasetNotFoundError`
naming every accepted path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from lpmetrics.data.errors import DatasetNotFoundError
from lpmetrics.data.packed import load_pack


@dataclass
class SourceData:
    """Official train/test splits of one dataset, original labels.

    ``kind="image"``: ``x_*`` uint8 ``[N, C, H, W]``, ``mean``/``std`` per channel on [0, 1].
    ``kind="tabular"``: ``x_*`` float ``[N, D]``, ``mean``/``std`` per feature (raw scale).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    kind: str = "image"
    mean: Sequence[float] | np.ndarray = 0.0
    std: Sequence[float] | np.ndarray = 1.0
    class_names: list[str] = field(default_factory=list)
    origin: str = ""  # where the data came from, for logs

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x_train.shape[1:])


@dataclass
class ImageLayout:
    """How one image dataset may be found: torchvision folder, pack, downloader."""

    title: str                                   # "CIFAR-10"
    pack: str | None = None                      # pack file under root, "cifar10.npz"
    folder: str | None = None                    # torchvision's folder under root
    files: Sequence[str] = ()                    # files inside ``folder`` that must all exist
    read_folder: Callable[[Path], dict] | None = None   # folder -> {"train_x", "train_y", ...}
    download: Callable[[Path], None] | None = None      # fetch torchvision's files into root


def data_root(root: str | os.PathLike | None) -> Path:
    """The configured root, or ``$DATA_ROOT``, or ``~/.cache/lpnd/data``."""
    if root in (None, ""):
        root = os.environ.get("DATA_ROOT") or Path.home() / ".cache" / "lpnd" / "data"
    return Path(os.path.expanduser(str(root)))


def _has_folder(root: Path, layout: ImageLayout) -> bool:
    return layout.folder is not None and all((root / layout.folder / f).is_file() for f in layout.files)


def not_found_message(root: Path, layout: ImageLayout, download: bool, reason: str = "") -> str:
    want = []
    if layout.folder:
        want.append(f"torchvision's folder {root / layout.folder}/ with {', '.join(layout.files)}")
    if layout.pack:
        want.append(f"the pack {root / layout.pack} (format: shared/data/README.md)")
    how = "Point DATA_ROOT (or dataset.root=/path) at a folder holding " + (
        "it" if len(want) == 1 else "one of them")
    if layout.download is not None and not download:
        how += ", or run with dataset.download=true where a network exists"
    msg = f"{layout.title} not found under {root}. Expected " + "; or ".join(want) + f". {how}."
    return msg + (f" ({reason})" if reason else "")


def locate(root, download: bool, cache_dir, layout: ImageLayout) -> dict:
    """Find and read an image dataset; returns ``{"train_x", "train_y", "test_x", "test_y",
    "class_names", "origin"}`` with ``*_x`` uint8 ``[N, C, H, W]``."""
    root = data_root(root)
    if _has_folder(root, layout):
        return {**layout.read_folder(root / layout.folder), "origin": str(root / layout.folder)}
    if layout.pack and (root / layout.pack).is_file():
        return {**load_pack(root / layout.pack, cache_dir), "origin": str(root / layout.pack)}
    if download and layout.download is not None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            layout.download(root)
        except Exception as err:  # no network, read-only root, bad checksum, ...
            raise DatasetNotFoundError(not_found_message(
                root, layout, download, f"download=true failed: {type(err).__name__}: {err}")) from err
        if _has_folder(root, layout):
            return {**layout.read_folder(root / layout.folder), "origin": str(root / layout.folder)}
    raise DatasetNotFoundError(not_found_message(root, layout, download))


def image_source(found: dict, layout: ImageLayout, mean, std, num_classes: int) -> SourceData:
    """Wrap :func:`locate`'s result, checking labels against the expected class count."""
    for split in ("train", "test"):
        y = found[f"{split}_y"]
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f"{layout.title} {split} labels span {y.min()}..{y.max()}, expected "
                             f"0..{num_classes - 1} (source: {found['origin']})")
    return SourceData(found["train_x"], found["train_y"], found["test_x"], found["test_y"],
                      num_classes=num_classes, kind="image", mean=mean, std=std,
                      class_names=list(found.get("class_names") or []), origin=found["origin"])
