"""Tabular sources: scikit-learn's digits (the always-available default) and svmlight files.

Both return float features ``[N, D]`` with per-feature mean/std of the official train split
(the standardisation :class:`data.datasets.TabularDataset` applies; constant features keep
std 1). When a dataset has no official test split, a fixed stratified one is carved out with the
*source's* seed (``seed``, default 0), not the run's, so the test set is the same for every run.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from lpmetrics.data.errors import DatasetNotFoundError
from lpmetrics.data.source import SourceData, data_root


def _fixed_test_split(x, y, test_fraction: float, seed: int):
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction} must be in (0, 1)")
    tr, te = train_test_split(np.arange(len(y)), test_size=test_fraction, stratify=y,
                              random_state=seed)
    tr, te = np.sort(tr), np.sort(te)
    return x[tr], y[tr], x[te], y[te]


def _tabular(x_tr, y_tr, x_te, y_te, standardize: bool, **kw) -> SourceData:
    mean = x_tr.mean(axis=0) if standardize else 0.0
    std = x_tr.std(axis=0) if standardize else 1.0
    return SourceData(x_tr, y_tr.astype(np.int64), x_te, y_te.astype(np.int64),
                      kind="tabular", mean=mean, std=std, **kw)


def digits(root=None, download: bool = False, cache_dir=None, test_fraction: float = 0.2,
           seed: int = 0, standardize: bool = True) -> SourceData:
    """scikit-learn's 8x8 digits (1,797 images, 10 classes) as 64 flat features.

    Ships inside scikit-learn, so it works offline with no data root (``root``, ``download``,
    ``cache_dir`` are accepted and unused). No official test split: a stratified
    ``test_fraction`` (360 images at 0.2) is fixed by ``seed``.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x_tr, y_tr, x_te, y_te = _fixed_test_split(bunch.data.astype(np.float64), bunch.target,
                                               test_fraction, seed)
    return _tabular(x_tr, y_tr, x_te, y_te, standardize, num_classes=10,
                    class_names=[str(c) for c in range(10)], origin="sklearn.datasets.load_digits")


def _resolve(path, root) -> Path:
    path = Path(os.path.expanduser(str(path)))
    return path if path.is_absolute() else data_root(root) / path


def svmlight(root=None, download: bool = False, cache_dir=None, path: str | None = None,
             test_path: str | None = None, test_fraction: float = 0.2, seed: int = 0,
             standardize: bool = True, n_features: int | None = None) -> SourceData:
    """A LIBSVM/svmlight file (``sklearn.datasets.load_svmlight_file``), densified.

    ``path`` (and ``test_path``) are absolute or relative to ``root``; a ``.bz2`` / ``.gz`` file
    is read as is. Without ``test_path`` a stratified ``test_fraction`` of ``path`` is the fixed
    test split. Labels are mapped to ``0..K-1`` in sorted order (so ``-1/+1`` and ``1/2`` become
    ``0/1``: in the binary task the larger original label is the positive class).

    Grabocka et al. 2019 (Table 1) train on nine binary sets, each pooled and split
    80/20 at random: give the pooled file as ``path`` and keep ``test_fraction=0.2``.
    ``configs/dataset/svmlight.yaml`` lists each set's files, counts and positive class, and a
    command close to their §4.1. Six are LIBSVM files (concatenate a set's files after
    decompressing, e.g. ``cat a9a a9a.t > a9a.all``); three are Kaggle CSVs, converted once::

        import pandas as pd
        from sklearn.datasets import dump_svmlight_file
        df = pd.read_csv("creditcard.csv")               # CC-Fraud
        y = df.pop("Class").to_numpy()                   # Porto-Seguro, Santander: "target"
        df = df.drop(columns=["Time"])                   # Porto-Seguro: "id"; Santander: "ID_code"
        dump_svmlight_file(df.to_numpy(float), y, "ccfraud.svm", zero_based=False)
    """
    from sklearn.datasets import load_svmlight_file

    if not path:
        raise ValueError("the svmlight source needs dataset.source.path=<file> (absolute or "
                         "relative to dataset.root)")
    files = [_resolve(path, root)] + ([_resolve(test_path, root)] if test_path else [])
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise DatasetNotFoundError(f"svmlight file(s) not found: {', '.join(missing)}. Set "
                                   "dataset.source.path= (and test_path=) to existing files, "
                                   "absolute or relative to DATA_ROOT / dataset.root=.")
    x_tr, y_tr = load_svmlight_file(str(files[0]), n_features=n_features)
    if test_path:
        x_te, y_te = load_svmlight_file(str(files[1]), n_features=x_tr.shape[1])
        x_tr, x_te = x_tr.toarray(), x_te.toarray()
    else:
        x_tr, y_tr, x_te, y_te = _fixed_test_split(x_tr.toarray(), y_tr, test_fraction, seed)
    classes = np.unique(np.concatenate([y_tr, y_te]))
    return _tabular(x_tr, np.searchsorted(classes, y_tr), x_te, np.searchsorted(classes, y_te),
                    standardize, num_classes=len(classes),
                    class_names=[f"{c:g}" for c in classes], origin=str(files[0]))
