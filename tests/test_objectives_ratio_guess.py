"""The ratio losses' closed-form vertex guess (objectives.fractional.box_vertex, certified by
``solve_lp(..., vertex_guess=...)``): loss values and gradients against closed forms and HiGHS
to 1e-10 in float64, on random batches at n = 64 in both the paper's relaxation and the
configs' recipe (straight-through scores, margin 0.5, whose clamped boxes are 1e-6 wide); a
wrong guess falls back to the eps loop with the same answer."""
from __future__ import annotations

import pytest
import torch

from lpmetrics.objectives.fractional import box_bounds
from lpmetrics.objectives.ratio import PHI_MARGIN
from lpmetrics.solver import solve_lp
from lpmetrics.solver.errors import LPInputError
from tests.test_objectives_ratio import LOSSES, highs_value

pytestmark = pytest.mark.usefixtures("float64_default")

CONFIGS = {"paper": {}, "recipe": {"phi": "softmax_st", "margin": 0.5}}
TOL = 1e-10


def batch(seed, n=64):
    g = torch.Generator().manual_seed(1000 + seed)
    logits = (2 * torch.randn(n, 2, generator=g)).requires_grad_(True)
    labels = (torch.rand(n, generator=g) < 0.4).long()
    labels[0] = 1
    return logits, labels


def phi_closed_form(logits, y, margin):
    """The losses' score transform written out: tanh(m/2) forward, and for the recipe the
    straight-through slope 1/2, the margin shift and the straight-through clamp."""
    m = logits[:, 1] - logits[:, 0]
    if margin:
        phi = (torch.tanh(m / 2) - m / 2).detach() + m / 2 - margin * (2 * y - 1)
    else:
        phi = torch.tanh(m / 2)
    limit = 1 - PHI_MARGIN
    return phi + (phi.clamp(-limit, limit) - phi).detach()


def ratio_closed_form(name, phi, y, sense):
    lo, up = box_bounds(phi)
    yh = torch.where(y > 0, up, lo) if sense == "max" else torch.where(y > 0, lo, up)
    tp, pos, pred = (y * yh).sum(), y.sum(), yh.sum()
    return {"f1": lambda: 2 * tp / (pred + pos), "fbeta": lambda: 5 * tp / (pred + 4 * pos),
            "jaccard": lambda: tp / (pred - tp + pos), "p@r": lambda: tp / pred}[name]()


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("bound", ["upper", "lower", "mid"])
@pytest.mark.parametrize("name", ["f1", "fbeta", "jaccard"])
def test_loss_and_gradient_equal_the_closed_form(name, bound, config):
    loss_fn = LOSSES[name](bound=bound, **CONFIGS[config])
    senses = {"upper": ["max"], "lower": ["min"], "mid": ["max", "min"]}[bound]
    for seed in range(10):
        logits, labels = batch(seed)
        loss = loss_fn(logits, labels)
        (grad,) = torch.autograd.grad(loss, logits)
        y = labels.double()
        phi = phi_closed_form(logits, y, CONFIGS[config].get("margin", 0.0))
        ref = -sum(ratio_closed_form(name, phi, y, s) for s in senses) / len(senses)
        (ref_grad,) = torch.autograd.grad(ref, logits)
        assert abs(loss.item() - ref.item()) <= TOL
        assert (grad - ref_grad).abs().max().item() <= TOL
        assert loss_fn.pop_stats()["lp_iterations"] == 0.0   # certified guess: no Newton step


@pytest.mark.parametrize("config", list(CONFIGS))
def test_precision_at_recall_matches_highs_and_the_closed_form(config):
    """P@R: the recall row is slack, or (recipe: alpha lowered to the reachable recall) tight
    at a degenerate vertex, where the least-norm multipliers on all tight rows go negative and
    the certificate refits on the positive ones.  Value = HiGHS's, loss and gradient = the
    closed form plus the recall penalty, with no Newton step either way."""
    loss_fn = LOSSES["p@r"](**CONFIGS[config])
    for seed in range(10):
        logits, labels = batch(seed)
        y = labels.double()
        phi = phi_closed_form(logits, y, CONFIGS[config].get("margin", 0.0))
        value, _ = loss_fn.lp_value(phi.detach(), y)
        assert abs(value.item() - highs_value(loss_fn.build_lp(phi.detach(), y))) <= 1e-9
        loss = loss_fn(logits, labels)
        (grad,) = torch.autograd.grad(loss, logits)
        ref = -ratio_closed_form("p@r", phi, y, "max") \
            + torch.relu(0.6 - (y * box_bounds(phi)[1]).sum() / y.sum())
        (ref_grad,) = torch.autograd.grad(ref, logits)
        assert abs(loss.item() - ref.item()) <= TOL
        assert (grad - ref_grad).abs().max().item() <= TOL
        assert loss_fn.pop_stats()["lp_iterations"] == 0.0


@pytest.mark.parametrize("safeguard", ["drop_redundant", "none"])
@pytest.mark.parametrize("name", ["f1", "p@r"])
def test_newton_path_gives_the_same_solution(name, safeguard):
    """The eps loop (no guess) and the certified guess return the same vertex and gradient
    (recipe scores: 1e-6 boxes; for P@R a tight recall row; safeguard="none": the paper's
    redundant rows, a degenerate vertex)."""
    for seed in range(5):
        logits, labels = batch(seed)
        y = labels.double()
        phi = phi_closed_form(logits, y, 0.5).detach().requires_grad_(True)
        lp = LOSSES[name](safeguard=safeguard).build_lp(phi, y)
        out = []
        for guess in (lp.guess, None):
            sol = solve_lp(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq, vertex_guess=guess)
            (g,) = torch.autograd.grad(lp.value(sol.z), phi, retain_graph=True)
            out.append((sol.z.detach(), g, sol.stats["iterations"]))
        assert out[0][2] == 0 and out[1][2] > 0
        assert (out[0][0] - out[1][0]).abs().max().item() <= TOL
        assert (out[0][1] - out[1][1]).abs().max().item() <= TOL


def test_a_wrong_guess_falls_back_to_newton():
    logits, labels = batch(0)
    y = labels.double()
    lp = LOSSES["f1"]().build_lp(phi_closed_form(logits, y, 0.0).detach(), y)
    wrong = torch.rand(lp.guess.shape, generator=torch.Generator().manual_seed(0))
    sol = solve_lp(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq, vertex_guess=wrong)
    assert sol.stats["iterations"] > 0 and sol.stats["converged"]
    assert abs(-sol.value.item() - highs_value(lp)) <= 1e-9


def test_vertex_guess_of_the_wrong_size_says_so():
    logits, labels = batch(0)
    lp = LOSSES["f1"]().build_lp(torch.zeros(64), labels.double())
    with pytest.raises(LPInputError, match="vertex_guess"):
        solve_lp(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq, vertex_guess=torch.zeros(3))
    with pytest.raises(LPInputError, match="vertex_guess"):
        solve_lp(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq, vertex_guess=torch.zeros(4, 65))


@pytest.mark.parametrize("seed", range(20))
def test_box_vertex_numpy_equals_torch_with_zero_denominators(seed):
    """The host (numpy) path of box_vertex gives the torch path's guess bit for bit, also where
    a round's denominator is zero (IEEE inf / NaN on both, no numpy warning): zeros in ``den``
    and ``den0``, scores on the box edges."""
    import warnings

    from lpmetrics.objectives.fractional import box_vertex
    g = torch.Generator().manual_seed(seed)
    n = 6
    num = torch.randint(-2, 3, (n,), generator=g).double()
    den = torch.randint(0, 2, (n,), generator=g).double() * (seed % 3 != 0)
    phi = torch.randint(-2, 3, (n,), generator=g).double() / 2
    for sense in ("max", "min"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            host = box_vertex(num, den, 0.0, 1.0, phi, sense)
        dev = box_vertex(num.clone().requires_grad_(True), den, 0.0, 1.0, phi, sense)
        assert torch.equal(host.isnan(), dev.isnan())
        assert torch.equal(host.nan_to_num(), dev.detach().nan_to_num())
