"""The solver-figure scripts (scripts/solver_fig_*.py) against oracles: closed forms of the AUC LP,
scipy's HiGHS (values, marginals), the blackbox gradient's definition, a known allocation."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

ROOT = Path(__file__).resolve().parents[1]
EPS = 0.01


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "solver" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fig3b():
    return load("solver_fig_blackbox")


@pytest.mark.parametrize("method", ["ours (cost LP)", "ours (pairwise LP)", "blackbox (HiGHS)"])
def test_fig3b_methods_solve_the_auc_lp(fig3b, method):
    """Every timed layer returns the AUC LP's optimum: z = relu(eps - d)."""
    _, _, value = fig3b.time_method(method, batch=3, repeats=1, seed=1)
    d, _ = fig3b.instance(3, seed=1)
    assert value == pytest.approx(float(torch.relu(EPS - d).sum()), rel=1e-9, abs=1e-12)


def test_fig3b_gradients_against_their_definitions(fig3b):
    d, w = fig3b.instance(2, seed=2)
    m = d.shape[1]
    # ours, pairwise form: z = relu(-b)  =>  d(w.z)/db = -w [b < 0]
    b = (d - EPS).clone().requires_grad_()
    (fig3b.layer("ours (pairwise LP)", m)(b) * w).sum().backward()
    assert torch.allclose(b.grad, -w * (d - EPS < 0), atol=1e-9)
    # blackbox: -(z(c) - z(c + lam w)) / lam, each z from linprog directly
    c = (d - EPS).clone().requires_grad_()
    (fig3b.layer("blackbox (HiGHS)", m)(c) * w).sum().backward()
    for k in range(2):
        solve = lambda cost: linprog(cost, A_ub=np.eye(m), b_ub=np.ones(m), bounds=(0, None),  # noqa: E731
                                     method="highs").x
        z, z_lam = solve(c[k].detach().numpy()), solve((c[k] + 10.0 * w[k]).detach().numpy())
        assert np.allclose(c.grad[k].numpy(), -(z - z_lam) / 10.0, atol=1e-9)


def test_a4_active_set_gradient_is_the_closed_form_and_unrolled_agrees():
    """AUC LP on logits: the loss is 1 - mean clip(d / eps, 0, 1) over (pos, neg) pairs of the
    softmax scores (closed form); the unrolled gradient points the same way."""
    a4 = load("solver_fig_unrolled")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 2, generator=g, dtype=torch.float64) * 0.02
    y = (torch.rand(48, generator=g) < 0.5).long()
    xr = x.clone().requires_grad_()
    s = torch.softmax(xr, -1)[:, 1]
    dd = (s[y == 1][:, None] - s[y == 0][None, :]).flatten()
    (1 - (dd / EPS).clamp(0, 1).mean()).backward()
    ours = a4.gradient(a4.make_loss("auc_lp", "active_set"), x, y)
    assert xr.grad.norm() > 0 and torch.allclose(ours, xr.grad, atol=1e-10)
    res = a4.cosines(x, y, [torch.arange(24), torch.arange(24, 48)], "auc_lp")
    assert len(res["cosines"]) == 2 and min(res["cosines"]) > 0.999


def test_fig3c_oracle_and_sketched_solve_at_convergence():
    sk = load("solver_fig_sketch")
    c, A, b = sk.random_lp(8, 60, seed=0)
    ref = sk.highs_oracle(c, A, b)
    # the oracle's gradient is the value's derivative in b (finite differences of HiGHS)
    i = int(np.argmax(np.abs(ref[1])))
    e = np.zeros_like(b)
    e[i] = 1e-6
    fd = (linprog(c, A_ub=A, b_ub=b + e, bounds=(0, None), method="highs").fun
          - linprog(c, A_ub=A, b_ub=b - e, bounds=(0, None), method="highs").fun) / 2e-6
    assert ref[1][i] != 0 and fd == pytest.approx(ref[1][i], rel=1e-6)
    for kind in ("gaussian", "sampling"):
        obj, grad, steps, _ = sk.sketched_errors(c, A, b, ref, sketch=kind, sketch_size=16,
                                                 max_iter=300, on_fail="warn")
        assert obj < 1e-9 and grad < 1e-8 and steps > 0


def test_memory_measure_and_dense_loss():
    mem = load("solver_fig_memory")
    from lpmetrics.objectives.auc import AUCLoss
    assert mem.peak_memory_mb(lambda: torch.ones(8 * 2**20, dtype=torch.float64).sum(),
                              torch.device("cpu")) == pytest.approx(64, abs=8)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 2, generator=g, dtype=torch.float64)
    y = (torch.arange(20) < 12).long()
    grads = []
    for loss_fn in (AUCLoss(), mem.DenseAUCLoss()):
        xr = x.clone().requires_grad_()
        loss_fn(xr, y).backward()
        grads.append(xr.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-10)


@pytest.mark.parametrize("method", ["newton", "newton_highs"])
def test_bench_random_sparse_lp_family_matches_highs(method):
    """bench_solver's family (c): both of our forwards reach HiGHS's optimum (with equalities)."""
    measure = load("bench_solver_measure")
    c, A, b, A_eq, b_eq = measure.random_sparse_lp(120, seed=3)
    assert A_eq.shape[0] >= 1
    ref = linprog(c, A_ub=A, b_ub=b, A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method="highs").fun
    value = measure.make_sparse_call(method, 120, torch.float64, torch.device("cpu"), seed=3)()
    assert value == pytest.approx(ref, rel=1e-8)
