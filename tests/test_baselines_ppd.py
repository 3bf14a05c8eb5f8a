"""PPD-SG / PPD-AdaGrad: the saddle identity (closed-form inner optimum), finite-difference
gradients, the optimizers' stage logic, and a smoke run through the trainer's calls."""
from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from lpmetrics.baselines.ppd import SquareAUCMinMax, square_auc_minmax
from lpmetrics.baselines.ppd_optim import PPDSG, PPDAdaGrad
from lpmetrics.run.builders import instantiate_runtime
from tests.helpers import trainer_step


def batch(seed: int, n: int = 40, pos_frac: float = 0.7):
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=g) < pos_frac).long()
    labels[:2] = torch.tensor([0, 1])  # both classes present
    h = torch.rand(n, generator=g, dtype=torch.float64)
    return h, labels


def inner_optimum(h, labels, p):
    """Closed-form (a*, b*, alpha*) for any p (stationarity of the batch-mean F)."""
    pos, neg = labels == 1, labels == 0
    n = len(h)
    a, b = h[pos].mean(), h[neg].mean()
    alpha = (p * h[neg].sum() - (1 - p) * h[pos].sum()) / (n * p * (1 - p))
    return a, b, alpha


@pytest.mark.parametrize("seed", range(10))
def test_saddle_value_is_the_square_auc_surrogate(seed):
    h, labels = batch(seed)
    p = labels.double().mean().item()        # the identity holds with the batch's own p
    a, b, alpha = inner_optimum(h, labels, p)
    assert torch.allclose(alpha, b - a)
    value = square_auc_minmax(h, labels, a, b, alpha, p)
    d = h[labels == 1][:, None] - h[labels == 0][None, :]
    direct = p * (1 - p) * (((1 - d) ** 2).mean() - 1)
    assert torch.allclose(value, direct, atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_inner_optimum_is_a_saddle(seed):
    h, labels = batch(seed)
    p = 0.8  # a p that differs from the batch fraction: the closed form still holds
    a, b, alpha = (t.clone().requires_grad_() for t in inner_optimum(h, labels, p))
    value = square_auc_minmax(h, labels, a, b, alpha, p)
    grads = torch.autograd.grad(value, (a, b, alpha))
    assert all(abs(g.item()) < 1e-12 for g in grads)
    with torch.no_grad():  # F(a*, b*, alpha) <= F(a*, b*, alpha*) <= F(a, b, alpha*)
        for delta in (-0.1, 0.1):
            assert square_auc_minmax(h, labels, a, b, alpha + delta, p) < value
            assert square_auc_minmax(h, labels, a + delta, b, alpha, p) > value
            assert square_auc_minmax(h, labels, a, b + delta, alpha, p) > value


@pytest.mark.parametrize("seed", range(3))
def test_gradients_match_finite_differences(seed):
    h, labels = batch(seed, n=12)
    gen = torch.Generator().manual_seed(seed)
    params = tuple(torch.randn(3, dtype=torch.float64, generator=gen))
    args = (h.clone().requires_grad_(),) + tuple(t.clone().requires_grad_() for t in params)
    def f(h_, a, b, al):
        return square_auc_minmax(h_, labels, a, b, al, 0.3)
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-8)


def test_objective_matches_function_and_refuses_plain_sgd():
    obj = SquareAUCMinMax(pos_ratio=0.3)
    logits = torch.randn(16, 2)
    labels = torch.arange(16) % 2
    h = torch.softmax(logits, 1)[:, 1]
    assert torch.allclose(obj(logits, labels), square_auc_minmax(h, labels, 0., 0., 0., 0.3))
    sgd = torch.optim.SGD([obj.alpha], lr=0.1)
    with pytest.raises(TypeError, match="optimizer=ppd_sg"):
        obj.on_step_end(step=0, model=torch.nn.Linear(2, 2), optimizer=sgd,
                        batch=(torch.zeros(4, 2), labels[:4]))
    with pytest.raises(ValueError, match="pos_ratio"):
        SquareAUCMinMax(pos_ratio=1.0)


@pytest.mark.parametrize("cls", [PPDSG, PPDAdaGrad])
def test_stages_average_and_decay(cls):
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    alpha = torch.nn.Parameter(torch.zeros(()))
    opt = cls([{"params": [w]}, {"params": [alpha], "ascent": True}], lr=0.1, gamma=10.0, T0=2)
    iterates, ended = [], []
    for _ in range(8):  # stages of 2 and 6 steps
        opt.zero_grad()
        (0.5 * (w ** 2).sum() + alpha * w.sum() - alpha ** 2).backward()
        before = alpha.item()
        opt.step()
        ended.append(opt.stage_ended)
        if not opt.stage_ended:
            iterates.append(w.detach().clone())
        if opt.stage == 1:  # ascent on alpha: d/dalpha = w.sum() - 2 alpha = -1 < 0 at start
            assert alpha.item() < before
    assert ended == [False, True, False, False, False, False, False, True]
    assert opt.stage == 3 and opt.stage_len == 18
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 / 9)
    state = opt.state_dict()
    again = cls([{"params": [w]}, {"params": [alpha], "ascent": True}], lr=0.1, gamma=10.0, T0=2)
    again.load_state_dict(state)
    assert (again.stage, again.stage_step, again.stage_len) == (3, 0, 18)


def test_stage_end_replaces_weights_by_the_average():
    w = torch.nn.Parameter(torch.zeros(1))
    opt = PPDSG([w], lr=1.0, gamma=1e9, T0=3)
    seen = []
    for g in (1.0, 2.0, 3.0):
        w.grad = torch.tensor([-g])
        opt.step()
        seen.append(seen[-1] + g if seen else g)
    assert w.item() == pytest.approx(sum(seen) / 3)            # (1 + 3 + 6) / 3
    assert opt.state[w]["ref"].item() == pytest.approx(sum(seen) / 3)


@pytest.mark.parametrize("name", ["ppd_sg", "ppd_adagrad"])
def test_smoke_training_through_trainer_calls(name, compose_cfg):
    torch.manual_seed(0)
    x = torch.randn(256, 5)
    y = (x[:, 0] + 0.5 * torch.randn(256) > 0.3).long()
    model = torch.nn.Linear(5, 2)
    cfg = compose_cfg([f"objective={name}", "optimizer.T0=5"])  # the objective picks its optimizer
    assert list(cfg.scheduler.milestones) == []
    objective = instantiate_runtime(cfg.objective, pos_ratio=y.float().mean().item(), num_classes=2)
    objective.alpha_samples = 64
    opt_cfg = cfg.optimizer
    optimizer = instantiate(opt_cfg, _partial_=True)(params=[{"params": list(model.parameters())}]
                            + objective.extra_param_groups())
    resets = 0
    for step in range(20):  # stages end after 5 and 20 steps
        idx = torch.randint(0, 256, (32,))
        trainer_step(model, objective, optimizer, x[idx], y[idx], step)
        resets += optimizer.stage_ended
    assert resets == 2
    with torch.no_grad():
        xx, yy = objective.remembered()
        assert len(yy) == 64   # the last 2 batches of 32 (alpha_samples=64)
        h = torch.softmax(model(xx), 1)[:, 1]
        expected = (h[yy == 0].mean() - h[yy == 1].mean()).item()
        assert objective.alpha.item() == pytest.approx(expected, abs=1e-6)   # float32 sums, another order
    assert set(objective.pop_stats()) >= {"ppd_a", "ppd_b", "ppd_alpha", "ppd_alpha_reset"}


def test_single_steps_match_the_update_formulas():
    """One inner step of each optimizer against its equation (module docstring of ppd_optim)."""
    g = torch.Generator().manual_seed(0)
    v0, grad = torch.randn(5, generator=g), torch.randn(5, generator=g)
    ga = torch.randn(1, generator=g)
    eta, gamma, wd = 0.3, 2.0, 0.1
    for cls in (PPDSG, PPDAdaGrad):
        v = torch.nn.Parameter(v0.clone())
        alpha = torch.nn.Parameter(torch.zeros(1))
        opt = cls([{"params": [v], "weight_decay": wd}, {"params": [alpha], "ascent": True}],
                  lr=eta, gamma=gamma, T0=10)
        v.grad, alpha.grad = grad.clone(), ga.clone()
        opt.step()  # first step of a stage: reference = v0
        gv = grad + wd * v0
        if cls is PPDSG:
            assert torch.allclose(v.detach(), v0 - eta * gv)  # the proximal term is 0 at v = ref
            assert torch.allclose(alpha.detach(), eta * ga)
        else:  # v+ solves eta*g + eta/gamma*(v+ - ref) + H*(v+ - v_t) = 0 with H = delta + |g|
            delta = opt.param_groups[0]["delta"]
            assert delta == 0.5   # Liu et al.'s official code (optimizer.py, PPD_ADAGRAD: epsilon = 0.5)
            H = gv.abs() + delta
            residual = eta * gv + eta / gamma * (v.detach() - v0) + H * (v.detach() - v0)
            assert residual.abs().max() < 1e-5
            assert torch.allclose(alpha.detach(), eta * ga / (ga.abs() + delta))
            v1 = v.detach().clone()  # second step: v_t != ref, H accumulates both gradients
            v.grad = -grad.clone()
            opt.step()
            gv2 = -grad + wd * v1
            H2 = (gv ** 2 + gv2 ** 2).sqrt() + delta
            residual = eta * gv2 + eta / gamma * (v.detach() - v0) + H2 * (v.detach() - v1)
            assert residual.abs().max() < 1e-5
