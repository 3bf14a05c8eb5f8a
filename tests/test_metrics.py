"""metrics.py against scikit-learn and against brute-force O(N^2) definitions, plus failure paths."""
import numpy as np
import pytest
from scipy.special import softmax
from scipy.optimize import brentq
from sklearn.metrics import (accuracy_score, average_precision_score, f1_score, jaccard_score,
                             matthews_corrcoef, roc_auc_score)

from lpmetrics import metrics
from lpmetrics.metrics import MetricError

SEEDS = range(20)


def _probs(rng, n, k, ties):
    """Rows on the simplex; with ``ties`` they are multiples of 1/8 (exact in binary), so many
    scores and dot products with integer costs tie exactly."""
    if ties:
        counts = rng.integers(0, 2, size=(n, k)).astype(float)  # k <= 5: row sums <= 5
        counts[np.arange(n), rng.integers(0, k, size=n)] += 8 - counts.sum(1)  # rows sum to 8
        return counts / 8.0
    return softmax(rng.normal(size=(n, k)) * 2, axis=1)


def _labels_all_classes(rng, n, k):
    y = rng.integers(0, k, size=n)
    y[:k] = np.arange(k)  # every class present
    return rng.permutation(y)


def brute_force_auc_mu(y, f, cost):
    """Kleiman & Page (2019): mean over i<j of the pairwise indicator of the orientation function."""
    k = f.shape[1]
    total = 0.0
    for i in range(k):
        for j in range(i + 1, k):
            v = cost[i] - cost[j]
            fa, fb = f[y == i] @ v, f[y == j] @ v
            o = (v[i] - v[j]) * (fa[:, None] - fb[None, :])  # O(a, b) for a in D_i, b in D_j
            total += ((o > 0) + 0.5 * (o == 0)).mean()
    return 2 * total / (k * (k - 1))


def brute_force_auc(y, s):
    d = s[y == 1][:, None] - s[y == 0][None, :]
    return ((d > 0) + 0.5 * (d == 0)).mean()


def brute_force_roc(y, s):
    """ROC points by counting at every threshold ``s >= t`` (t over +inf and every distinct
    score, decreasing), no scikit-learn."""
    fpr, tpr = [], []
    for t in [np.inf] + sorted(set(s.tolist()), reverse=True):
        pred = s >= t
        tpr.append((pred & (y == 1)).sum() / (y == 1).sum())
        fpr.append((pred & (y == 0)).sum() / (y == 0).sum())
    return np.array(fpr), np.array(tpr)


def brute_force_eer(y, s):
    """The root of FNR(x) - x on the interpolated ROC, found by a root finder (the usual
    ``brentq(lambda x: 1 - x - interp(x, fpr, tpr), 0, 1)`` recipe)."""
    fpr, tpr = brute_force_roc(y, s)
    # fpr repeats where only positives pass a threshold: interpolate along the ROC's arc
    # parameter (the point index) instead of over fpr, which is not a function there
    idx = np.arange(len(fpr), dtype=float)
    gap = lambda u: 1 - np.interp(u, idx, tpr) - np.interp(u, idx, fpr)   # FNR - FPR
    u = brentq(gap, 0.0, len(fpr) - 1.0, xtol=1e-14, rtol=1e-15)
    return float(np.interp(u, idx, fpr))


# --------------------------------------------------------------------------- binary
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ties", [False, True])
def test_binary_metrics_match_sklearn(seed, ties):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 200))
    y = rng.integers(0, 2, size=n)
    y[:2] = [0, 1]
    s = rng.integers(0, 4, size=n).astype(float) if ties else rng.normal(size=n)
    pred = (s > np.median(s)).astype(int)
    assert metrics.auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert metrics.auc(y, s) == pytest.approx(brute_force_auc(y, s), abs=1e-12)
    assert metrics.average_precision(y, s) == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert metrics.f1(y, pred) == pytest.approx(f1_score(y, pred, zero_division=0.0), abs=1e-12)
    assert metrics.accuracy(y, pred) == pytest.approx(accuracy_score(y, pred), abs=1e-12)


# MCC, Jaccard, misclassification rate and EER (Grabocka et al. 2019, §4.1)
@pytest.mark.parametrize("seed", range(50))
def test_paper_metrics_match_sklearn_and_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 120))
    y = (rng.random(n) < rng.uniform(0.05, 0.95)).astype(int)
    y[:2] = [0, 1]
    rng.shuffle(y)
    s = rng.normal(size=n) + rng.uniform(-2, 3) * y
    if seed % 2:
        s = np.round(s)   # many ties: ROC segments that jump several samples at once
    pred = (s > rng.normal()).astype(int)
    assert metrics.mcc(y, pred) == pytest.approx(matthews_corrcoef(y, pred), abs=1e-12)
    assert metrics.jaccard(y, pred) == pytest.approx(jaccard_score(y, pred, zero_division=0), abs=1e-12)
    assert metrics.misclassification_rate(y, pred) == pytest.approx(1 - accuracy_score(y, pred), abs=1e-12)
    e = metrics.eer(y, s)
    assert e == pytest.approx(brute_force_eer(y, s), abs=1e-9)
    # the crossing lies between the two discrete ROC points that straddle FNR = FPR
    fpr, tpr = brute_force_roc(y, s)
    k = int(np.argmax(fpr + tpr >= 1))
    assert min(fpr[k - 1], 1 - tpr[k]) - 1e-12 <= e <= max(fpr[k], 1 - tpr[k - 1]) + 1e-12
    # and like AUC it depends on the ranking only
    assert metrics.eer(y, np.exp(s / 3)) == pytest.approx(e, abs=1e-12)


def test_eer_closed_forms():
    y = np.array([0, 1, 0, 1, 1, 0])
    assert metrics.eer(y, y * 2.0) == 0.0            # perfect ranking
    assert metrics.eer(y, -y * 2.0) == 1.0           # reversed
    assert metrics.eer(y, np.full(6, 3.0)) == 0.5    # constant scores: the chance diagonal
    # one negative above all positives, 1 of 3 positives and negatives each: ROC (0,0) (1/3,0)
    # (1/3,1) (1,1); FPR + TPR crosses 1 on the vertical segment at FPR = 1/3, TPR = 2/3
    assert metrics.eer([0, 1, 1, 1, 0, 0], [9, 5, 5, 5, 1, 1]) == pytest.approx(1 / 3, abs=1e-15)


@pytest.mark.filterwarnings("ignore:A single label was found")   # scikit-learn's, not ours
def test_degenerate_inputs_have_defined_values():
    """One class, or one predicted class: documented values (never NaN), or a typed error where
    the metric has no meaning (EER and AUC need both classes)."""
    ones, zeros = np.ones(5, int), np.zeros(5, int)
    assert metrics.mcc(ones, ones) == 0.0 and metrics.mcc(zeros, zeros) == 0.0   # sklearn's 0
    assert metrics.mcc([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0     # one predicted class
    assert metrics.mcc(ones, ones) == matthews_corrcoef(ones, ones)
    assert metrics.jaccard(zeros, zeros) == 0.0 == jaccard_score(zeros, zeros, zero_division=0)
    assert metrics.jaccard(ones, ones) == 1.0
    assert metrics.misclassification_rate(zeros, ones) == 1.0
    with pytest.raises(MetricError, match="only positives"):
        metrics.eer(ones, np.arange(5.0))
    with pytest.raises(MetricError, match="no positives"):
        metrics.eer(zeros, np.zeros(5))
    with pytest.raises(MetricError, match="binary labels"):
        metrics.mcc([0, 2], [0, 1])
    with pytest.raises(MetricError, match="preds"):
        metrics.jaccard([0, 1], [0, 1, 1])


def test_all_tied_scores_give_one_half():
    y = np.array([0, 1, 0, 1, 1])
    assert metrics.auc(y, np.zeros(5)) == 0.5
    assert metrics.auc_mu(y, np.full((5, 2), 0.5)) == 0.5
    assert metrics.auc_mu(np.array([0, 1, 2, 2]), np.full((4, 3), 1 / 3)) == 0.5


def test_f1_without_predicted_positives_is_zero():
    assert metrics.f1([0, 1, 1], [0, 0, 0]) == 0.0


# --------------------------------------------------------------------------- multi-class
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ties", [False, True])
def test_auc_ova_matches_sklearn(seed, ties):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(3, 6))
    n = int(rng.integers(3 * k, 150))
    y = _labels_all_classes(rng, n, k)
    f = _probs(rng, n, k, ties)
    ref = roc_auc_score(y, f, multi_class="ovr", average="macro")
    assert metrics.auc_ova(y, f) == pytest.approx(ref, abs=1e-12)
    per_class = metrics.auc_ova_per_class(y, f)
    assert per_class == pytest.approx([roc_auc_score(y == c, f[:, c]) for c in range(k)], abs=1e-12)


def test_auc_ova_skips_absent_classes():
    rng = np.random.default_rng(0)
    y = np.array([0, 2, 0, 2, 2, 0])
    f = _probs(rng, 6, 3, ties=False)
    per_class = metrics.auc_ova_per_class(y, f)
    assert per_class[1] is None
    assert metrics.auc_ova(y, f) == pytest.approx((per_class[0] + per_class[2]) / 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ties", [False, True])
def test_auc_mu_matches_brute_force(seed, ties):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 6))
    n = int(rng.integers(3 * k, 120))
    y, f = _labels_all_classes(rng, n, k), _probs(rng, n, k, ties)
    cost = np.ones((k, k)) - np.eye(k)
    assert metrics.auc_mu(y, f) == pytest.approx(brute_force_auc_mu(y, f, cost), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ties", [False, True])
def test_auc_mu_arbitrary_cost_matches_brute_force(seed, ties):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 6))
    n = int(rng.integers(3 * k, 120))
    y, f = _labels_all_classes(rng, n, k), _probs(rng, n, k, ties)
    # integer costs keep the tie cases exact; a random diagonal and, for odd seeds, a flipped
    # matrix (orientation factor > 0) exercise both signs of the orientation
    cost = rng.integers(2, 7, size=(k, k)).astype(float)
    np.fill_diagonal(cost, 0.0)
    if seed % 3 == 0:  # a nonzero diagonal below the off-diagonal costs still orients every pair
        cost += np.diag(rng.integers(0, 2, size=k))
    if seed % 2:
        cost = -cost
    assert metrics.auc_mu(y, f, cost) == pytest.approx(brute_force_auc_mu(y, f, cost), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_auc_mu_equals_binary_auc_for_two_classes(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 200))
    y = _labels_all_classes(rng, n, 2)
    f = _probs(rng, n, 2, ties=bool(seed % 2))
    assert metrics.auc_mu(y, f) == pytest.approx(roc_auc_score(y, f[:, 1]), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_auc_mu_invariant_to_class_relabelling(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(3, 6))
    n = int(rng.integers(3 * k, 120))
    y, f = _labels_all_classes(rng, n, k), _probs(rng, n, k, ties=bool(seed % 2))
    cost = rng.uniform(0.5, 3.0, size=(k, k))
    np.fill_diagonal(cost, 0.0)
    perm = rng.permutation(k)  # old class c becomes class perm[c]
    f_new = np.empty_like(f)
    f_new[:, perm] = f
    cost_new = np.empty_like(cost)
    cost_new[np.ix_(perm, perm)] = cost
    before = metrics.auc_mu(y, f, cost)
    assert metrics.auc_mu(perm[y], f_new, cost_new) == pytest.approx(before, abs=1e-12)
    assert metrics.auc_ova(perm[y], f_new) == pytest.approx(metrics.auc_ova(y, f), abs=1e-12)


def test_auc_mu_perfect_and_reversed():
    y = np.array([0, 1, 2, 0, 1, 2])
    assert metrics.auc_mu(y, np.eye(3)[y]) == 1.0
    assert metrics.auc_mu(y, (1 - np.eye(3)[y]) / 2) == 0.0


# --------------------------------------------------------------------------- evaluate
@pytest.mark.parametrize("seed", range(5))
def test_evaluate_binary_uses_softmax_class_one(seed):
    rng = np.random.default_rng(seed)
    y = _labels_all_classes(rng, 100, 2)
    z = rng.normal(size=(100, 2))
    out = metrics.evaluate(y, z, "binary")
    p1, pred = softmax(z, axis=1)[:, 1], z.argmax(1)
    assert set(out) == {"auc", "ap", "f1", "acc", "mcc", "jaccard", "eer"}
    assert out["auc"] == pytest.approx(roc_auc_score(y, p1), abs=1e-12)
    assert out["mcc"] == pytest.approx(matthews_corrcoef(y, pred), abs=1e-12)
    assert out["jaccard"] == pytest.approx(jaccard_score(y, pred), abs=1e-12)
    assert out["eer"] == pytest.approx(brute_force_eer(y, z[:, 1] - z[:, 0]), abs=1e-9)
    assert out["ap"] == pytest.approx(average_precision_score(y, p1), abs=1e-12)
    assert out["f1"] == pytest.approx(f1_score(y, pred), abs=1e-12)
    assert out["acc"] == pytest.approx(accuracy_score(y, pred), abs=1e-12)
    # a single-logit model gives the margin directly
    assert metrics.evaluate(y, z[:, 1] - z[:, 0], "binary") == pytest.approx(out)


@pytest.mark.parametrize("seed", range(5))
def test_evaluate_multiclass(seed):
    rng = np.random.default_rng(seed)
    y = _labels_all_classes(rng, 90, 3)
    z = rng.normal(size=(90, 3))
    out = metrics.evaluate(y, z, "multiclass")
    p = softmax(z, axis=1)
    assert set(out) == {"auc_mu", "auc_ova", "acc"}
    assert out["auc_mu"] == pytest.approx(brute_force_auc_mu(y, p, 1 - np.eye(3)), abs=1e-12)
    assert out["auc_ova"] == pytest.approx(roc_auc_score(y, p, multi_class="ovr"), abs=1e-12)
    assert out["acc"] == pytest.approx(accuracy_score(y, z.argmax(1)), abs=1e-12)


def test_evaluate_does_not_saturate_large_logits():
    # float64 softmax rounds p_1 of the first three rows to exactly 1.0 and would tie the two
    # positives with the negative row 0 (AUC 0.75); the margins rank them correctly (AUC 1)
    y = np.array([0, 1, 1, 0])
    z = np.array([[0.0, 100.0], [0.0, 300.0], [0.0, 200.0], [0.0, -1.0]])
    assert metrics.evaluate(y, z, "binary")["auc"] == 1.0
    # same for one-vs-rest: class 2 would get 0.875 from tied probabilities instead of 1
    z3 = np.array([[0.0, 0, 100], [0, 0, 300], [0, 0, 200], [0, 0, -1], [5, 0, 0], [0, 5, 0]])
    y3 = np.array([0, 2, 2, 0, 0, 1])
    assert metrics.evaluate(y3, z3, "multiclass")["auc_ova"] == pytest.approx((8 / 9 + 1 + 1) / 3)


# --------------------------------------------------------------------------- failure paths
@pytest.mark.parametrize("call, match", [
    (lambda: metrics.auc([1, 1, 1], [0.1, 0.2, 0.3]), "only positives"),
    (lambda: metrics.auc([0, 0], [0.1, 0.2]), "no positives"),
    (lambda: metrics.auc([0, 1, 2], [0.1, 0.2, 0.3]), "binary labels"),
    (lambda: metrics.auc([0, 1], [0.1, 0.2, 0.3]), "shape"),
    (lambda: metrics.auc([0, 1], [0.1, np.nan]), "non-finite"),
    (lambda: metrics.auc([0.5, 1], [0.1, 0.2]), "integer"),
    (lambda: metrics.auc([], []), "non-empty"),
    (lambda: metrics.average_precision([0, 0], [0.1, 0.2]), "no positives"),
    (lambda: metrics.f1([0, 0], [0, 1]), "no positives"),
    (lambda: metrics.f1([0, 1], [0, 2]), "preds"),
    (lambda: metrics.accuracy([0, 1], [0, 1, 1]), "shape"),
    (lambda: metrics.auc_ova([1, 1], np.eye(3)[[1, 1]]), ">= 2 classes"),
    (lambda: metrics.auc_ova([0, 3], np.eye(3)[[0, 1]]), r"\[0, 3\)"),
    (lambda: metrics.auc_mu([0, 1, 1], np.eye(3)[[0, 1, 1]]), "missing \\[2\\]"),
    (lambda: metrics.auc_mu([0, 1], np.eye(2), cost=np.ones((3, 3))), "cost"),
    (lambda: metrics.auc_mu([0, 1], np.eye(2), cost=np.ones((2, 2))), "does not orient"),
    (lambda: metrics.auc_mu([0, 1], np.array([[0.5, np.inf], [1, 0]])), "non-finite"),
    (lambda: metrics.evaluate(np.array([0, 1]), np.zeros((2, 3)), "binary"), r"\[N, 2\]"),
    (lambda: metrics.evaluate(np.array([0, 1]), np.zeros((2, 2)), "regression"), "unknown task"),
    (lambda: metrics.evaluate(np.array([0, 1]), np.array([[0, np.nan], [0, 1]]), "binary"),
     "non-finite"),
])
def test_bad_input_raises_actionable_error(call, match):
    with pytest.raises(MetricError, match=match):
        call()
    assert issubclass(MetricError, ValueError)
