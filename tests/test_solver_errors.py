"""Failure paths of ``solver.solve_lp``: infeasible, unbounded, bad input, not converged."""
import warnings

import numpy as np
import pytest
import torch

from lpmetrics.solver import LPInputError, LPNotConvergedWarning, LPSolverError, solve_lp
from tests.test_solver_oracle import constructed_lp, to_torch

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def test_infeasible_raises_with_kind_and_advice():
    with pytest.raises(LPSolverError) as err:
        solve_lp(t([1.0, 1.0]), t([[1.0, 1.0]]), t([-1.0]))        # z >= 0, z1 + z2 <= -1
    assert err.value.kind == "infeasible" and "infeasible" in str(err.value)
    assert "Check" in str(err.value) and err.value.stats


def test_infeasible_equalities_raise():
    with pytest.raises(LPSolverError, match="infeasible"):
        solve_lp(t([1.0, 1.0]), t([[1.0, 1.0]]), t([3.0]), t([[1.0, 1.0]]), t([-1.0]))


def test_infeasible_instance_in_a_batch_is_named():
    A = t([[1.0, 1.0]]).expand(3, 1, 2)
    b = t([[1.0], [-1.0], [2.0]])
    with pytest.raises(LPSolverError) as err:
        solve_lp(t([1.0, 1.0]), A, b)
    assert err.value.kind == "infeasible" and err.value.instances == [1]


@pytest.mark.parametrize("c, A, b", [
    ([-1.0, 0.0], [[1.0, -1.0]], [1.0]),                         # ray z = (1 + s, s)
    ([-1.0, -1.0], [[1.0, -1.0], [-1.0, 1.0]], [1.0, 1.0]),
    ([0.0, -1.0], [[1.0, 0.0]], [2.0]),                           # z2 free upwards
])
def test_unbounded_raises(c, A, b):
    with pytest.raises(LPSolverError) as err:
        solve_lp(t(c), t(A), t(b))
    assert err.value.kind == "unbounded" and "unbounded" in str(err.value)


@pytest.mark.parametrize("bad", ["c", "A", "b"])
def test_non_finite_input(bad):
    args = {"c": t([1.0, 1.0]), "A": t([[1.0, 1.0]]), "b": t([1.0])}
    args[bad] = args[bad].clone()
    args[bad].view(-1)[0] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        solve_lp(args["c"], args["A"], args["b"])


@pytest.mark.parametrize("c, A, b, msg", [
    ([1.0, 1.0], [[1.0, 1.0, 1.0]], [1.0], "columns"),
    ([1.0, 1.0], [[1.0, 1.0]], [1.0, 2.0], "rows"),
])
def test_mismatched_shapes(c, A, b, msg):
    with pytest.raises(LPInputError, match=msg):
        solve_lp(t(c), t(A), t(b))


def test_mismatched_batches():
    with pytest.raises(ValueError, match="broadcast"):
        solve_lp(torch.ones(3, 2, dtype=D), torch.ones(4, 1, 2, dtype=D), torch.ones(1, dtype=D))


def test_empty_problems():
    with pytest.raises(ValueError, match="empty"):
        solve_lp(torch.zeros(0, dtype=D), torch.zeros(1, 0, dtype=D), t([1.0]))
    with pytest.raises(ValueError, match="empty"):
        solve_lp(torch.ones(2, dtype=D), torch.zeros(0, 2, dtype=D), torch.zeros(0, dtype=D))


def test_bad_calls():
    c, A, b = t([1.0, 1.0]), t([[1.0, 1.0]]), t([1.0])
    with pytest.raises(ValueError, match="unknown solver option"):
        solve_lp(c, A, b, max_iters=3)
    with pytest.raises(ValueError, match="backward"):
        solve_lp(c, A, b, backward="implicit")
    with pytest.raises(ValueError, match="dtype"):
        solve_lp(c, A.float(), b)
    with pytest.raises(ValueError, match="A_eq"):
        solve_lp(c, A, b, A_eq=A)
    with pytest.raises(ValueError, match="float32 or float64"):
        solve_lp(torch.ones(2, dtype=torch.long), A, b)


def _hard_lp():
    T = to_torch(constructed_lp(np.random.default_rng(0), 80, 30, 1))
    return T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"]


def test_not_converged_raises_with_stats():
    with pytest.raises(LPSolverError) as err:
        solve_lp(*_hard_lp(), max_iter=1, max_eps_steps=0, forward="newton")
    assert err.value.kind == "not_converged"
    assert err.value.stats["converged"] is False and "kkt_residual" in err.value.stats
    assert "max_iter" in str(err.value)


def test_not_converged_warns_on_request():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sol = solve_lp(*_hard_lp(), max_iter=1, max_eps_steps=0, on_fail="warn",
                       forward="newton")
    assert any(issubclass(w.category, LPNotConvergedWarning) for w in caught)
    assert sol.stats["converged"] is False and torch.isfinite(sol.z).all()


def test_empty_batch_returns_an_empty_solution():
    """A leading batch dimension of size 0 is documented as an empty solution, not an error."""
    c = torch.ones(0, 2, dtype=D, requires_grad=True)
    b = torch.ones(0, 1, dtype=D, requires_grad=True)
    sol = solve_lp(c, t([[1.0, 1.0]]), b)
    assert sol.z.shape == (0, 2) and sol.value.shape == (0,) and sol.dual.shape == (0, 1)
    assert sol.active.shape == (0, 1) and sol.stats["batch_size"] == 0 and sol.stats["converged"]
    sol.value.sum().backward()                       # differentiable: zero gradients, right shapes
    assert c.grad.shape == (0, 2) and b.grad.shape == (0, 1)
    shared = solve_lp(t([1.0, 1.0]), torch.ones(0, 1, 2, dtype=D), t([1.0]))   # batch from A
    assert shared.z.shape == (0, 2)


@pytest.mark.parametrize("option, value, message", [
    ("tol", -1.0, r"tol=-1.0 must be a finite number > 0 or None"),
    ("tol", float("nan"), r"tol=nan must be a finite number > 0 or None"),
    ("eps", float("inf"), r"eps=inf must be a finite number > 0 or None"),
    ("cg_tol", 0.0, r"cg_tol=0.0 must be a finite number > 0"),
    ("delta", -1e-6, r"delta=-1e-06 must be a finite number >= 0 or None"),
    ("max_iter", 0, r"max_iter=0 must be an integer >= 1"),
    ("eps_decay", 1.0, r"eps_decay=1.0 must be in \(0, 1\)"),
    ("forward", "simplex", r"forward='simplex' must be 'auto', 'newton' or 'highs'"),
    ("max_seconds", 0, r"max_seconds=0 must be a number > 0"),
    ("max_seconds", -1.0, r"max_seconds=-1.0 must be a number > 0"),
    ("stall_steps", 1, r"stall_steps=1 must be an integer >= 2"),
    ("max_norm", float("nan"), r"max_norm=nan must be a number > 0"),
    ("linear_solver", "chol", r"linear_solver='chol' must be auto, diagonal, cholesky, cg, sparse"),
])
def test_options_are_validated_at_construction(option, value, message):
    from lpmetrics.solver import SolverOptions
    with pytest.raises(LPInputError, match=r"bad solver option\(s\): " + message):
        SolverOptions(**{option: value})
    with pytest.raises(LPInputError, match=message):    # and before any solve work
        solve_lp(t([1.0, 1.0]), t([[1.0, 1.0]]), t([1.0]), **{option: value})
