"""Oracle tests of the AUC-family LPs (objectives/auc.py, auc_ova.py, auc_mu.py, pairwise.py).

Closed form: the pairwise LP's optimum is ``z_ij = max(0, eps - d_ij)`` and the loss
``1 - mean clip(d_ij / eps, 0, 1)``; HiGHS confirms the LP; as eps -> 0 the loss tends to
``1 - AUC`` (sklearn / metrics.py)..
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from sklearn.metrics import roc_auc_score

from lpmetrics import metrics
from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.auc_mu import AUCMuLoss
from lpmetrics.objectives.auc_ova import AUCOneVsAllLoss


pytestmark = pytest.mark.usefixtures("float64_default")  # oracle tests run in float64


COST = [[0.0, 1.0, 3.0], [2.0, 0.0, 1.0], [1.0, 4.0, 0.0]]




def batch(seed: int, n: int = 48, k: int = 2, scale: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(n, k, generator=g)
    labels = torch.randint(0, k, (n,), generator=g)
    labels[:k] = torch.arange(k)
    return logits, labels


def ramp_reference(d: torch.Tensor, eps: float) -> torch.Tensor:
    return 1.0 - (d / eps).clamp(0, 1).mean()


@pytest.mark.parametrize("seed", range(4))
def test_pairwise_lp_optimum_is_the_closed_form(seed):
    d = torch.randn(60, generator=torch.Generator().manual_seed(seed)) * 0.05
    eps = 0.01
    res = linprog(np.ones(60), A_ub=-np.eye(60), b_ub=(d - eps).numpy(), bounds=(0, None),
                  method="highs")
    assert res.status == 0
    np.testing.assert_allclose(res.x, torch.relu(eps - d).numpy(), atol=1e-10)


@pytest.mark.parametrize("eps", [0.1, 0.01, 0.001])
def test_auc_loss_closed_form_and_sklearn_limit(eps):
    logits, labels = batch(0, n=80)
    s = torch.softmax(logits, 1)[:, 1]
    d = (s[labels == 1][:, None] - s[labels == 0][None, :]).reshape(-1)
    loss = AUCLoss(epsilon=eps, method="closed_form")(logits, labels)
    assert loss.item() == pytest.approx(ramp_reference(d, eps).item(), abs=1e-12)
    tiny = AUCLoss(epsilon=1e-9, method="closed_form")(logits, labels)
    assert tiny.item() == pytest.approx(1 - roc_auc_score(labels, s), abs=1e-12)


def test_multiclass_limits_match_metrics():
    logits, labels = batch(1, n=90, k=3)
    p = torch.softmax(logits, 1).numpy()
    ova = AUCOneVsAllLoss(3, epsilon=1e-9, reduction="classes", method="closed_form")
    assert 1 - ova(logits, labels).item() == pytest.approx(metrics.auc_ova(labels.numpy(), p), abs=1e-12)
    pooled = AUCOneVsAllLoss(3, epsilon=1e-9, method="closed_form")(logits, labels).item()
    hits = sum(((p[labels == k, k][:, None] > p[labels != k, k][None, :]).sum()) for k in range(3))
    total = sum((labels == k).sum() * (labels != k).sum() for k in range(3))
    assert 1 - pooled == pytest.approx(float(hits / total), abs=1e-12)
    for cost in (None, COST):
        mu = AUCMuLoss(3, cost_matrix=cost, epsilon=1e-9, method="closed_form")
        expected = metrics.auc_mu(labels.numpy(), p, cost=cost)
        assert 1 - mu(logits, labels).item() == pytest.approx(expected, abs=1e-12)


def test_auc_mu_01_costs_is_twice_the_paper_margin():
    logits, labels = batch(2, n=30, k=3)
    f = torch.softmax(logits, 1)
    d, _, _ = AUCMuLoss(3).pairs(logits, labels)
    i, j = torch.nonzero(labels == 0)[:, 0], torch.nonzero(labels == 1)[:, 0]
    ft = (f[i, 0][:, None] - f[j, 0][None, :] + f[j, 1][None, :] - f[i, 1][:, None]).reshape(-1)
    torch.testing.assert_close(d[: ft.numel()], 2 * ft)


@pytest.mark.parametrize("loss_fn", [AUCLoss(method="closed_form"),
                                     AUCOneVsAllLoss(3, method="closed_form"),
                                     AUCMuLoss(3, method="closed_form")])
def test_degenerate_batches_give_zero_loss(loss_fn):
    k = 2 if isinstance(loss_fn, AUCLoss) else 3
    logits = torch.randn(10, k, requires_grad=True)
    loss = loss_fn(logits, torch.ones(10, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and torch.all(logits.grad == 0)
    assert loss_fn.pop_stats()["degenerate_batches"] == 1.0


def test_missing_class_uses_the_pairs_present():
    logits, labels = batch(3, n=40, k=3)
    labels[labels == 2] = 0
    for loss_fn in (AUCOneVsAllLoss(3, method="closed_form"), AUCMuLoss(3, method="closed_form")):
        loss = loss_fn(logits, labels)
        assert torch.isfinite(loss) and 0 <= loss.item() <= 1
        assert loss_fn.pop_stats()["degenerate_batches"] == 1.0


def test_constructor_errors_are_actionable():
    with pytest.raises(ValueError, match="epsilon"):
        AUCLoss(epsilon=0)
    with pytest.raises(ValueError, match="score transform"):
        AUCLoss(score="rank")
    with pytest.raises(ValueError, match="3x3"):
        AUCMuLoss(3, cost_matrix=[[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="auc_ova_lp"):
        AUCLoss()(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))


# ----------------------------------------------------------------- through solver.solve_lp
def _check_against_closed_form(make, logits, labels, atol=1e-6):
    lp_fn, ref_fn = make(method="lp"), make(method="closed_form")
    x = logits.clone().requires_grad_(True)
    loss = lp_fn(x, labels)
    (grad,) = torch.autograd.grad(loss, x)
    x_ref = logits.clone().requires_grad_(True)
    ref = ref_fn(x_ref, labels)
    (ref_grad,) = torch.autograd.grad(ref, x_ref)
    assert loss.item() == pytest.approx(ref.item(), abs=atol)
    torch.testing.assert_close(grad, ref_grad, atol=atol, rtol=1e-4)
    stats = lp_fn.pop_stats()
    assert {"lp_iterations", "lp_kkt_residual", "lp_active", "degenerate_batches"} <= set(stats)
    return stats


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("eps", [0.1, 0.01])
def test_auc_lp_matches_closed_form(seed, eps):
    logits, labels = batch(seed, n=64)
    _check_against_closed_form(lambda **kw: AUCLoss(epsilon=eps, **kw), logits, labels)


@pytest.mark.parametrize("seed", range(2))
def test_multiclass_lps_match_closed_form(seed):
    logits, labels = batch(seed, n=48, k=3)
    _check_against_closed_form(lambda **kw: AUCOneVsAllLoss(3, epsilon=0.05, **kw), logits, labels)
    _check_against_closed_form(lambda **kw: AUCMuLoss(3, cost_matrix=COST, epsilon=0.05, **kw),
                               logits, labels)


def test_auc_lp_float32_batch_4096():
    """4.2 M pairs through the diagonal operator (no dense matrix)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4096, 2, generator=g, dtype=torch.float32)
    labels = torch.arange(4096) % 2
    stats = _check_against_closed_form(lambda **kw: AUCLoss(epsilon=0.01, **kw), logits, labels,
                                       atol=1e-4)
    assert stats["lp_pairs"] == 2048 * 2048


def test_auc_lp_trains_a_linear_scorer():
    torch.manual_seed(0)
    x = torch.randn(256, 5)
    y = (x[:, 0] + 0.5 * x[:, 1] + 0.3 * torch.randn(256) > 0.6).long()
    model = torch.nn.Linear(5, 2)
    loss_fn = AUCLoss(epsilon=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def auc():
        with torch.no_grad():
            return roc_auc_score(y, torch.softmax(model(x), 1)[:, 1])

    before = auc()
    for step in range(40):
        idx = torch.randint(0, 256, (64,))
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
    assert auc() > max(before, 0.9)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_auc_family_lp_matches_closed_form_many_seeds(seed):
    eps = [0.1, 0.01, 0.001][seed % 3]
    logits, labels = batch(1000 + seed, n=96)
    _check_against_closed_form(lambda **kw: AUCLoss(epsilon=eps, **kw), logits, labels)
    logits, labels = batch(2000 + seed, n=96, k=3)
    _check_against_closed_form(lambda **kw: AUCOneVsAllLoss(3, epsilon=eps, **kw), logits, labels)
    _check_against_closed_form(lambda **kw: AUCMuLoss(3, cost_matrix=COST, epsilon=eps, **kw),
                               logits, labels)


def test_gradcheck_through_the_solver():
    logits, labels = batch(7, n=12)
    logits3, labels3 = batch(8, n=12, k=3)
    torch.autograd.gradcheck(lambda x: AUCLoss(epsilon=0.3)(x, labels),
                             (logits.clone().requires_grad_(True),), atol=1e-6)
    torch.autograd.gradcheck(lambda x: AUCMuLoss(3, cost_matrix=COST, epsilon=0.3)(x, labels3),
                             (logits3.clone().requires_grad_(True),), atol=1e-6)
