"""The paper's imbalance protocol: class grouping and per-class dropping (pure functions).

Binary task (Meng et al. 2021, §5 "Optimizing Binary AUC"; ICLR version §4, following Liu et al.
2019): the first half of the original classes is the negative class (label 0), the second half the
positive class (label 1) -- CIFAR-10/STL-10/digits 0-4 | 5-9, CIFAR-100 0-49 | 50-99, Cat&Dog
cat | dog. Negatives of the *train* split are then subsampled: a fraction ``neg_keep`` of them is
kept, so with balanced classes the positive ratio is ``1 / (1 + neg_keep)``::

    neg_keep   0.1    0.2    0.4    1.0
    positives  90.9%  83.3%  71.4%  50%     (the paper's 91 / 83 / 71 / 50 %)

Multi-class task (§5 "Optimizing Multiclass AUC"): three groups of original classes, of sizes
``K//3, K//3, K - 2*(K//3)`` -- STL-10 (and, by the same rule, CIFAR-10 and digits) 0-2 | 3-5 |
6-9, CIFAR-100 0-32 | 33-65 | 66-99, exactly the paper's groups. A fraction ``drop_rate``
(0.9 / 0.8 / 0.6 / 0) of the samples of the first two groups is dropped from the train split.

Dropping is stratified by *original* class: each affected class keeps ``round(frac * n_c)`` of
its samples, drawn without replacement. So every negative sub-class stays represented and the
counts are exact (CIFAR-10 train 45k, ``neg_keep=0.1``: 22,500 positives, 5 x 450 = 2,250
negatives). The paper says "dropping samples from the negative class by a certain ratio" and no
more; stratifying is our choice. The authors' code instead keeps the *first* ``int(keep * n)``
samples of the thinned class after a seeded shuffle (:func:`first_after_shuffle`, used by
``dataset.split=authors``): the same counts up to rounding, sub-classes not balanced.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lpmetrics.data.errors import SplitError


def class_groups(num_classes: int, task: str,
                 groups: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Original classes of each new label: ``groups[new_label] = [original classes]``.

    ``groups=None`` gives the paper's rule (halves for ``binary``, thirds for ``multiclass``);
    an explicit list is validated to be a partition of ``range(num_classes)``.

    >>> class_groups(10, "binary")
    [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    >>> class_groups(10, "multiclass")
    [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    """
    if groups is not None:
        groups = [sorted(int(c) for c in g) for g in groups]
        flat = sorted(c for g in groups for c in g)
        if flat != list(range(num_classes)):
            raise ValueError(f"dataset.groups={groups} must partition the classes 0..{num_classes - 1}"
                             " (each original class in exactly one group)")
        expected = {"binary": 2, "multiclass": 3}.get(task, len(groups))
        if len(groups) != expected:
            raise ValueError(f"task={task} needs {expected} groups, got {len(groups)}")
        return groups
    if task == "binary":
        if num_classes < 2:
            raise ValueError(f"binary task needs >= 2 original classes, the source has {num_classes}")
        half = num_classes // 2
        return [list(range(half)), list(range(half, num_classes))]
    if task == "multiclass":
        if num_classes < 3:
            raise ValueError(f"multiclass task needs >= 3 original classes, the source has "
                             f"{num_classes}; use task=binary")
        third = num_classes // 3
        return [list(range(third)), list(range(third, 2 * third)),
                list(range(2 * third, num_classes))]
    raise ValueError(f"task must be 'binary' or 'multiclass', got {task!r}")


def relabel(labels: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Map original labels to group labels (int64)."""
    lut = np.full(max(c for g in groups for c in g) + 1, -1, dtype=np.int64)
    for new, members in enumerate(groups):
        lut[list(members)] = new
    return lut[np.asarray(labels, dtype=np.int64)]


def drop_fraction(task: str, neg_keep: float, drop_rate: float) -> tuple[list[int], float]:
    """Which group labels are thinned, and the fraction of their samples that is *kept*.

    Raises :class:`SplitError` (a config error: ``train.py`` prints it as one line) naming the
    key, its value and a fix; :mod:`validate` calls this before any data are read."""
    if not 0.0 < neg_keep <= 1.0:
        raise SplitError(f"dataset.neg_keep={neg_keep} must be in (0, 1]: it is the fraction of "
                         "train negatives kept; use dataset.neg_keep=0.1, 0.2, 0.4 or 1.0 "
                         "(91/83/71/50 % positives)")
    if not 0.0 <= drop_rate < 1.0:
        raise SplitError(f"dataset.drop_rate={drop_rate} must be in [0, 1): it is the fraction of "
                         "the first two groups dropped; use dataset.drop_rate=0.9, 0.8, 0.6 or 0")
    if task == "binary":
        if drop_rate != 0.0:
            raise SplitError(f"dataset.drop_rate={drop_rate}: drop_rate is the multiclass knob; for "
                             "task=binary set dataset.drop_rate=0 and use dataset.neg_keep")
        return [0], float(neg_keep)
    if neg_keep != 1.0:
        raise SplitError(f"dataset.neg_keep={neg_keep}: neg_keep is the binary knob; for "
                         "task=multiclass set dataset.neg_keep=1.0 and use dataset.drop_rate")
    return [0, 1], 1.0 - float(drop_rate)


def subsample(orig_labels: np.ndarray, new_labels: np.ndarray, thinned: Sequence[int],
              keep: float, rng: np.random.Generator) -> np.ndarray:
    """Positions (sorted) kept after thinning the groups ``thinned`` to a fraction ``keep``.

    Stratified by original class: class ``c`` of a thinned group keeps ``round(keep * n_c)``
    samples chosen uniformly without replacement; other samples are all kept.
    """
    orig_labels = np.asarray(orig_labels)
    kept = [np.flatnonzero(~np.isin(new_labels, thinned))]
    for c in np.unique(orig_labels[np.isin(new_labels, thinned)]):
        pos = np.flatnonzero(orig_labels == c)
        kept.append(rng.choice(pos, size=int(keep * len(pos) + 0.5), replace=False))
    return np.sort(np.concatenate(kept)).astype(np.int64)


def first_after_shuffle(new_labels: np.ndarray, thinned: Sequence[int], keep: float,
                        rng: np.random.Generator) -> np.ndarray:
    """Positions (sorted) kept when each group in ``thinned`` keeps its first ``int(keep * n_g)``
    samples in a shuffled order; other samples are all kept.

    The authors' rule (``binary_auc.py``: ``np.random.shuffle(train_ids)``, then
    ``np.where(train_labels == -1)[0][:int(num_neg * keep_index)]``): not stratified by original
    class, and the count is floored (CIFAR-10, ``keep=0.1``: 2,500 of 25,000 negatives)."""
    new_labels = np.asarray(new_labels)
    order = rng.permutation(len(new_labels))
    kept = [np.flatnonzero(~np.isin(new_labels, thinned))]
    for group in thinned:
        members = order[new_labels[order] == group]
        kept.append(members[:int(len(members) * keep)])
    return np.sort(np.concatenate(kept)).astype(np.int64)
