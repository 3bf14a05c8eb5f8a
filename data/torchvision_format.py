"""Readers for torchvision's on-disk layouts (CIFAR-10, CIFAR-100, STL-10), and its downloads.

We read the documented layouts ourselves instead of instantiating ``torchvision.datasets``
classes: those verify an MD5 of every file on each load (seconds for CIFAR, and STL-10's check
includes the 2.5 GB ``unlabeled_X.bin`` we never use) and so reject the small fake files the tests
write. torchvision is still what downloads the archives (``download=True``), so the folders are
exactly the ones its classes create:

* ``cifar-10-batches-py/``: ``data_batch_1..5``, ``test_batch`` -- pickled dicts with ``data``
  uint8 ``[N, 3072]`` (CHW-flattened rows) and ``labels``; ``batches.meta`` (``label_names``).
* ``cifar-100-python/``: ``train``, ``test`` -- the same with ``fine_labels``; ``meta``
  (``fine_label_names``).
* ``stl10_binary/``: ``{train,test}_X.bin`` uint8 ``[N, 3, 96, 96]`` stored column-major
  (so each image plane is transposed), ``{train,test}_y.bin`` uint8 labels 1..10;
  ``class_names.txt``. Labeled part only: train 5,000, test 8,000.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

CIFAR10_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
CIFAR100_FILES = ["train", "test"]
STL10_FILES = ["train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin"]


def _unpickle(path: Path) -> dict:
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    # Python-3 pickles (and our test fakes) may use bytes keys; the originals use str keys.
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}


def _cifar_split(folder: Path, files: list[str], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for name in files:
        entry = _unpickle(folder / name)
        xs.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(entry[label_key], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def _meta_names(path: Path, key: str) -> list[str]:
    return [str(n) for n in _unpickle(path)[key]] if path.is_file() else []


def read_cifar10(folder: Path) -> dict:
    train_x, train_y = _cifar_split(folder, CIFAR10_FILES[:5], "labels")
    test_x, test_y = _cifar_split(folder, CIFAR10_FILES[5:], "labels")
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y,
            "class_names": _meta_names(folder / "batches.meta", "label_names")}


def read_cifar100(folder: Path) -> dict:
    train_x, train_y = _cifar_split(folder, ["train"], "fine_labels")
    test_x, test_y = _cifar_split(folder, ["test"], "fine_labels")
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y,
            "class_names": _meta_names(folder / "meta", "fine_label_names")}


def _stl10_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    x = np.fromfile(folder / f"{split}_X.bin", dtype=np.uint8).reshape(-1, 3, 96, 96)
    y = np.fromfile(folder / f"{split}_y.bin", dtype=np.uint8).astype(np.int64) - 1  # 1..10
    if len(x) != len(y):
        raise ValueError(f"STL-10 {split}: {len(x)} images but {len(y)} labels in {folder}")
    return np.ascontiguousarray(x.transpose(0, 1, 3, 2)), y  # column-major planes -> [C, H, W]


def read_stl10(folder: Path) -> dict:
    train_x, train_y = _stl10_split(folder, "train")
    test_x, test_y = _stl10_split(folder, "test")
    names = folder / "class_names.txt"
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y,
            "class_names": names.read_text().split() if names.is_file() else []}


def download_cifar10(root: Path) -> None:
    import torchvision
    torchvision.datasets.CIFAR10(str(root), train=True, download=True)


def download_cifar100(root: Path) -> None:
    import torchvision
    torchvision.datasets.CIFAR100(str(root), train=True, download=True)


def download_stl10(root: Path) -> None:
    import torchvision
    torchvision.datasets.STL10(str(root), split="train", download=True)
