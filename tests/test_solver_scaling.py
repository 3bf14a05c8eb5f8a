"""Equilibration (``solver/preprocess/scaling.py``): badly scaled LPs against HiGHS over many seeds, the
primal/dual map back, and gradcheck in float64 with the scaling on."""
import numpy as np
import pytest
import torch

from lpmetrics.solver import solve_lp
from lpmetrics.solver.problem import build_problem
from lpmetrics.solver.preprocess.scaling import ruiz_factors
from tests.test_solver_oracle import constructed_lp, highs, to_torch

D = torch.float64


def badly_scaled(rng, m, n, p=0, spread=3.0):
    """``constructed_lp`` with rows times 10^U(-spread, spread) and columns times
    10^U(-spread/2, spread/2): the same vertex in ``z / col``, entries over ~2 spread decades."""
    lp = constructed_lp(rng, m, n, p)
    row = 10.0 ** rng.uniform(-spread, spread, m)
    col = 10.0 ** rng.uniform(-spread / 2, spread / 2, n)
    out = dict(lp)
    out["A"] = row[:, None] * lp["A"] * col[None, :]
    out["b"] = row * lp["b"]
    out["c"] = lp["c"] * col
    if p:
        erow = 10.0 ** rng.uniform(-spread, spread, p)
        out["A_eq"] = erow[:, None] * lp["A_eq"] * col[None, :]
        out["b_eq"] = erow * lp["b_eq"]
    out["z"] = lp["z"] / col
    return out


@pytest.mark.parametrize("chunk", range(4))
def test_badly_scaled_lps_match_highs(chunk):
    """48 seeds, shapes 6x4 .. 60x30, with and without equalities: Newton (no hand-off) on
    the equilibrated LP reaches HiGHS's objective to 1e-6."""
    for seed in range(12 * chunk, 12 * chunk + 12):
        rng = np.random.default_rng(seed)
        m, n = int(rng.integers(6, 61)), int(rng.integers(4, 31))
        p = int(rng.integers(0, min(3, n - 1) + 1))
        lp = badly_scaled(rng, m, n, p)
        T = to_torch(lp)
        sol = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"], forward="newton")
        res, _ = highs(lp)
        assert res.status == 0
        err = abs(float(sol.value) - res.fun) / max(1.0, abs(res.fun))
        assert err <= 1e-6, (seed, err, sol.stats)
        assert sol.stats["equilibrated"]


def test_factors_equilibrate_rows_and_columns():
    rng = np.random.default_rng(0)
    T = to_torch(badly_scaled(rng, 40, 20, 3, spread=4.0))
    prob = build_problem(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
    sc = ruiz_factors(prob, 10)
    S = torch.cat([T["A"] * sc.r[:, None], T["A_eq"] * sc.re[:, None]]) * sc.s[None, :]
    # 10 rounds: every row and column infinity norm within 5% of 1 (from 8 decades)
    assert torch.allclose(S.abs().amax(1), torch.ones(43, dtype=D), rtol=5e-2)
    assert torch.allclose(S.abs().amax(0), torch.ones(20, dtype=D), rtol=5e-2)


@pytest.mark.parametrize("seed", range(4))
def test_map_back_primal_and_duals(seed):
    """Newton on the equilibrated LP and HiGHS on the LP as given (same recovery, no
    scaling) give the same z, duals and value gradients (LP sensitivity: d value / d b =
    -dual).  (Newton on these LPs unscaled fails at tol=1e-10 for some seeds.)"""
    lp = badly_scaled(np.random.default_rng(seed), 25, 10, 2, spread=2.0)
    sols = []
    for kw in (dict(forward="newton"), dict(forward="highs")):
        T = to_torch(lp, requires_grad=True)
        sol = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"], tol=1e-10, **kw)
        sol.value.backward()
        assert torch.allclose(T["b"].grad, -sol.dual, atol=1e-7 * (1 + sol.dual.abs().max()))
        sols.append(sol)
    a, b = sols
    assert torch.allclose(a.z, b.z, rtol=1e-7, atol=1e-9)
    assert torch.allclose(a.dual, b.dual, rtol=1e-6, atol=1e-8)
    assert torch.allclose(a.dual_bounds, b.dual_bounds, rtol=1e-6, atol=1e-8)
    assert torch.allclose(a.dual_eq, b.dual_eq, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("seed", range(3))
def test_gradcheck_with_scaling(seed):
    lp = badly_scaled(np.random.default_rng(seed), 7, 5, 1, spread=1.0)
    args = [to_torch(lp)[k].clone().requires_grad_() for k in ("c", "A", "b", "A_eq", "b_eq")]
    f = lambda *a: solve_lp(*a, forward="newton", tol=1e-10).z  # noqa: E731
    assert torch.autograd.gradcheck(f, args, atol=1e-6, rtol=1e-5)


def test_gradcheck_sparse_with_scaling():
    lp = badly_scaled(np.random.default_rng(7), 8, 5, 0, spread=1.0)
    T = to_torch(lp)
    idx = T["A"].nonzero().T
    vals = T["A"][idx[0], idx[1]].clone().requires_grad_()
    b = T["b"].clone().requires_grad_()

    def f(vals, b):
        A = torch.sparse_coo_tensor(idx, vals, T["A"].shape)
        return solve_lp(T["c"], A, b, forward="newton", tol=1e-10).z
    assert torch.autograd.gradcheck(f, (vals, b), atol=1e-6, rtol=1e-5)
