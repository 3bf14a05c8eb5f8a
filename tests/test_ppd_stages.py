"""PPD-SG and PPD-AdaGrad (Liu et al. 2020, Algorithms 1 and 3) across stage ends, against a
float64 NumPy recurrence written from the update equations: the proximal pull toward each
stage's reference point, the stage average becoming both the next iterate and the next
reference, eta / 3 per stage, stages of T0 * 3^(k-1) steps, AdaGrad's squared-gradient sums
reset per stage, L2 on the primal group only. The problem is a quadratic saddle whose gradients
are closed forms, so the oracle needs no autograd."""
import numpy as np
import pytest
import torch

from lpmetrics.baselines.ppd_optim import PPDAdaGrad, PPDSG

rng = np.random.default_rng(7)
A = rng.normal(size=(5, 3))
C = rng.normal(size=5)
D = rng.normal(size=3)


def grads(w: np.ndarray, alpha: float, t: int) -> tuple[np.ndarray, float]:
    """Gradients of F(w, a) = 0.5 |A w - c_t|^2 + a (d . w) - a^2 / 2, c_t a step-dependent
    target (a stand-in for minibatch noise)."""
    c = C * (1 + 0.1 * np.sin(t))
    return A.T @ (A @ w - c) + alpha * D, float(D @ w - alpha)


def oracle(kind: str, steps: int, lr: float, gamma: float, T0: int, wd: float, delta: float = 0.5):
    w, alpha = np.ones(3), 0.2
    ref_w, ref_a = w.copy(), alpha
    sum_w, sum_a, sq_w, sq_a = np.zeros(3), 0.0, np.zeros(3), 0.0
    eta, length, taken, trace = lr, T0, 0, []
    for t in range(steps):
        gw, ga = grads(w, alpha, t)
        gw = gw + wd * w
        if kind == "sg":
            w = w - eta * (gw + (w - ref_w) / gamma)
            alpha = alpha + eta * ga
        else:
            sq_w, sq_a = sq_w + gw ** 2, sq_a + ga ** 2
            H, Ha = np.sqrt(sq_w) + delta, np.sqrt(sq_a) + delta
            prox = eta / gamma
            w = (H * w - eta * gw + prox * ref_w) / (H + prox)
            alpha = alpha + eta * ga / Ha
        sum_w, sum_a, taken = sum_w + w, sum_a + alpha, taken + 1
        if taken == length:   # stage end: the average is the next iterate and reference
            w, alpha = sum_w / taken, sum_a / taken
            ref_w, ref_a = w.copy(), alpha
            sum_w, sum_a, sq_w, sq_a = np.zeros(3), 0.0, np.zeros(3), 0.0
            eta, length, taken = eta / 3, length * 3, 0
        trace.append((w.copy(), alpha, eta))
    return trace


@pytest.mark.parametrize("kind", ["sg", "adagrad"])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_stages_match_the_recurrence(kind, wd):
    lr, gamma, T0, steps = 0.05, 3.0, 2, 11        # stage ends after steps 2 and 8
    w = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    alpha = torch.nn.Parameter(torch.tensor(0.2, dtype=torch.float64))
    groups = [{"params": [w]}, {"params": [alpha], "ascent": True, "weight_decay": 0.0}]
    opt = (PPDSG(groups, lr=lr, gamma=gamma, T0=T0, weight_decay=wd) if kind == "sg"
           else PPDAdaGrad(groups, lr=lr, gamma=gamma, T0=T0, weight_decay=wd, delta=0.5))
    At, Dt = torch.from_numpy(A), torch.from_numpy(D)
    expected = oracle(kind, steps, lr, gamma, T0, wd)
    ends = []
    for t in range(steps):
        c = torch.from_numpy(C * (1 + 0.1 * np.sin(t)))
        opt.zero_grad()
        # F's gradient in alpha is maximised: the optimizer ascends on the "ascent" group
        (0.5 * ((At @ w - c) ** 2).sum() + alpha * (Dt @ w) - alpha ** 2 / 2).backward()
        opt.step()
        ends.append(opt.stage_ended)
        w_exp, a_exp, eta_exp = expected[t]
        np.testing.assert_allclose(w.detach().numpy(), w_exp, rtol=1e-12, atol=1e-14)
        assert alpha.item() == pytest.approx(a_exp, rel=1e-12, abs=1e-14)
        assert opt.param_groups[0]["lr"] == pytest.approx(eta_exp, rel=1e-15)
    assert [t + 1 for t, e in enumerate(ends) if e] == [2, 8]


def test_the_proximal_term_matters():
    """The oracle is sensitive to the proximal weight (a check of the check): gamma 3 and gamma
    1e12 part after the first stage end."""
    near = oracle("sg", 11, 0.05, 3.0, 2, 0.0)
    far = oracle("sg", 11, 0.05, 1e12, 2, 0.0)
    assert np.allclose(near[0][0], far[0][0])            # the first step: w = ref, no pull yet
    assert not np.allclose(near[-1][0], far[-1][0], rtol=1e-6)
