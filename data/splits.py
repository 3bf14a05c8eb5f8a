"""Train / val / test index builder: a pure function of (labels, protocol config, seed).

Order of operations (the protocol every dataset follows):

1. **Validation hold-out** from the official train split, stratified by original class and seeded
   (sizes of Liu et al. 2019, paper §5: Cat&Dog 19k/1k, CIFAR-10/100 45k/5k, STL-10 4k/1k).
2. **Relabel** original classes into the task's groups (:func:`data.imbalance.class_groups`).
3. **Imbalance the train part only** (:mod:`data.imbalance`): ``neg_keep`` of the negatives kept
   (binary) or ``drop_rate`` of the first two groups dropped (multi-class).
4. **Test** = the official test split, relabelled, never subsampled.

What the paper specifies and what we chose: the paper gives the train/val sizes and says it
drops samples "from the negative class" to reach the positive ratio of Table 1 (and likewise
for the multi-class drop rate), but not whether val is carved out before or after dropping, nor
whether val/test are made imbalanced. We hold val out *before* the imbalance and leave val and
test at their natural (relabelled) class balance: the 45k/5k sizes then match the paper exactly,
val/test are identical for every ``neg_keep`` (so runs at different ratios are evaluated on the
same images), and the positive ratio of Table 1 is the ratio of the *training* data. A split that
lacks one of the task's classes raises :class:`SplitError` before any training.

``protocol`` (``dataset.split``, :data:`PROTOCOLS`) picks between that (``paper``, the default)
and the authors' public code (``authors``; ``binary_auc.py`` of zihangm/nondecomposable-as-lp):
the *whole* official train split is the train pool, with **no validation hold-out** (``val`` is
empty; the trainer then records no val metrics and selects nothing, see :class:`lpmetrics.run.job.Run`), and each
thinned group keeps its first ``int(keep * n)`` samples after a shuffle seeded by ``seed``
(:func:`data.imbalance.first_after_shuffle`; not stratified by original class): CIFAR-10 at
``neg_keep=0.1`` trains on all 25,000 positives and 2,500 negatives, as the authors do. Their
shuffle is seeded 123 for every run and permutes CIFAR's file order, which the packs do not keep
(they are sorted by label), so the same 2,500 images cannot be recovered; ours is seeded by the
run's seed, on its own stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from sklearn.model_selection import train_test_split

from lpmetrics.data.errors import SplitError
from lpmetrics.data.imbalance import class_groups, drop_fraction, first_after_shuffle, relabel, subsample

#: ``dataset.split``: ``paper`` = val hold-out + stratified thinning; ``authors`` = the authors' code
PROTOCOLS = ("paper", "authors")


@dataclass(frozen=True)
class Splits:
    """Index arrays (sorted int64). ``train``/``val`` index the official train split, ``test``
    the official test split; ``groups[k]`` lists the original classes of new label ``k``."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    groups: list[list[int]]


def holdout(labels: np.ndarray, val_size: int | float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded split of ``range(len(labels))`` into (train, val) positions.

    ``val_size``: an int is a count, a float in (0, 1) a fraction of ``len(labels)``.
    """
    n = len(labels)
    if isinstance(val_size, float) and not val_size.is_integer():
        if not 0.0 < val_size < 1.0:
            raise ValueError(f"val_size={val_size}: a float must be a fraction in (0, 1)")
    else:
        val_size = int(val_size)
        if not 0 < val_size < n:
            raise ValueError(f"val_size={val_size} must be a count in [1, {n - 1}] (the official "
                             f"train split has {n} samples) or a fraction in (0, 1)")
    try:
        tr, va = train_test_split(np.arange(n), test_size=val_size, stratify=labels,
                                  random_state=seed % 2**32)
    except ValueError as err:  # e.g. a class with a single sample cannot be stratified
        raise SplitError(f"cannot hold out a stratified validation split of size {val_size} from "
                         f"{n} samples: {err}; change dataset.val_size") from err
    return np.sort(tr).astype(np.int64), np.sort(va).astype(np.int64)


def check_protocol(protocol: str) -> str:
    """``protocol`` if it is one of :data:`PROTOCOLS`, else a :class:`SplitError` saying the fix."""
    if protocol not in PROTOCOLS:
        raise SplitError(f"dataset.split={protocol!r} must be one of {', '.join(PROTOCOLS)} "
                         "(authors: the official train split without a validation hold-out)")
    return protocol


def check_classes(split: str, labels: np.ndarray, num_classes: int, hint: str) -> None:
    """Raise :class:`SplitError` unless every one of ``num_classes`` labels occurs in ``labels``."""
    present = np.unique(labels)
    if len(present) < num_classes:
        missing = sorted(set(range(num_classes)) - set(present.tolist()))
        raise SplitError(f"the {split} split ({len(labels)} samples) has class(es) "
                         f"{present.tolist()} only; class(es) {missing} are missing, so AUC/F1 are "
                         f"undefined on it. {hint}")


def build_splits(train_labels: np.ndarray, test_labels: np.ndarray, *, task: str = "binary",
                 neg_keep: float = 1.0, drop_rate: float = 0.0, val_size: int | float = 0.1,
                 seed: int = 0, groups: Sequence[Sequence[int]] | None = None,
                 num_classes: int | None = None, protocol: str = "paper") -> Splits:
    """Indices of the paper's imbalanced train / natural val / natural test splits.

    Args:
        train_labels, test_labels: original labels (0..K-1) of the official train / test splits.
        task: ``"binary"`` (halves) or ``"multiclass"`` (three groups).
        neg_keep: binary only, fraction of train negatives kept (0.1 -> 91 % positives).
        drop_rate: multi-class only, fraction of groups 0 and 1 dropped from train.
        val_size: held out of the official train split before the imbalance (count or fraction);
            unused by ``protocol="authors"`` (no hold-out).
        seed: seeds the hold-out and the dropping; same inputs and seed -> same indices.
        groups: explicit grouping (list of lists of original classes), ``None`` = paper's rule.
        num_classes: original number of classes K (default: ``max label + 1``).
        protocol: ``"paper"`` or ``"authors"`` (module docstring).

    Example (CIFAR-10-sized labels, 91 % positives)::

        >>> y = np.repeat(np.arange(10), 5000)
        >>> s = build_splits(y, np.repeat(np.arange(10), 1000), neg_keep=0.1, val_size=5000)
        >>> len(s.train), len(s.val), len(s.test)
        (24750, 5000, 10000)
        >>> s = build_splits(y, np.repeat(np.arange(10), 1000), neg_keep=0.1, protocol="authors")
        >>> len(s.train), len(s.val), len(s.test)
        (27500, 0, 10000)
    """
    check_protocol(protocol)
    train_labels = np.asarray(train_labels, dtype=np.int64)
    test_labels = np.asarray(test_labels, dtype=np.int64)
    k = int(num_classes if num_classes is not None
            else max(train_labels.max(initial=0), test_labels.max(initial=0)) + 1)
    grp = class_groups(k, task, groups)
    thinned, keep = drop_fraction(task, neg_keep, drop_rate)

    new_train = relabel(train_labels, grp)
    if protocol == "paper":
        tr, va = holdout(train_labels, val_size, seed)
        rng = np.random.default_rng([seed % 2**32, 1])  # own stream: independent of the hold-out
        tr = tr[subsample(train_labels[tr], new_train[tr], thinned, keep, rng)]
    else:
        rng = np.random.default_rng([seed % 2**32, 2])  # not the paper protocol's thinning draws
        tr, va = first_after_shuffle(new_train, thinned, keep, rng), np.zeros(0, dtype=np.int64)
    te = np.arange(len(test_labels), dtype=np.int64)

    check_classes("train", new_train[tr], len(grp), "Raise dataset.neg_keep / lower dataset.drop_rate.")
    if protocol == "paper":
        check_classes("val", new_train[va], len(grp),
                      "Increase dataset.val_size or check the labels of the source.")
    check_classes("test", relabel(test_labels, grp), len(grp),
                  "The official test split must contain every group; check the source's test labels.")
    return Splits(train=tr, val=va, test=te, groups=grp)
