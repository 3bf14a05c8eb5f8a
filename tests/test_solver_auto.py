"""``forward="auto"`` (the default), ``max_seconds`` and the stall detector.

Which LPs auto routes where, the hand-off of a stalled / unconverged LP to HiGHS (same vertex
and backward), the time limit's typed error (what did not converge, the option to try, within
the bound) and infeasible / unbounded LPs in every forward mode."""
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lpmetrics.solver import (DiagonalOperator, LPInputError, LPLayer, LPSolverError, LPTimeLimitError,
                    solve_lp)
from scripts.solver.netlib.mps import read_mps, to_standard_form
from tests.test_solver_oracle import constructed_lp, highs, to_torch

D = torch.float64
SHARE2B = Path(__file__).resolve().parents[1] / "scripts" / "solver" / "netlib" / "share2b.mps"


def _share2b():
    """netlib's share2b: unequilibrated, Newton stalls on it (601 steps, not converged)."""
    S = to_standard_form(read_mps(SHARE2B))
    t = lambda a: torch.tensor(a, dtype=D)   # noqa: E731
    return (t(S.c), t(S.A.toarray()), t(S.b), t(S.A_eq.toarray()), t(S.b_eq)), S.offset


def test_max_seconds_refused_at_construction():
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(LPInputError, match="max_seconds"):
            LPLayer(max_seconds=bad)
    LPLayer(max_seconds=None)        # no bound is allowed


def test_newton_time_limit_raises_typed_error_within_the_bound():
    args, _ = _share2b()
    t0 = time.perf_counter()
    with pytest.raises(LPTimeLimitError) as err:
        solve_lp(*args, forward="newton", equilibrate=0, max_seconds=0.3)
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.3 + 2.0               # one Newton step + one recovery past the bound
    e = err.value
    assert e.kind == "time_limit" and isinstance(e, LPSolverError)
    msg = str(e)
    for part in ("max_seconds=0.3", "KKT residual", "Newton steps", "forward='highs'"):
        assert part in msg, msg
    assert e.stats["converged"] is False and e.stats["iterations"] > 0 and e.instances == [0]


def test_stalled_lp_is_handed_to_highs():
    args, offset = _share2b()
    sol = solve_lp(*args, equilibrate=0)                      # default forward="auto"
    assert sol.stats["forward"] == "highs" and sol.stats["converged"]
    assert abs(float(sol.value) + offset + 415.73224074) < 1e-6 * 415.7
    # Newton alone on the same LP stalls and is refused with a typed error
    with pytest.raises(LPSolverError) as err:
        solve_lp(*args, forward="newton", equilibrate=0, max_eps_steps=2)
    assert err.value.kind == "not_converged"


def test_handoff_keeps_the_active_set_backward():
    """An LP Newton cannot finish (max_iter=1) goes to HiGHS; value and gradients equal
    forward='highs' on the same LP."""
    lp = constructed_lp(np.random.default_rng(3), 30, 12, 2)
    grads = []
    for kw in (dict(max_iter=1, max_eps_steps=0), dict(forward="highs")):
        T = to_torch(lp, requires_grad=True)
        sol = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"], **kw)
        (sol.z * torch.linspace(1, 2, 12, dtype=D)).sum().backward()
        grads.append((sol.stats["forward"], sol.z.detach(), T["A"].grad, T["b"].grad))
    assert grads[0][0] == "highs"
    for a, b in zip(grads[0][1:], grads[1][1:]):
        assert torch.allclose(a, b, atol=1e-9)


def test_mixed_batch_newton_and_highs():
    """In a batch, only the LPs Newton leaves unsolved go to HiGHS."""
    rng = np.random.default_rng(0)
    lp = constructed_lp(rng, 20, 8)
    T = to_torch(lp)
    # LP 1: b far inside (z* = 0 for c >= 0 is found at once); LP 0: the constructed vertex
    c = torch.stack([T["c"], T["c"].abs() + 1.0])
    b = torch.stack([T["b"], T["b"].abs() + 1.0])
    sol = solve_lp(c, T["A"], b, max_iter=3, max_eps_steps=0)
    assert sol.stats["forward"] in ("newton+highs", "highs")
    res, _ = highs(lp)
    assert abs(float(sol.value[0]) - res.fun) <= 1e-8 * max(1, abs(res.fun))
    assert float(sol.value[1]) == pytest.approx(0.0, abs=1e-9)


def test_auto_routes():
    rng = np.random.default_rng(1)
    T = to_torch(constructed_lp(rng, 20, 8, 1))
    small = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
    assert small.stats["forward"] == "newton" and small.stats["equilibrated"]
    # separable (A = -I as a DiagonalOperator): Newton, never HiGHS
    d = torch.randn(300, dtype=D)
    sep = solve_lp(torch.ones(300, dtype=D), DiagonalOperator(-torch.ones(300, dtype=D)), d)
    assert sep.stats["forward"] == "newton"
    # ... also as a torch.sparse -I with n >= 256 (one nonzero per row: the diagonal path)
    eye = torch.sparse_coo_tensor(torch.arange(300).repeat(2, 1), -torch.ones(300, dtype=D))
    sep_csr = solve_lp(torch.ones(300, dtype=D), eye.to_sparse_csr(), d)
    assert sep_csr.stats["forward"] == "newton" and sep_csr.stats["linear_solver"] == "diagonal"
    assert torch.allclose(sep_csr.z, sep.z, atol=1e-9)
    # a large general LP (n >= 256) goes straight to HiGHS
    n, m = 300, 200
    A = torch.tensor(rng.standard_normal((m, n)), dtype=D)
    big_A = torch.cat([A, torch.eye(n, dtype=D)]).to_sparse()
    b = torch.cat([A @ torch.full((n,), 0.5, dtype=D) + 1.0, torch.ones(n, dtype=D)])
    big = solve_lp(torch.tensor(rng.standard_normal(n), dtype=D), big_A, b)
    assert big.stats["forward"] == "highs"
    # the unrolled backward has Newton iterations to unroll: never HiGHS
    unr = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"], backward="unrolled")
    assert unr.stats["forward"] == "newton"


@pytest.mark.parametrize("forward", ["auto", "newton", "highs"])
def test_infeasible_instance_in_a_batch_is_named_in_every_mode(forward):
    t = lambda a: torch.tensor(a, dtype=D)   # noqa: E731
    A = t([[1.0, 1.0], [-1.0, -1.0]])
    b = t([[2.0, -1.0], [1.0, -2.0], [3.0, 0.0]])       # LP 1: x + y <= 1 and >= 2
    with pytest.raises(LPSolverError) as err:
        solve_lp(t([[1.0, 1.0]] * 3), A, b, forward=forward)
    assert err.value.kind == "infeasible" and err.value.instances == [1]


@pytest.mark.parametrize("forward", ["auto", "newton", "highs"])
def test_unbounded_with_equalities_in_every_mode(forward):
    t = lambda a: torch.tensor(a, dtype=D)   # noqa: E731
    with pytest.raises(LPSolverError) as err:      # x - y = 1, min -x: unbounded
        solve_lp(t([-1.0, 0.0]), t([[0.0, 0.0]]), t([1.0]), t([[1.0, -1.0]]), t([1.0]),
                 forward=forward)
    assert err.value.kind == "unbounded"


def test_highs_time_limit_raises_typed_error():
    """forward='highs' passes the time left to HiGHS; past it: LPTimeLimitError, not a hang."""
    rng = np.random.default_rng(0)
    n, m = 3000, 3000
    A = torch.tensor(rng.standard_normal((m, n)) * (rng.random((m, n)) < 0.01), dtype=D)
    b = A @ torch.full((n,), 0.5, dtype=D) + 1.0
    c = torch.tensor(rng.standard_normal(n), dtype=D)
    box = torch.cat([A, torch.eye(n, dtype=D)]).to_sparse()
    with pytest.raises(LPTimeLimitError) as err:
        solve_lp(c, box, torch.cat([b, torch.ones(n, dtype=D)]), forward="highs",
                 max_seconds=1e-3)
    assert "max_seconds" in str(err.value) and err.value.kind == "time_limit"
