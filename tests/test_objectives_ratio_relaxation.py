"""The relaxation knobs of the ratio LPs (objectives/ratio.py): ``bound``, ``margin``, ``phi``.

Oracles: HiGHS on the same LP (max and min), closed forms of the box optimum, scikit-learn's F1
of thresholded predictions, and the chain rule for the straight-through scores.  The first test
pins down why the paper's relaxation needs the knobs: its optimum at the constant score is 1.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from sklearn.metrics import f1_score

from lpmetrics.objectives.ratio import F1LPLoss, FBetaLPLoss, JaccardLPLoss, phi_of_logits

pytestmark = pytest.mark.usefixtures("float64_default")

RATIOS = {  # name -> (loss class, F(tp, predicted, positives))
    "f1": (F1LPLoss, lambda tp, pred, pos: 2 * tp / (pred + pos)),
    "fbeta": (lambda **kw: FBetaLPLoss(beta=2.0, **kw), lambda tp, pred, pos: 5 * tp / (pred + 4 * pos)),
    "jaccard": (JaccardLPLoss, lambda tp, pred, pos: tp / (pred - tp + pos)),
}


def highs(lp, k: int | None = None) -> float:
    """The ratio at HiGHS's optimum of LP ``k`` of a (possibly stacked) Charnes-Cooper LP."""
    c = lp.c if k is None else lp.c[k]
    sign = float(lp.sign if k is None else lp.sign[k])
    res = linprog(c.detach().numpy(), A_ub=lp.A.detach().numpy(), b_ub=lp.b.numpy(),
                  A_eq=lp.A_eq.detach().numpy(), b_eq=lp.b_eq.numpy(), bounds=(0, None),
                  method="highs")
    assert res.status == 0, res.message
    return -sign * res.fun


def box_optimum(ratio, phi, y, bound):
    """Closed form: the ratio rises with positives' and falls with negatives' predictions, so
    the upper bound takes positives at the top and negatives at the bottom of their boxes and
    the lower bound the opposite."""
    lo, up = phi.clamp(min=0), 1 + phi.clamp(max=0)      # [max(0, phi), min(1, 1 + phi)]
    yh = torch.where(y > 0, up, lo) if bound == "upper" else torch.where(y > 0, lo, up)
    return ratio((y * yh).sum(), yh.sum(), y.sum())


def batch(seed, n=30):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.5).double()
    y[:2] = torch.tensor([1.0, 0.0])
    return torch.tanh(2 * torch.randn(n, generator=g)), y


@pytest.mark.parametrize("name", list(RATIOS))
def test_paper_relaxation_is_maximal_at_the_constant_score(name):
    """phi = 0 (p = 0.5 everywhere) leaves every box [0, 1], so Y_hat = Y is feasible and the
    upper bound is 1: the paper's loss is minimised by a network that knows nothing."""
    cls, _ = RATIOS[name]
    for seed in range(3):
        _, y = batch(seed)
        assert highs(cls().build_lp(torch.zeros_like(y), y)) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("name", list(RATIOS))
@pytest.mark.parametrize("bound", ["upper", "lower"])
def test_bounds_match_highs_and_closed_form(name, bound):
    cls, ratio = RATIOS[name]
    loss = cls(bound=bound)
    for seed in range(6):
        phi, y = batch(seed)
        ref = float(box_optimum(ratio, phi, y, bound))
        assert highs(loss.build_lp(phi, y)) == pytest.approx(ref, abs=1e-9)
        value, _ = loss.lp_value(phi, y)
        assert value.item() == pytest.approx(ref, abs=1e-7)


def test_bounds_bracket_the_thresholded_f1_and_mid_is_their_mean():
    for seed in range(10):
        phi, y = batch(seed)
        pred = (phi > 0).double()
        f1 = f1_score(y.numpy(), pred.numpy())
        upper = F1LPLoss(bound="upper").lp_value(phi, y)[0].item()
        lower = F1LPLoss(bound="lower").lp_value(phi, y)[0].item()
        mid_lp = F1LPLoss(bound="mid").build_lp(phi, y)
        mid = F1LPLoss(bound="mid").lp_value(phi, y)[0].item()
        assert lower - 1e-9 <= f1 <= upper + 1e-9
        assert mid == pytest.approx((upper + lower) / 2, abs=1e-7)
        assert highs(mid_lp, 0) == pytest.approx(upper, abs=1e-7)
        assert highs(mid_lp, 1) == pytest.approx(lower, abs=1e-7)


@pytest.mark.parametrize("margin", [0.25, 0.5])
def test_margin_shifts_each_score_against_its_label(margin):
    """With a margin the loss is the paper's LP at phi - margin (2y - 1): at the constant score it
    is the closed form 2P(1-m) / (P(1-m) + N m + P), no longer the maximum 1."""
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(24, 2, generator=g)
        labels = torch.randint(0, 2, (24,), generator=g)
        labels[:2] = torch.tensor([1, 0])
        y = labels.double()
        phi = torch.tanh((logits[:, 1] - logits[:, 0]) / 2) - margin * (2 * y - 1)
        ref = -box_optimum(RATIOS["f1"][1], phi.clamp(-1, 1), y, "upper")
        loss = F1LPLoss(phi="softmax", margin=margin)(logits, labels)
        assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
        P, N = y.sum().item(), (1 - y).sum().item()
        const = F1LPLoss(margin=margin)(torch.zeros(24, 2), labels).item()
        assert -const == pytest.approx(2 * P * (1 - margin) / (P * (1 - margin) + N * margin + P),
                                       abs=1e-6)


def test_straight_through_scores():
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(16, 2, generator=g)).requires_grad_()
    margin = logits[:, 1] - logits[:, 0]
    soft = phi_of_logits(logits, "softmax")
    st = phi_of_logits(logits, "softmax_st")
    hard = phi_of_logits(logits, "sign")
    assert torch.allclose(st, soft, atol=1e-12, rtol=0)            # same forward value
    assert torch.allclose(hard, torch.where(margin > 0, 1.0, -1.0).double(), atol=1e-12, rtol=0)
    w = torch.randn(16, generator=g)
    for phi in (st, hard):                                         # backward: d phi / d m = 1/2
        (grad,) = torch.autograd.grad((w * phi).sum(), logits, retain_graph=True)
        assert torch.allclose(grad[:, 1], w / 2) and torch.allclose(grad[:, 0], -w / 2)


def test_straight_through_loss_gradient_is_the_lp_gradient_times_one_half():
    """Saturated scores keep their gradient: d loss / d margin = (d loss / d phi) / 2, with
    d loss / d phi the LP's own (active-set) gradient at the clamped phi."""
    for seed in range(4):
        g = torch.Generator().manual_seed(10 + seed)
        logits = (6 * torch.randn(32, 2, generator=g)).requires_grad_()
        labels = torch.randint(0, 2, (32,), generator=g)
        labels[:2] = torch.tensor([1, 0])
        loss_fn = F1LPLoss(phi="softmax_st", margin=0.5)
        (grad,) = torch.autograd.grad(loss_fn(logits, labels), logits)
        y = labels.double()
        with torch.no_grad():
            phi = (phi_of_logits(logits, "softmax") - 0.5 * (2 * y - 1)).clamp(-1 + 1e-6, 1 - 1e-6)
        phi.requires_grad_()
        value, _ = loss_fn.lp_value(phi, y)
        (g_phi,) = torch.autograd.grad(-value, phi)
        assert torch.allclose(grad[:, 1], g_phi / 2, atol=1e-6)
        assert grad.abs().sum() > 0


@pytest.mark.parametrize("margin", [0.0, 0.5])
def test_float32_logits_get_the_float64_gradient(margin):
    """Confidently wrong scores are clamped to +-(1 - 1e-6), leaving boxes 1e-6 wide; in float32
    the active-set backward halved their gradient until the LP was solved in float64.  Oracle:
    the closed form of the box optimum (positives at the top, negatives at the bottom of their
    boxes), differentiated in float64 with the straight-through slope 1/2."""
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        logits = (8 * torch.randn(64, 2, generator=g)).float().requires_grad_()
        labels = torch.randint(0, 2, (64,), generator=g)
        labels[:2] = torch.tensor([1, 0])
        loss = F1LPLoss(phi="softmax_st", margin=margin)(logits, labels)
        assert loss.dtype == torch.float32
        (grad,) = torch.autograd.grad(loss, logits)
        x = logits.detach().double().requires_grad_()
        y = labels.double()
        m = x[:, 1] - x[:, 0]
        phi = (torch.tanh(m / 2) - margin * (2 * y - 1)).clamp(-1 + 1e-6, 1 - 1e-6).detach()
        phi = phi + m / 2 - (m / 2).detach()                     # straight-through slope 1/2
        ref = -box_optimum(RATIOS["f1"][1], phi, y, "upper")
        (ref_grad,) = torch.autograd.grad(ref, x)
        assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
        assert torch.allclose(grad.double(), ref_grad, atol=1e-6), (grad - ref_grad).abs().max()
        assert (ref_grad.abs() > 1e-4).sum() > 10                # clamped samples included


def test_margin_without_safeguard_stays_feasible():
    """phi - margin (2y - 1) can leave [-1, 1]; it is clamped there, so the paper's 3n rows stay
    feasible and the loss equals the safeguarded one."""
    g = torch.Generator().manual_seed(0)
    logits = 8 * torch.randn(40, 2, generator=g)
    labels = torch.randint(0, 2, (40,), generator=g)
    labels[:2] = torch.tensor([1, 0])
    plain = F1LPLoss(safeguard="none", margin=0.5)(logits, labels)
    safe = F1LPLoss(margin=0.5)(logits, labels)
    assert plain.item() == pytest.approx(safe.item(), abs=1e-5)


def test_sign_scores_give_the_exact_batch_f1():
    rng = np.random.default_rng(0)
    for _ in range(5):
        logits = torch.tensor(rng.normal(size=(40, 2)))
        labels = torch.tensor(rng.integers(0, 2, 40))
        labels[:2] = torch.tensor([1, 0])
        pred = logits.argmax(1).numpy()
        loss = F1LPLoss(phi="sign")(logits, labels)
        assert -loss.item() == pytest.approx(f1_score(labels.numpy(), pred), abs=1e-5)


def test_bad_relaxation_arguments_fail_with_a_hint():
    with pytest.raises(ValueError, match="bound"):
        F1LPLoss(bound="middle")
    with pytest.raises(ValueError, match="margin"):
        F1LPLoss(margin=1.0)
    with pytest.raises(ValueError, match="phi"):
        F1LPLoss(phi="hard")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("knobs", [{"bound": "mid"}, {"phi": "softmax_st", "margin": 0.5},
                                   {"phi": "sign"}])
def test_cuda_matches_cpu(knobs):
    """The batched c (bound="mid"), margin and straight-through paths on the GPU."""
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(64, 2, generator=g, dtype=torch.float32)
    labels = torch.randint(0, 2, (64,), generator=g)
    out = []
    for device in ("cpu", "cuda"):
        x = logits.to(device).requires_grad_()
        loss = F1LPLoss(**knobs)(x, labels.to(device))
        out.append((loss.item(), torch.autograd.grad(loss, x)[0].cpu()))
    assert out[0][0] == pytest.approx(out[1][0], abs=1e-5)
    assert torch.allclose(out[0][1], out[1][1], atol=1e-5)
