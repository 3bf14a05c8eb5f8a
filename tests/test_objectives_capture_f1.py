"""The capture-safe form of the ratio LP losses (``objective=f1_lp``; F-beta, Jaccard): the
Charnes-Cooper LP with fixed shapes and its closed-form vertex certified on the device
(:mod:`solver.capture.guess`), against the default path, HiGHS, the closed form and finite
differences, in float64 on the CPU; no host sync in forward and backward, the same ops and
shapes whatever the labels; and the solver piece itself against the standard certificate.
"""
from __future__ import annotations

import pytest
import torch
from scipy.optimize import linprog

from lpmetrics.models.mlp import MLP
from lpmetrics.objectives.common import labels_checked
from lpmetrics.objectives.fractional import box_bounds, charnes_cooper_lp
from lpmetrics.objectives.ratio import (F1LPLoss, FBetaLPLoss, JaccardLPLoss, PrecisionAtRecallLPLoss,
                              phi_of_logits)
from lpmetrics.packed import PackedStep, pack, param_groups
from lpmetrics.solver import LPInputError, solve_lp
from tests.helpers import assert_graph_replays_eager
from tests.test_auc_dense_pairs import NoHostSync
from tests.test_objectives_capture_ova import no_sync_forward_backward, op_trace

F64 = torch.float64
TOL = 1e-10
CONFIGS = {
    "f1_lp": (F1LPLoss, {"phi": "softmax_st", "margin": 0.5}),      # configs/objective/f1_lp.yaml
    "f1_paper": (F1LPLoss, {}),
    "f1_tanh": (F1LPLoss, {"phi": "tanh"}),
    "f1_sign": (F1LPLoss, {"phi": "sign", "margin": 0.2}),
    "f1_lower": (F1LPLoss, {"bound": "lower"}),
    "f1_mid": (F1LPLoss, {"bound": "mid", "phi": "softmax_st", "margin": 0.5}),
    "fbeta2": (FBetaLPLoss, {"beta": 2.0}),
    "fbeta05": (FBetaLPLoss, {"beta": 0.5, "margin": 0.3, "phi": "softmax_st"}),
    "jaccard": (JaccardLPLoss, {"phi": "softmax_st", "margin": 0.5}),
    "jaccard_lower": (JaccardLPLoss, {"bound": "lower"}),
}


def batch(seed: int):
    """``(logits [B, 2], labels)``: B 2-96; labels balanced, 10 % or 90 % positive, only
    positives, none, a single one; logits random, quantised (ties), saturated (clamped
    scores) or half exactly zero (``phi = 0``, the kink of the boxes)."""
    g = torch.Generator().manual_seed(seed)
    B = (2, 3)[seed % 2] if seed % 8 == 0 else int(torch.randint(4, 97, (1,), generator=g))
    kind = seed % 7
    y = (torch.rand(B, generator=g) < (0.5, 0.1, 0.9, 1.0, 0.0, 0.5, 0.5)[kind]).long()
    if kind == 5:
        y[:] = 0
        y[int(torch.randint(0, B, (1,), generator=g))] = 1
    x = torch.randn(B, 2, generator=g, dtype=F64) * (0.5 + 3 * float(torch.rand(1, generator=g)))
    form = seed % 5
    if form == 1:
        x = (x * 2).round() / 2
    elif form == 2:
        x = x * 30
    elif form == 3:
        x[: B // 2] = 0.0
    return x, y


def loss_and_grad(fn, logits, labels):
    x = logits.clone().requires_grad_()
    loss = fn(x, labels)
    loss.backward()
    return loss.detach(), x.grad, fn.pop_stats()


def compare(name: str, seeds):
    """Default path against the capture-safe form; returns the worst differences and how
    often the default path ran Newton and the capture-safe form flagged a batch."""
    cls, kw = CONFIGS[name]
    worst, newton, flagged = [0.0, 0.0], 0, 0
    for seed in seeds:
        x, y = batch(seed)
        plain = cls(**kw)
        safe = plain.capture_safe_form()
        assert safe is not plain and safe.capturable and not plain.capturable
        (la, ga, sa), (lb, gb, sb) = (loss_and_grad(fn, x, y) for fn in (plain, safe))
        worst = [max(worst[0], abs(float(la - lb))), max(worst[1], float((ga - gb).abs().max()))]
        assert worst[0] <= TOL and worst[1] <= TOL, f"{name} seed {seed}: {worst}"
        for key in ("degenerate_batches", "empty_batches", "lp_iterations", "lp_active"):
            assert sa.get(key) == sb.get(key), f"{name} seed {seed}: {key}"
        newton += sa.get("lp_iterations", 0.0) > 0
        flagged += sb.get("lp_converged", 1.0) < 1
    return worst, newton, flagged


@pytest.mark.parametrize("name", list(CONFIGS))
def test_capture_safe_form_equals_the_default_path(name):
    """Loss, gradient and statistics equal the default objective's to 1e-10, 40 batches each."""
    compare(name, range(40))


def test_coverage_of_the_certificate():
    """The capture-safe form runs no Newton: it must certify the closed-form vertex wherever
    the default path does, and the default path must not need Newton (it would there, this
    form would flag the batch).  600 batches; ``-s`` prints what ``RatioLPLoss.capture_safe_form``
    quotes."""
    total = [0.0, 0.0]
    for i, name in enumerate(CONFIGS):
        worst, newton, flagged = compare(name, range(1000 + 60 * i, 1060 + 60 * i))
        assert newton == 0 and flagged == 0, f"{name}: Newton {newton}, flagged {flagged}"
        total = [max(a, b) for a, b in zip(total, worst)]
    print(f"\n600 batches: default path 0 Newton steps, capture-safe form certified every one; "
          f"max |loss diff| {total[0]:.2g}, max |grad diff| {total[1]:.2g}")


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("bound", ["upper", "lower"])
def test_value_equals_highs_and_the_closed_form(seed, bound):
    """Oracles: the LP (with the default rows) solved by scipy's HiGHS, and for F1's upper
    bound the closed form 2 sum_+ u / (sum_+ u + sum_- l + P)."""
    x, y = batch(200 + 7 * seed)          # (kind 0: both classes)
    fn = F1LPLoss(bound=bound, margin=0.3).capture_safe_form()
    loss = float(fn(x, y))
    yf = y.to(F64)
    phi = (phi_of_logits(x, "softmax") - 0.3 * (2 * yf - 1)).clamp(-1 + 1e-6, 1 - 1e-6)
    lp = charnes_cooper_lp(phi=phi, senses=(("max",) if bound == "upper" else ("min",)),
                           **fn.ratio(yf))
    ref = linprog(lp.c.numpy(), A_ub=lp.A.numpy(), b_ub=lp.b.numpy(), A_eq=lp.A_eq.numpy(),
                  b_eq=lp.b_eq.numpy(), bounds=(0, None), method="highs")
    assert ref.status == 0
    assert abs(loss - lp.sign * ref.fun) <= 1e-8
    if bound == "upper":
        lo, up = box_bounds(phi)
        P = yf.sum()
        closed = 2 * (yf * up).sum() / ((yf * up).sum() + ((1 - yf) * lo).sum() + P)
        assert abs(loss + float(closed)) <= TOL


@pytest.mark.parametrize("cls,kw", [(F1LPLoss, {}), (F1LPLoss, {"bound": "lower", "margin": 0.3}),
                                    (F1LPLoss, {"bound": "mid", "phi": "tanh"}),
                                    (JaccardLPLoss, {"margin": 0.3})],
                         ids=["f1", "f1_lower_margin", "f1_mid_tanh", "jaccard_margin"])
def test_gradcheck(cls, kw):
    """float64 finite differences of the capture-safe loss w.r.t. the logits (small logits: no
    score within the step of a box kink at 0 or of the clamp)."""
    g = torch.Generator().manual_seed(4)
    x = (0.3 * torch.randn(12, 2, generator=g, dtype=F64)).requires_grad_()
    y = torch.tensor([0, 1] * 6)
    fn = cls(**kw).capture_safe_form()
    assert torch.autograd.gradcheck(lambda t: fn(t, y), (x,), eps=1e-6, atol=1e-8)


class WrongGuess(F1LPLoss):
    """F1 whose closed-form vertex is replaced by a feasible but not optimal one (every sample
    at the bottom of its box): it does not certify."""

    def build_lp(self, phi, y):
        lp = super().build_lp(phi, y)
        lo = box_bounds(phi.detach())[0]
        t = lp.b_eq[0] / (lo.sum() + y.sum())
        lp.guess = torch.cat([t * lo, t.reshape(1)])
        return lp


def test_an_uncertified_vertex_is_recorded_not_hidden():
    x, y = batch(1)
    safe = WrongGuess(margin=0.5, phi="softmax_st").capture_safe_form()
    plain = WrongGuess(margin=0.5, phi="softmax_st")
    (la, _, sa), (lb, _, sb) = (loss_and_grad(fn, x, y) for fn in (plain, safe))
    assert sa["lp_converged"] == 1.0 and sa["lp_iterations"] > 0   # the default path ran Newton
    assert sb["lp_converged"] == 0.0                                 # this one says it did not
    assert abs(float(la - loss_and_grad(F1LPLoss(margin=0.5, phi="softmax_st"), x, y)[0])) <= 1e-9


@pytest.mark.parametrize("name", ["f1_lp", "f1_mid", "jaccard_lower"])
def test_forward_and_backward_make_no_host_sync(name, monkeypatch):
    cls, kw = CONFIGS[name]
    for seed in (1, 4):                     # (seed 4: no positive)
        x, y = batch(seed)
        no_sync_forward_backward(cls(**kw).capture_safe_form(), x, y, monkeypatch)


def test_the_default_form_does_sync():   # so the check above can fail
    x, y = batch(1)
    with labels_checked(), NoHostSync(), pytest.raises(AssertionError, match="host sync"):
        F1LPLoss()(x, y)


@pytest.mark.parametrize("name", ["f1_lp", "f1_mid", "jaccard_lower"])
def test_ops_and_shapes_do_not_depend_on_the_labels(name):
    cls, kw = CONFIGS[name]
    fn = cls(**kw).capture_safe_form()
    x = torch.randn(10, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    labels = [torch.tensor([0, 1] * 5), torch.tensor([1] * 9 + [0]), torch.zeros(10, dtype=torch.long),
              torch.ones(10, dtype=torch.long)]
    op_trace(fn, x, labels[0])   # warm-up: the first call caches constants (-I, a scalar), as the
                                 # warm-up steps before a CUDA-graph capture do
    traces = [op_trace(fn, x, y) for y in labels]
    assert all(t == traces[0] for t in traces[1:])


def test_no_positive_is_a_zero_loss_with_zero_gradient():
    fn = F1LPLoss(phi="softmax_st", margin=0.5).capture_safe_form()
    x = torch.randn(8, 2, dtype=F64, requires_grad=True)
    loss = fn(x, torch.zeros(8, dtype=torch.long))
    loss.backward()
    assert float(loss.detach()) == 0.0 and not x.grad.any()
    assert fn.pop_stats() == {"degenerate_batches": 1.0, "empty_batches": 1.0}


def test_capture_safe_form_is_none_where_it_cannot_be_the_same_loss():
    assert F1LPLoss(backward="unrolled").capture_safe_form() is None
    assert F1LPLoss(solver={"forward": "highs"}).capture_safe_form() is None
    assert F1LPLoss(solver={"sketch": "gaussian"}).capture_safe_form() is None
    assert F1LPLoss(safeguard="none").capture_safe_form() is None
    assert PrecisionAtRecallLPLoss().capture_safe_form() is None
    with pytest.raises(ValueError, match="precision@recall has no capture-safe form"):
        PrecisionAtRecallLPLoss(solver={"capture_safe": True})
    safe = F1LPLoss(solver={"capture_safe": True})
    assert safe.capturable and safe.capture_safe_form() is safe


def test_packed_sync_free_step_makes_no_host_sync():
    torch.manual_seed(0)
    models = [MLP(2, [3, 4, 4], hidden=[8]) for _ in range(2)]
    packed = pack(models)
    objectives = [F1LPLoss(phi="softmax_st", margin=0.5).capture_safe_form(),
                  JaccardLPLoss(bound="mid").capture_safe_form()]
    opts = [torch.optim.SGD(param_groups(m, o), lr=0.1, momentum=0.9)
            for m, o in zip(packed.models, objectives)]
    stepper = PackedStep(packed, objectives, opts, [None] * 2, sync_free=True)
    x, y = torch.randn(2, 12, 3, 4, 4), (torch.rand(2, 12) < 0.5).long()
    y[1] = 0   # one run's batch has no positive
    with labels_checked():
        stepper.step(x, y, 0)   # builds the optimizer state and the device flags
        with NoHostSync():
            out = stepper.step(x, y, 1)
    assert out.losses.shape == (2,) and float(out.losses[1]) == 0.0


def test_the_config_has_a_capture_safe_form(compose_cfg):
    from hydra.utils import instantiate
    fn = instantiate(compose_cfg(["objective=f1_lp"]).objective)
    assert not fn.capturable and fn.capture_safe_form().capturable
    cfg = compose_cfg(["objective=f1_lp", "+objective.solver.capture_safe=true"])
    assert instantiate(cfg.objective).capturable


# ---- the solver piece (solver/capture/guess.py) on LPs that are no metric -------------------

def random_lp(seed: int, B: int | None = None):
    """A random feasible, bounded LP with one equality row, its HiGHS vertex as the guess."""
    g = torch.Generator().manual_seed(seed)
    n, m = 6 + seed % 5, 9 + seed % 4
    A = torch.randn(m, n, generator=g, dtype=F64)
    inside = torch.rand(n, generator=g, dtype=F64)
    b = A @ inside + torch.rand(m, generator=g, dtype=F64)
    E = torch.rand(1, n, generator=g, dtype=F64) + 0.1     # E > 0, z >= 0: bounded
    e = E @ inside
    cs = torch.randn(B or 1, n, generator=g, dtype=F64)
    guesses = []
    for c in cs:
        ref = linprog(c.numpy(), A_ub=A.numpy(), b_ub=b.numpy(), A_eq=E.numpy(), b_eq=e.numpy(),
                      bounds=(0, None), method="highs")
        assert ref.status == 0
        guesses.append(torch.from_numpy(ref.x))
    c, x = (cs, torch.stack(guesses)) if B else (cs[0], guesses[0])
    return c, A, b, E, e, x


@pytest.mark.parametrize("B", [None, 3])
def test_certificate_equals_the_standard_one(B):
    """Vertex, value, multipliers and the gradients w.r.t. A, b, A_eq, b_eq equal the standard
    path's certificate of the same guess (1e-10) on 12 random LPs."""
    for seed in range(12):
        c, A, b, E, e, x = random_lp(seed, B)
        out = []
        for capture in (False, True):
            data = [t.clone().requires_grad_() for t in (A, b, E, e)]
            sol = solve_lp(c, *data, vertex_guess=x, capture_safe=capture)
            w = torch.arange(1.0, c.shape[-1] + 1, dtype=F64)
            (sol.z * w).sum().backward()
            out.append((sol, [t.grad for t in data]))
        (s0, g0), (s1, g1) = out
        assert bool(s1.stats["converged"]) and s0.stats["converged"]
        assert s0.stats["iterations"] == 0                     # certified there too
        for field in ("z", "value", "dual", "dual_eq", "dual_bounds"):
            torch.testing.assert_close(getattr(s1, field), getattr(s0, field), atol=TOL, rtol=0)
        for a, b_ in zip(g1, g0):
            torch.testing.assert_close(a, b_, atol=TOL, rtol=0)


def test_a_guess_that_does_not_certify_is_flagged_not_raised():
    c, A, b, E, e, x = random_lp(3)
    wrong = x + 0.1
    sol = solve_lp(c, A, b, E, e, vertex_guess=wrong, capture_safe=True)
    assert not bool(sol.stats["converged"]) and bool(sol.stats["finite_input"])
    nan = solve_lp(c, A, b, E, e, vertex_guess=torch.full_like(x, float("nan")), capture_safe=True)
    assert not bool(nan.stats["converged"]) and torch.isfinite(nan.z).all()
    right = solve_lp(c, A, b, E, e, vertex_guess=x, capture_safe=True)
    assert bool(right.stats["converged"])


def test_solver_refuses_what_needs_the_host():
    c, A, b, E, e, x = random_lp(0)
    with pytest.raises(LPInputError, match="vertex_guess"):
        solve_lp(c, A, b, E, e, capture_safe=True)
    with pytest.raises(LPInputError, match="dense A"):
        solve_lp(c, A.to_sparse(), b, E, e, vertex_guess=x, capture_safe=True)
    with pytest.raises(LPInputError, match="linear_solver"):
        solve_lp(c, A, b, E, e, vertex_guess=x, capture_safe=True, linear_solver="cg")
    with pytest.raises(LPInputError, match="unrolled"):
        solve_lp(c, A, b, E, e, vertex_guess=x, capture_safe=True, backward="unrolled")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_and_replay():
    """The capture-safe F1 loss and its backward captured in a CUDA graph; a replay on new
    logits and labels equals the eager call."""
    fn = F1LPLoss(phi="softmax_st", margin=0.5).capture_safe_form().cuda()
    assert_graph_replays_eager(fn, batch=64, classes=2)
    assert fn.pop_stats()["lp_converged"] == 1.0
