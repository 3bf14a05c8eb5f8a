"""Evaluation metrics: binary AUC / AP / F1 / accuracy / MCC / Jaccard / EER / misclassification
rate, multi-class AUC one-vs-rest and AUC_mu.

What the paper's tables report (Meng et al. 2021, section 5): binary AUC (table 1), F1 and accuracy
(F1 section), and for the 3-group multi-class task AUC^ova and AUC_mu (table 2). The learned
surrogate baseline's paper (Grabocka et al. 2019, §4.1) also reports MCC, the Jaccard
index, the equal error rate (EER) and the misclassification rate (MCR). scikit-learn computes
everything it has (``roc_auc_score``, ``average_precision_score``, ``f1_score``,
``accuracy_score``, ``jaccard_score``, ``roc_curve``); MCC (four counts), EER (:func:`eer`, closed
form on the ROC) and AUC_mu are written here; AUC_mu from Kleiman & Page (2019), Meng et al. 2021,
sec. 3.3:

.. math::

    v_{ij} = P_{i,\\cdot} - P_{j,\\cdot}, \\qquad
    O(a, b) = (v_{ij}[i] - v_{ij}[j]) \\, (\\langle v_{ij}, f(x_a)\\rangle - \\langle v_{ij}, f(x_b)\\rangle),

    A_{ij} = \\frac{1}{|D_i||D_j|} \\sum_{a \\in D_i} \\sum_{b \\in D_j}
             \\mathbb{1}[O(a,b) > 0] + \\tfrac12 \\mathbb{1}[O(a,b) = 0], \\qquad
    \\mathrm{AUC}_\\mu = \\frac{2}{K(K-1)} \\sum_{i<j} A_{ij},

with ``P[k, k']`` the cost of predicting class ``k`` when the truth is ``k'`` (default ``1 - I``)
and ``f(x)`` the class probabilities. For ``K = 2`` and ``P = 1 - I`` it is the binary AUC of
``f(x)[1]``. Ties count one half everywhere (the trapezoidal ROC area of scikit-learn).

Bad input raises :class:`MetricError` (a ``ValueError``) saying what to fix: a split with a
single class where the metric needs both (AUC, EER), shapes that disagree, labels out of range,
non-finite scores. No metric returns NaN: where a ratio is 0/0 on legal input the value is fixed
and documented (MCC 0 and Jaccard 0, scikit-learn's conventions; EER 1/2 for constant scores).

Example::

    >>> import numpy as np
    >>> evaluate(np.array([0, 1, 1, 0]), np.array([[2., 0], [0, 1], [0, 3], [1, 0]]), "binary")
    {'auc': 1.0, 'ap': 1.0, 'f1': 1.0, 'acc': 1.0, 'mcc': 1.0, 'jaccard': 1.0, 'eer': 0.0}
"""
from __future__ import annotations
if not __name__.startswith("lpmetrics."):   # one identity per class (lpmetrics/__init__.py)
    raise ImportError(f"import lpmetrics.{__name__}, not the bare folder name {__name__!r}")

import numpy as np
from scipy.special import logsumexp, softmax
from sklearn.metrics import (accuracy_score, average_precision_score, f1_score, jaccard_score,
                             roc_auc_score, roc_curve)

TASKS = ("binary", "multiclass")


class MetricError(ValueError):
    """A metric was asked of data it is undefined on (or of malformed arrays)."""


# --------------------------------------------------------------------------- input checks
def _labels(labels, name: str = "labels") -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise MetricError(f"{name} must be a non-empty 1-D array, got shape {y.shape}")
    if y.dtype.kind == "b":
        return y.astype(np.int64)
    if y.dtype.kind == "f" and (not np.all(np.isfinite(y)) or np.any(y != np.round(y))):
        raise MetricError(f"{name} must hold integer class ids; got non-integral floats")
    if y.dtype.kind not in "iuf":
        raise MetricError(f"{name} must hold integer class ids, got dtype {y.dtype}")
    return y.astype(np.int64)


def _scores(scores, n: int, ndim: int, name: str = "scores") -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != ndim or s.shape[0] != n:
        want = f"[{n}]" if ndim == 1 else f"[{n}, K]"
        raise MetricError(f"{name} must have shape {want} to match the labels, got {s.shape}")
    bad = ~np.isfinite(s)
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        raise MetricError(f"{name} has {bad.sum()} non-finite values (first rows {rows[:5].tolist()}); "
                          "the model diverged or the checkpoint is corrupt: check the training loss")
    return s


def _binary_labels(labels, what: str, need_neg: bool = True) -> np.ndarray:
    y = _labels(labels)
    if not np.isin(y, (0, 1)).all():
        raise MetricError(f"{what} needs binary labels in {{0, 1}}, got classes {np.unique(y).tolist()}")
    n_pos = int(y.sum())
    if n_pos == 0 or (need_neg and n_pos == y.size):
        present = "only positives" if n_pos else "no positives"
        raise MetricError(f"{what} is undefined on {y.size} samples with {present}: evaluate on a split "
                          "that holds both classes (or a larger one)")
    return y


def _class_labels(labels, num_classes: int) -> np.ndarray:
    y = _labels(labels)
    if y.min() < 0 or y.max() >= num_classes:
        raise MetricError(f"labels must lie in [0, {num_classes}) for scores with {num_classes} columns, "
                          f"got range [{y.min()}, {y.max()}]")
    return y


# --------------------------------------------------------------------------- binary metrics
def auc(labels, scores) -> float:
    """Binary ROC AUC (Wilcoxon-Mann-Whitney, ties 1/2) of ``scores`` [N] for labels in {0, 1}."""
    y = _binary_labels(labels, "AUC")
    return float(roc_auc_score(y, _scores(scores, y.size, 1)))


def average_precision(labels, scores) -> float:
    """Average precision (sklearn: step-wise, no interpolation; tied scores form one threshold).

    Needs at least one positive; all-positive labels give 1.0.
    """
    y = _binary_labels(labels, "average precision", need_neg=False)
    return float(average_precision_score(y, _scores(scores, y.size, 1)))


def _binary_preds(preds, y: np.ndarray) -> np.ndarray:
    p = _labels(preds, "preds")
    if p.shape != y.shape or not np.isin(p, (0, 1)).all():
        raise MetricError(f"preds must be {y.shape} in {{0, 1}} like the labels, got shape {p.shape} "
                          f"with values {np.unique(p)[:5].tolist()}")
    return p


def _binary_pair(labels, preds, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Labels and hard predictions in {0, 1}, either class allowed to be absent."""
    y = _labels(labels)
    if not np.isin(y, (0, 1)).all():
        raise MetricError(f"{what} needs binary labels in {{0, 1}}, got classes {np.unique(y).tolist()}")
    return y, _binary_preds(preds, y)


def f1(labels, preds) -> float:
    """F1 of the positive class 1 from hard predictions in {0, 1}.

    Raises if the labels hold no positive (F1 of a class that is absent is meaningless); with
    positives present, predicting no positive gives 0.0.
    """
    y = _binary_labels(labels, "F1", need_neg=False)
    return float(f1_score(y, _binary_preds(preds, y), zero_division=0.0))


def mcc(labels, preds) -> float:
    r"""Matthews correlation coefficient of hard predictions in {0, 1}, in [-1, 1]:

    .. math:: \frac{TP \cdot TN - FP \cdot FN}{\sqrt{(TP+FP)(TP+FN)(TN+FP)(TN+FN)}}.

    Defined on every input: where the denominator is 0 (the labels or the predictions hold one
    class only) it is 0.0, scikit-learn's ``matthews_corrcoef`` convention (no better than chance
    can be shown).
    """
    y, p = _binary_pair(labels, preds, "MCC")
    # the closed form on counts: scikit-learn warns on single-class input, where we define 0
    tp, fp = float(np.sum((p == 1) & (y == 1))), float(np.sum((p == 1) & (y == 0)))
    fn, tn = float(np.sum((p == 0) & (y == 1))), float(np.sum((p == 0) & (y == 0)))
    den = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    return float((tp * tn - fp * fn) / np.sqrt(den)) if den > 0 else 0.0


def jaccard(labels, preds) -> float:
    r"""Jaccard index (intersection over union) of the positive class, :math:`TP / (TP + FP + FN)`.

    Defined on every input: with no positive label and no positive prediction (0/0) it is 0.0,
    scikit-learn's ``jaccard_score(zero_division=0)``, the same convention as :func:`f1`'s.
    """
    y, p = _binary_pair(labels, preds, "Jaccard")
    return float(jaccard_score(y, p, zero_division=0.0))


def misclassification_rate(labels, preds) -> float:
    """Fraction of ``preds`` that differ from ``labels``: ``1 - accuracy`` (the paper's MCR)."""
    return 1.0 - accuracy(labels, preds)


def eer(labels, scores) -> float:
    r"""Equal error rate: where the ROC curve, linearly interpolated between the points of
    consecutive distinct thresholds, crosses :math:`FNR = FPR` (i.e. :math:`TPR = 1 - FPR`).

    Along the ROC from (0, 0) to (1, 1), :math:`FPR + TPR` grows strictly from one point to the
    next, so it crosses 1 on exactly one segment :math:`(f_0, t_0) \to (f_1, t_1)`, and there

    .. math:: u = \frac{1 - f_0 - t_0}{(f_1 - f_0) + (t_1 - t_0)}, \qquad
              \mathrm{EER} = f_0 + u (f_1 - f_0) \in [0, 1].

    (The equivalent root of :math:`1 - x - \mathrm{TPR}(x)`, the usual ``brentq`` recipe, without
    a root finder.) Perfect ranking gives 0, reversed ranking 1, constant scores 1/2 (the chance
    diagonal). Needs both classes (raises :class:`MetricError` otherwise, like :func:`auc`).
    """
    y = _binary_labels(labels, "EER")
    fpr, tpr, _ = roc_curve(y, _scores(scores, y.size, 1))
    total = fpr + tpr
    k = int(np.argmax(total >= 1.0))   # first point on or past the crossing; k >= 1 as total[0] = 0
    f0, t0, f1_, t1 = fpr[k - 1], tpr[k - 1], fpr[k], tpr[k]
    u = (1.0 - f0 - t0) / ((f1_ - f0) + (t1 - t0))
    return float(f0 + u * (f1_ - f0))


def accuracy(labels, preds) -> float:
    """Fraction of ``preds`` equal to ``labels`` (any number of classes)."""
    y, p = _labels(labels), _labels(preds, "preds")
    if p.shape != y.shape:
        raise MetricError(f"preds shape {p.shape} differs from labels shape {y.shape}")
    return float(accuracy_score(y, p))


# --------------------------------------------------------------------------- multi-class AUCs
def auc_ova_per_class(labels, scores_2d) -> list[float | None]:
    """One-vs-rest AUC of column ``k`` for each class ``k``; ``None`` for a class absent from labels.

    Needs at least two classes present (otherwise no class has a 'rest').
    """
    s = np.asarray(scores_2d)
    if s.ndim != 2:
        raise MetricError(f"scores_2d must have shape [N, K], got {s.shape}")
    y = _class_labels(labels, s.shape[1])
    s = _scores(s, y.size, 2, "scores_2d")
    present = np.unique(y)
    if present.size < 2:
        raise MetricError(f"one-vs-rest AUC needs >= 2 classes in the labels, got only {present.tolist()}")
    return [float(roc_auc_score(y == k, s[:, k])) if k in present else None for k in range(s.shape[1])]


def auc_ova(labels, scores_2d) -> float:
    """Mean one-vs-rest AUC over the classes present in ``labels`` (the paper's AUC^ova)."""
    per_class = [a for a in auc_ova_per_class(labels, scores_2d) if a is not None]
    return float(np.mean(per_class))


def auc_mu(labels, scores_2d, cost=None) -> float:
    """AUC_mu of Kleiman & Page (2019) for class probabilities ``scores_2d`` [N, K].

    ``cost`` is the K x K partition matrix P (``P[k, k']``: cost of predicting k when the truth is
    k'), default ``1 - I``. Every class must occur in ``labels``, and every pair must be oriented:
    ``P[i,i] + P[j,j] - P[i,j] - P[j,i] != 0`` (for a cost matrix with zero diagonal and positive
    off-diagonal it is negative). The value is invariant to a consistent relabelling of classes,
    score columns and cost rows/columns.
    """
    s = np.asarray(scores_2d)
    if s.ndim != 2 or s.shape[1] < 2:
        raise MetricError(f"scores_2d must have shape [N, K] with K >= 2, got {s.shape}")
    k = s.shape[1]
    y = _class_labels(labels, k)
    s = _scores(s, y.size, 2, "scores_2d")
    missing = sorted(set(range(k)) - set(np.unique(y).tolist()))
    if missing:
        raise MetricError(f"AUC_mu needs every class 0..{k - 1} in the labels; missing {missing}. "
                          "Evaluate on a split holding all classes")
    p = np.ones((k, k)) - np.eye(k) if cost is None else np.asarray(cost, dtype=np.float64)
    if p.shape != (k, k) or not np.isfinite(p).all():
        raise MetricError(f"cost must be a finite [{k}, {k}] matrix, got shape {p.shape}")
    total = 0.0
    for i in range(k):
        for j in range(i + 1, k):
            v = p[i] - p[j]
            orient = v[i] - v[j]  # sign of (e_i - e_j) . v_ij; the pair's correct ordering
            if orient == 0:
                raise MetricError(f"cost matrix does not orient classes {i} and {j}: "
                                  f"P[{i},{i}] + P[{j},{j}] - P[{i},{j}] - P[{j},{i}] = 0; "
                                  "give the off-diagonal costs larger values than the diagonal")
            pair = (y == i) | (y == j)
            # O(a, b) > 0  <=>  -orient * <v, f(x_b)> > -orient * <v, f(x_a)> for a in D_i, b in D_j
            total += roc_auc_score(y[pair] == j, -orient * (s[pair] @ v))
    return float(2.0 * total / (k * (k - 1)))


# --------------------------------------------------------------------------- from logits
def roc_scores(logits, task: str) -> np.ndarray:
    """Scores that rank like ``softmax(logits)`` but do not saturate to ties at large logits.

    binary: ``[N]`` margin ``l_1 - l_0`` (``softmax[:, 1] = sigmoid(margin)``); a 1-D or ``[N, 1]``
    logit is taken as the margin itself. multiclass: ``[N, K]`` one-vs-rest log-odds
    ``l_k - logsumexp_{j != k} l_j`` (``log p_k - log(1 - p_k)``). ROC curves and AUCs of these
    equal those of the probabilities in exact arithmetic.
    """
    z = np.asarray(logits, dtype=np.float64)
    if task == "binary":
        if z.ndim == 1 or (z.ndim == 2 and z.shape[1] == 1):
            return z.reshape(-1)
        if z.ndim == 2 and z.shape[1] == 2:
            return z[:, 1] - z[:, 0]
        raise MetricError(f"binary task expects logits [N], [N, 1] or [N, 2], got {z.shape}")
    if task == "multiclass":
        if z.ndim != 2 or z.shape[1] < 2:
            raise MetricError(f"multiclass task expects logits [N, K] with K >= 2, got {z.shape}")
        others = np.where(np.eye(z.shape[1], dtype=bool), -np.inf, 0.0)  # mask out j == k
        return z - logsumexp(z[:, None, :] + others[None], axis=2)
    raise MetricError(f"unknown task {task!r}; expected one of {TASKS}")


def evaluate(labels: np.ndarray, logits: np.ndarray, task: str) -> dict[str, float]:
    """The paper's metrics of one split from the model's logits.

    binary (logits ``[N, 2]``; ``[N]`` is read as ``l_1 - l_0``): ``auc``, ``ap`` and ``eer`` on
    the score ``softmax(logits)[:, 1]`` (ranked through its margin, see :func:`roc_scores`);
    ``f1``, ``acc``, ``mcc`` and ``jaccard`` of ``argmax`` (ties go to class 0; Grabocka et al.
    tune the threshold per dataset instead, §4.1). The misclassification rate is
    ``1 - acc``, so it gets no column of its own. multiclass: ``auc_mu`` on ``softmax(logits)``
    with P = 1 - I, ``auc_ova`` (mean over present classes) and ``acc`` of ``argmax``.
    """
    y = _labels(labels)
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim not in (1, 2):
        raise MetricError(f"logits must have shape [N] or [N, K], got {z.shape}")
    _scores(z, y.size, z.ndim, "logits")  # length and finiteness, before any softmax
    ranked = roc_scores(z, task)
    if task == "binary":
        pred = (ranked > 0).astype(np.int64)
        return {"auc": auc(y, ranked), "ap": average_precision(y, ranked),
                "f1": f1(y, pred), "acc": accuracy(y, pred),
                "mcc": mcc(y, pred), "jaccard": jaccard(y, pred), "eer": eer(y, ranked)}
    return {"auc_mu": auc_mu(y, softmax(z, axis=1)), "auc_ova": auc_ova(y, ranked),
            "acc": accuracy(y, z.argmax(axis=1))}
