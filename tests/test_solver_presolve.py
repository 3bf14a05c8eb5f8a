"""Presolve (``solver/preprocess/presolve.py``): empty rows/columns and singleton equality rows removed,
the solution, duals and gradients mapped back; checked against HiGHS and with gradcheck."""
import numpy as np
import pytest
import torch

from lpmetrics.solver import LPSolverError, solve_lp
from tests.test_solver_oracle import constructed_lp, highs, to_torch

D = torch.float64


def with_reducible_parts(rng, m=12, n=6, p=1):
    """``constructed_lp`` plus an empty row (0 <= 1), an empty column (cost 0.5 >= 0, so
    z = 0) and a variable fixed by a singleton equality row (0.5 z = 1) that also enters the
    inequality rows."""
    lp = constructed_lp(rng, m, n, p)
    col = rng.standard_normal(m)
    A = np.hstack([lp["A"], np.zeros((m, 1)), col[:, None]])
    A = np.vstack([A, np.zeros((1, n + 2))])
    b = np.concatenate([lp["b"] + 2.0 * col, [1.0]])        # same feasible set in the old z
    A_eq = np.hstack([lp["A_eq"], np.zeros((p, 2))])
    single = np.zeros((1, n + 2))
    single[0, -1] = 0.5
    A_eq = np.vstack([A_eq, single])
    b_eq = np.concatenate([lp["b_eq"], [1.0]])
    c = np.concatenate([lp["c"], [0.5, rng.standard_normal()]])
    return dict(c=c, A=A, b=b, A_eq=A_eq, b_eq=b_eq, z=None)


@pytest.mark.parametrize("seed", range(12))
def test_reduced_lp_matches_highs(seed):
    lp = with_reducible_parts(np.random.default_rng(seed))
    T = to_torch(lp, requires_grad=True)
    sol = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"], forward="newton")
    assert sol.stats["presolve"] == {"rows_removed": 2, "cols_removed": 2}
    res, unique = highs(lp)
    assert abs(float(sol.value) - res.fun) <= 1e-8 * max(1.0, abs(res.fun))
    z = sol.z.detach()
    assert z[-1] == pytest.approx(2.0) and z[-2] == 0.0 and bool(sol.active_bounds[-2])
    if unique:
        assert torch.allclose(z, torch.tensor(res.x, dtype=D), atol=1e-7)
    # LP sensitivity through the removed rows: d value/db = -dual, d value/db_eq = -dual_eq
    sol.value.backward()
    assert torch.allclose(T["b"].grad, -sol.dual, atol=1e-7)
    assert torch.allclose(T["b_eq"].grad, -sol.dual_eq, atol=1e-7)
    assert float(sol.dual[-1]) == 0.0                         # the empty row


@pytest.mark.parametrize("seed", range(2))
def test_gradcheck_with_presolve(seed):
    lp = with_reducible_parts(np.random.default_rng(seed), m=6, n=4, p=1)
    args = [to_torch(lp)[k].clone().requires_grad_() for k in ("c", "A", "b", "A_eq", "b_eq")]
    f = lambda *a: solve_lp(*a, forward="newton", tol=1e-10).z  # noqa: E731
    assert torch.autograd.gradcheck(f, args, atol=1e-6, rtol=1e-5)


def test_presolve_off_gives_the_same_answer():
    lp = with_reducible_parts(np.random.default_rng(3))
    T = to_torch(lp)
    on = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"], forward="newton")
    off = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"], forward="newton",
                   presolve=False)
    assert off.stats["presolve"] is None
    assert torch.allclose(on.value, off.value, atol=1e-9)
    assert torch.allclose(on.dual, off.dual, atol=1e-7)


@pytest.mark.parametrize("forward", ["auto", "newton", "highs"])
@pytest.mark.parametrize("case", ["empty_row", "empty_eq_row", "negative_fix"])
def test_infeasible_found_by_presolve_is_typed(forward, case):
    t = lambda a: torch.tensor(a, dtype=D)   # noqa: E731
    c, A, b = t([1.0, 1.0]), t([[1.0, 1.0], [0.0, 0.0]]), t([2.0, 1.0])
    A_eq, b_eq = t([[1.0, -1.0]]), t([0.0])
    if case == "empty_row":
        b = t([2.0, -1.0])                                  # 0 <= -1
    elif case == "empty_eq_row":
        A_eq, b_eq = t([[1.0, -1.0], [0.0, 0.0]]), t([0.0, 1.0])   # 0 = 1
    else:
        A_eq, b_eq = t([[1.0, -1.0], [0.0, 2.0]]), t([0.0, -1.0])  # 2 z_2 = -1
    with pytest.raises(LPSolverError) as err:
        solve_lp(c, A, b, A_eq, b_eq, forward=forward)
    assert err.value.kind == "infeasible"
