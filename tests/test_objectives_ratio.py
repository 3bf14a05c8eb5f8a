"""Oracle tests of the ratio LPs (objectives/fractional.py, objectives/ratio.py).

HiGHS solves the same LP; closed forms (positives at the top, negatives at the bottom of their
boxes) and scikit-learn's metrics of thresholded predictions check the construction; the Newton
solver's loss, gradient and backward modes are checked when ``solver.solve_lp`` is available.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from sklearn.metrics import f1_score, fbeta_score, jaccard_score, precision_score

from lpmetrics.objectives.fractional import box_bounds
from lpmetrics.objectives.ratio import F1LPLoss, FBetaLPLoss, JaccardLPLoss, PrecisionAtRecallLPLoss


pytestmark = pytest.mark.usefixtures("float64_default")  # oracle tests run in float64



LOSSES = {
    "f1": lambda **kw: F1LPLoss(**kw),
    "fbeta": lambda **kw: FBetaLPLoss(beta=2.0, **kw),
    "jaccard": lambda **kw: JaccardLPLoss(**kw),
    "p@r": lambda **kw: PrecisionAtRecallLPLoss(alpha=0.6, **kw),
}


def solve_lp_or_skip():
    try:
        from lpmetrics.solver import solve_lp  # noqa: F401
    except ImportError:
        pytest.skip("solver.solve_lp is not available")
    return solve_lp


def highs_value(lp) -> float:
    res = linprog(lp.c.detach().numpy(), A_ub=lp.A.detach().numpy(), b_ub=lp.b.numpy(),
                  A_eq=lp.A_eq.detach().numpy(), b_eq=lp.b_eq.numpy(), bounds=(0, None),
                  method="highs")
    assert res.status == 0, res.message
    return -res.fun


def closed_form(name: str, phi: torch.Tensor, y: torch.Tensor):
    lo, up = box_bounds(phi)
    yh = torch.where(y > 0, up, lo)
    tp, pos, pred = (y * yh).sum(), y.sum(), yh.sum()
    if name == "f1":
        return 2 * tp / (pred + pos)
    if name == "fbeta":
        return 5 * tp / (pred + 4 * pos)
    if name == "jaccard":
        return tp / (pred - tp + pos)
    return tp / pred  # recall alpha is lowered to the reachable one when the boxes fall short


def random_batch(seed: int, n: int = 24):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.4).double()
    y[0] = 1.0
    phi = torch.tanh(2 * torch.randn(n, generator=g))
    return phi, y


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("safeguard", ["drop_redundant", "none"])
def test_lp_matches_highs_and_closed_form(name, safeguard):
    loss = LOSSES[name](safeguard=safeguard)
    for seed in range(8):
        phi, y = random_batch(seed)
        lp = loss.build_lp(phi, y)
        assert highs_value(lp) == pytest.approx(float(closed_form(name, phi, y)), abs=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_thresholded_phi_gives_sklearn_metrics(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 40)
    y[:2] = [1, 0]
    pred = rng.integers(0, 2, 40)
    pred[:2] = 1  # at least one predicted positive, one true positive
    phi, yt = torch.tensor(2.0 * pred - 1), torch.tensor(y, dtype=torch.float64)
    vals = {name: highs_value(LOSSES[name]().build_lp(phi, yt)) for name in LOSSES}
    assert vals["f1"] == pytest.approx(f1_score(y, pred), abs=1e-9)
    assert vals["fbeta"] == pytest.approx(fbeta_score(y, pred, beta=2.0), abs=1e-9)
    assert vals["jaccard"] == pytest.approx(jaccard_score(y, pred), abs=1e-9)
    assert vals["p@r"] == pytest.approx(precision_score(y, pred), abs=1e-9)


def test_bad_arguments_fail_with_a_hint():
    with pytest.raises(ValueError, match="safeguard"):
        F1LPLoss(safeguard="ridge?")
    with pytest.raises(ValueError, match="phi"):
        F1LPLoss(phi="relu")
    with pytest.raises(ValueError, match="binary"):
        F1LPLoss()(torch.randn(4, 3), torch.zeros(4, dtype=torch.long))


def test_no_positive_batch_gives_zero_loss_and_gradient():
    loss_fn = F1LPLoss()
    logits = torch.randn(8, 2, requires_grad=True)
    loss = loss_fn(logits, torch.zeros(8, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and torch.all(logits.grad == 0)
    assert loss_fn.pop_stats()["degenerate_batches"] == 1.0


@pytest.mark.parametrize("name", list(LOSSES))
def test_solver_loss_and_gradient_match_closed_form(name):
    solve_lp_or_skip()
    loss_fn = LOSSES[name]()
    for seed in range(3):
        g = torch.Generator().manual_seed(100 + seed)
        logits = torch.randn(32, 2, generator=g, requires_grad=True)
        labels = (torch.rand(32, generator=g) < 0.4).long()
        labels[0] = 1
        loss = loss_fn(logits, labels)
        (grad,) = torch.autograd.grad(loss, logits)
        phi = torch.tanh((logits[:, 1] - logits[:, 0]) / 2)
        y = labels.double()
        ref = -closed_form(name, phi, y)
        if name == "p@r":  # recall shortfall of the boxes, priced outside the LP
            ref = ref + torch.relu(0.6 - (y * box_bounds(phi)[1]).sum() / y.sum())
        (ref_grad,) = torch.autograd.grad(ref, logits)
        assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
        assert torch.allclose(grad, ref_grad, atol=1e-5), (grad - ref_grad).abs().max()
    stats = loss_fn.pop_stats()
    assert {"lp_iterations", "lp_kkt_residual", "lp_active", "degenerate_batches"} <= set(stats)


def f1_backward_cosines(num_batches: int, n: int = 64, seed0: int = 0) -> list[float]:
    """Cosine between active-set and unrolled gradients of the F1 LP w.r.t. phi (Meng et al.,
    ICLR 2021 version, A.4)."""
    loss_fn = F1LPLoss()
    cosines = []
    for seed in range(seed0, seed0 + num_batches):
        phi, y = random_batch(seed, n)
        grads = []
        for mode in ("active_set", "unrolled"):
            p = phi.clone().requires_grad_(True)
            value, _ = loss_fn.lp_value(p, y, backward=mode)
            (g,) = torch.autograd.grad(-value, p)
            grads.append(g)
        cosines.append(float(torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)))
    return cosines


def test_active_set_vs_unrolled_cosine_f1():
    solve_lp_or_skip()
    cosines = f1_backward_cosines(100)
    print(f"\nF1 LP: mean cosine(active_set, unrolled) over 100 batches = {np.mean(cosines):.5f}"
          f" (min {np.min(cosines):.5f}; paper 0.9991)")
    assert np.mean(cosines) > 0.99


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LOSSES))
def test_lp_matches_highs_many_seeds(name):
    loss = LOSSES[name]()
    for seed in range(200):
        phi, y = random_batch(seed, n=40)
        assert highs_value(loss.build_lp(phi, y)) == pytest.approx(float(closed_form(name, phi, y)),
                                                                   abs=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LOSSES))
def test_solver_matches_highs_many_seeds(name):
    solve_lp_or_skip()
    loss = LOSSES[name]()
    for seed in range(50):
        phi, y = random_batch(500 + seed, n=64)
        value, sol = loss.lp_value(phi, y)
        assert value.item() == pytest.approx(highs_value(loss.build_lp(phi, y)), abs=1e-7)


@pytest.mark.parametrize("name", ["f1", "jaccard"])
def test_gradcheck_through_the_solver(name):
    solve_lp_or_skip()
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(10, 2, generator=g, requires_grad=True)
    labels = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0, 1, 0])
    torch.autograd.gradcheck(lambda x: LOSSES[name]()(x, labels), (logits,), atol=1e-6)
