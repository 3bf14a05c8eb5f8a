"""Split protocol (exact counts, determinism, disjointness, failure paths) and the offline sources."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lpmetrics.data import DatasetNotFoundError, SplitError, build_data
from lpmetrics.data.imbalance import class_groups, relabel
from lpmetrics.data.splits import build_splits
from tests.test_data_helpers import dataset_cfg

CIFAR_LIKE = np.repeat(np.arange(10), 5000)      # official train split, balanced
CIFAR_LIKE_TEST = np.repeat(np.arange(10), 1000)


def _counts(labels, splits, idx):
    return np.bincount(relabel(labels[idx], splits.groups), minlength=len(splits.groups))


def test_class_groups_follow_the_paper():
    assert class_groups(10, "binary") == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert class_groups(2, "binary") == [[0], [1]]  # Cat&Dog: cat negative, dog positive
    assert class_groups(10, "multiclass") == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]  # STL-10
    g = class_groups(100, "multiclass")  # CIFAR-100: 0-32 | 33-65 | 66-99
    assert (g[0][0], g[0][-1], g[1][0], g[1][-1], g[2][0], g[2][-1]) == (0, 32, 33, 65, 66, 99)
    assert class_groups(100, "binary")[1][0] == 50
    with pytest.raises(ValueError, match="partition"):
        class_groups(4, "binary", [[0, 1], [1, 2, 3]])
    with pytest.raises(ValueError, match="task=binary"):
        class_groups(2, "multiclass")


@pytest.mark.parametrize("neg_keep, n_neg, ratio", [(0.1, 2250, 0.91), (0.2, 4500, 0.83),
                                                    (0.4, 9000, 0.71), (1.0, 22500, 0.50)])
def test_binary_imbalance_gives_the_papers_positive_ratios(neg_keep, n_neg, ratio):
    s = build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, neg_keep=neg_keep, val_size=5000, seed=0)
    neg, pos = _counts(CIFAR_LIKE, s, s.train)
    assert (pos, neg) == (22500, n_neg)
    assert round(pos / (pos + neg), 2) == ratio
    # stratified by original class: every negative class keeps the same share
    assert set(np.bincount(CIFAR_LIKE[s.train], minlength=10)[:5]) == {n_neg // 5}
    # val and test keep their natural balance
    assert list(_counts(CIFAR_LIKE, s, s.val)) == [2500, 2500]
    assert list(_counts(CIFAR_LIKE_TEST, s, s.test)) == [5000, 5000]


@pytest.mark.parametrize("drop_rate, kept", [(0.9, 450), (0.8, 900), (0.6, 1800), (0.0, 4500)])
def test_multiclass_drop_rate_thins_the_first_two_groups(drop_rate, kept):
    s = build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, task="multiclass", drop_rate=drop_rate,
                     val_size=5000, seed=3)
    assert list(_counts(CIFAR_LIKE, s, s.train)) == [3 * kept, 3 * kept, 4 * 4500]
    assert list(_counts(CIFAR_LIKE, s, s.val)) == [1500, 1500, 2000]


def test_cifar100_sized_labels():
    y, yt = np.repeat(np.arange(100), 500), np.repeat(np.arange(100), 100)
    s = build_splits(y, yt, neg_keep=0.1, val_size=5000, seed=0)
    assert list(_counts(y, s, s.train)) == [2250, 22500]
    s = build_splits(y, yt, task="multiclass", drop_rate=0.9, val_size=5000, seed=0)
    assert list(_counts(y, s, s.train)) == [33 * 45, 33 * 45, 34 * 450]


def test_splits_are_deterministic_in_the_seed_and_disjoint():
    a = build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, neg_keep=0.2, val_size=5000, seed=7)
    b = build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, neg_keep=0.2, val_size=5000, seed=7)
    c = build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, neg_keep=0.2, val_size=5000, seed=8)
    for part in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(a, part), getattr(b, part))
    assert not np.array_equal(a.train, c.train) and not np.array_equal(a.val, c.val)
    assert np.intersect1d(a.train, a.val).size == 0
    assert len(np.unique(a.train)) == len(a.train)
    np.testing.assert_array_equal(a.test, np.arange(len(CIFAR_LIKE_TEST)))  # never subsampled


def test_val_is_held_out_before_the_imbalance():
    """Same seed -> the same val images at every ratio; train is a subset of the 1.0 train."""
    full = build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, neg_keep=1.0, val_size=5000, seed=1)
    thin = build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, neg_keep=0.1, val_size=5000, seed=1)
    np.testing.assert_array_equal(full.val, thin.val)
    assert np.isin(thin.train, full.train).all() and len(full.train) == 45000


def test_split_errors_are_typed_and_explain_the_fix():
    with pytest.raises(SplitError, match="test split.*missing"):
        build_splits(CIFAR_LIKE, np.zeros(100, dtype=int), val_size=5000, num_classes=10)
    with pytest.raises(SplitError, match="val_size"):  # 1 val sample cannot hold both classes
        build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, val_size=1)
    y = np.r_[np.zeros(20, int), np.ones(200, int)]  # 20 negatives, 2 of them in val
    with pytest.raises(SplitError, match="train split.*neg_keep"):  # 0.01 * 18 rounds to 0
        build_splits(y, y, neg_keep=0.01, val_size=22)
    assert issubclass(SplitError, ValueError)


def test_misused_knobs_raise():
    with pytest.raises(ValueError, match="drop_rate is the multiclass knob"):
        build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, drop_rate=0.9, val_size=5000)
    with pytest.raises(ValueError, match="neg_keep is the binary knob"):
        build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, task="multiclass", neg_keep=0.1, val_size=5000)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, neg_keep=0.0, val_size=5000)
    # a config error wherever the data are built (train.py, eval.py, scripts): typed, key named
    with pytest.raises(SplitError, match=r"dataset.neg_keep=2.0 must be in \(0, 1\]: .* use dataset.neg_keep=0.1"):
        build_splits(CIFAR_LIKE, CIFAR_LIKE_TEST, neg_keep=2.0, val_size=5000)


def test_digits_always_works_offline():
    b = build_data(dataset_cfg("digits", neg_keep=0.1), seed=0)
    assert (b.name, b.task, b.num_classes, b.input_shape) == ("digits", "binary", 2, (64,))
    x, y = b.train[0]
    assert x.dtype == torch.float32 and x.shape == (64,) and y.dtype == torch.int64 and y.ndim == 0
    for part in ("train", "val", "test"):
        ds = getattr(b, part)
        assert ds.labels.dtype == np.int64 and len(ds) == b.stats[part]["n"]
        assert b.stats[part]["class_counts"] == np.bincount(ds.labels, minlength=2).tolist()
    assert (b.stats["val"]["n"], b.stats["test"]["n"]) == (360, 360)
    assert abs(b.stats["train"]["pos_fraction"] - 1 / 1.1) < 0.01
    # standardised with train-pool statistics
    assert abs(float(b.train.features.mean())) < 0.2


def test_digits_multiclass_and_dictconfig_input():
    cfg = OmegaConf.create(dataset_cfg("digits", task="multiclass", drop_rate=0.6))
    b = build_data(cfg, seed=1)
    assert b.num_classes == 3 and "pos_fraction" not in b.stats["train"]
    assert b.groups == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    counts = b.stats["train"]["class_counts"]
    assert counts[0] < counts[2] / 2 and counts[1] < counts[2] / 2


def test_synthetic_teacher_data_is_deterministic():
    a = build_data(dataset_cfg("synthetic"), seed=0)
    b = build_data(dataset_cfg("synthetic"), seed=0)
    torch.testing.assert_close(a.train.features, b.train.features)
    n = {p: a.stats[p]["n"] for p in ("train", "val", "test")}
    assert n == {"train": 9000, "val": 1000, "test": 10000} and a.input_shape == (10,)
    pos = sum(a.stats[p]["class_counts"][1] for p in n)
    assert pos == 4000  # exactly the top 20 % of 20,000 teacher scores
    other = build_data(dataset_cfg("synthetic", source={"seed": 1}), seed=0)
    assert not torch.equal(other.test.features, a.test.features)


def test_svmlight_file_and_missing_path(tmp_path):
    from sklearn.datasets import dump_svmlight_file

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((300, 5)), np.where(rng.random(300) < 0.5, -1, 1)
    dump_svmlight_file(x, y, str(tmp_path / "toy.svm"))
    b = build_data(dataset_cfg("svmlight", root=str(tmp_path), val_size=0.1,
                               source={"path": "toy.svm"}), seed=0)
    assert b.input_shape == (5,) and b.stats["test"]["n"] == 60 and b.stats["val"]["n"] == 24
    assert sorted(np.unique(b.test.labels)) == [0, 1]  # -1/+1 -> 0/1
    with pytest.raises(DatasetNotFoundError, match=str(tmp_path / "nope.svm")):
        build_data(dataset_cfg("svmlight", root=str(tmp_path), source={"path": "nope.svm"}), 0)
