"""Oracle tests of ``solver.solve_lp`` against scipy's HiGHS on random LPs (and the factories of
random LPs that the other ``test_solver_*`` files import).

``constructed_lp`` picks a vertex ``z*`` and multipliers satisfying complementary slackness:
active rows/bounds get positive multipliers, the rest positive slack, so the LP is feasible,
bounded and (with ``degenerate=False``) has a unique nondegenerate optimum.  ``box_lp`` is a
plain random LP ``b = A z0 + slack`` plus box rows, bounded by the box.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from lpmetrics.solver import solve_lp


def constructed_lp(rng, m, n, p=0, degenerate=False, dual_degenerate=False):
    """Return dict(c, A, b, A_eq, b_eq, z) as float64 numpy; requires m + n >= n - p."""
    A = rng.standard_normal((m, n))
    A_eq = rng.standard_normal((p, n)) if p else None
    k = n - p                                    # inequality rows + bounds to make active
    n_rows = min(m, int(rng.integers(max(0, k - n), k + 1)))
    n_bounds = k - n_rows
    rows = rng.choice(m, n_rows, replace=False)
    bounds = rng.choice(n, n_bounds, replace=False)
    z = rng.uniform(0.5, 2.0, n)
    z[bounds] = 0.0
    slack = rng.uniform(0.2, 1.5, m)
    slack[rows] = 0.0
    u = np.zeros(m)
    u[rows] = rng.uniform(0.5, 2.0, n_rows)
    v = np.zeros(n)
    v[bounds] = rng.uniform(0.5, 2.0, n_bounds)
    if dual_degenerate and n_rows:
        u[rows[0]] = 0.0                          # a tight row without multiplier
    if degenerate:
        free = np.setdiff1d(np.arange(m), rows)
        if free.size:
            slack[free[: max(1, free.size // 5)]] = 0.0   # extra tight rows, zero multiplier
    b = A @ z + slack
    w = rng.standard_normal(p) if p else None
    c = -A.T @ u + v - (A_eq.T @ w if p else 0.0)
    b_eq = A_eq @ z if p else None
    return dict(c=c, A=A, b=b, A_eq=A_eq, b_eq=b_eq, z=z)


def box_lp(rng, m, n, p=0):
    """Random LP with box rows 0 <= z <= 3 (last n rows of A), feasible by construction."""
    A0 = rng.standard_normal((m, n))
    z0 = rng.uniform(0, 1, n)
    b0 = A0 @ z0 + rng.uniform(0, 1, m)
    A = np.vstack([A0, np.eye(n)])
    b = np.concatenate([b0, np.full(n, 3.0)])
    A_eq = rng.standard_normal((p, n)) if p else None
    b_eq = A_eq @ z0 if p else None
    return dict(c=rng.standard_normal(n), A=A, b=b, A_eq=A_eq, b_eq=b_eq, z=None)


def highs(lp):
    """scipy's HiGHS on the same LP; returns (res, unique: bool)."""
    res = linprog(lp["c"], A_ub=lp["A"], b_ub=lp["b"], A_eq=lp["A_eq"], b_eq=lp["b_eq"],
                  bounds=(0, None), method="highs")
    assert res.status == 0, res.message
    # unique optimum if the rows/bounds with strictly positive multipliers (plus equalities)
    # pin down a point: rank n (strict complementarity of HiGHS' dual certifies it)
    n = len(lp["c"])
    pos_rows = lp["A"][-res.ineqlin.marginals > 1e-7]
    pos_bounds = np.eye(n)[res.lower.marginals > 1e-7]
    blocks = [pos_rows, pos_bounds] + ([lp["A_eq"]] if lp["A_eq"] is not None else [])
    M = np.vstack(blocks)
    unique = M.shape[0] >= n and np.linalg.matrix_rank(M, tol=1e-7) == n
    return res, unique


def to_torch(lp, dtype=torch.float64, requires_grad=False):
    out = {}
    for k in ("c", "A", "b", "A_eq", "b_eq"):
        out[k] = None if lp[k] is None else torch.tensor(lp[k], dtype=dtype,
                                                          requires_grad=requires_grad)
    return out


def random_lp(rng, i):
    """The i-th LP of a sweep: shapes 2x2 .. 200x50, with equalities, some degenerate."""
    n = int(rng.integers(2, 51))
    m = int(rng.integers(2, 201))
    p = int(rng.integers(0, min(4, n)))
    kind = i % 4
    if kind == 3:
        return box_lp(rng, m, n, p), "box"
    return constructed_lp(rng, m, n, p, degenerate=kind == 1, dual_degenerate=kind == 2), \
        ("nondegenerate", "primal-degenerate", "dual-degenerate")[kind]


def check_against_highs(lp, sol, rtol_obj=1e-6, ztol=1e-5):
    res, unique = highs(lp)
    value = float(sol.value)
    assert abs(value - res.fun) <= rtol_obj * (1 + abs(res.fun)), (value, res.fun)
    z = sol.z.detach().double().numpy()
    # always feasible
    assert (z >= -1e-7).all()
    assert (lp["A"] @ z - lp["b"]).max() <= 1e-7 * (1 + np.abs(lp["b"]).max())
    if lp["A_eq"] is not None:
        assert np.abs(lp["A_eq"] @ z - lp["b_eq"]).max() <= 1e-7 * (1 + np.abs(lp["b_eq"]).max())
    if unique:
        assert np.abs(z - res.x).max() <= ztol
    return unique


SWEEP = 8          # chunks x 26 LPs = 208 LPs by default


@pytest.mark.parametrize("chunk", range(SWEEP))
def test_random_lps_match_highs(chunk):
    rng = np.random.default_rng(1000 + chunk)
    n_unique = 0
    for i in range(26):
        lp, _ = random_lp(rng, i)
        T = to_torch(lp)
        sol = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
        assert sol.stats["converged"]
        n_unique += check_against_highs(lp, sol)
    assert n_unique >= 10   # most LPs have a unique optimum: the z check is not vacuous


def test_constructed_vertex_is_recovered_exactly():
    rng = np.random.default_rng(7)
    for _ in range(10):
        lp = constructed_lp(rng, 60, 20, 2)
        T = to_torch(lp)
        sol = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
        assert np.abs(sol.z.detach().numpy() - lp["z"]).max() < 1e-9
        # least-norm multipliers are optimal duals: c^T z* = -b^T u - b_eq^T w
        dual_obj = -(lp["b"] @ sol.dual.numpy()) - lp["b_eq"] @ sol.dual_eq.numpy()
        assert abs(dual_obj - float(sol.value)) < 1e-8 * (1 + abs(dual_obj))


@pytest.mark.parametrize("step", ["exact", "armijo"])
def test_step_rules_agree(step):
    rng = np.random.default_rng(3)
    for i in range(4):
        lp, _ = random_lp(rng, i)
        T = to_torch(lp)
        sol = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"], step=step, max_iter=300)
        check_against_highs(lp, sol)


def test_float32_close_to_highs():
    rng = np.random.default_rng(11)
    for i in range(8):
        lp, _ = random_lp(rng, i)
        T = to_torch(lp, torch.float32)
        sol = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
        assert sol.z.dtype == torch.float32
        res, unique = highs(lp)
        assert abs(float(sol.value) - res.fun) <= 1e-3 * (1 + abs(res.fun))
        if unique:
            assert np.abs(sol.z.double().numpy() - res.x).max() <= 1e-3 * (1 + np.abs(res.x).max())


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(SWEEP, 6 * SWEEP))
def test_random_lps_match_highs_many_seeds(chunk):
    test_random_lps_match_highs(chunk)
