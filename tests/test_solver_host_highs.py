"""The host route for one sparse CPU LP with ``forward="highs"`` (:mod:`solver.backends.host_highs`)
gives what the general route gives: every field of the
:class:`solver.LPSolution`, its statistics (but the time) and per-LP statistics, and every
gradient, bit for bit; it is taken where it should be (the general route's problem builder is
never called), left where it should be, hands a vertex that does not certify to the general
route without a second HiGHS solve, and raises the typed errors.  Oracles: HiGHS through
``scipy.optimize.linprog`` for the value and vertex, ``gradcheck`` for the gradients, and
scipy's own ``splu`` / ``@`` for the pieces that bypass scipy's matrix objects.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.optimize import linprog
from scipy.sparse.linalg import splu

import lpmetrics.solver.solve as solve_mod
from lpmetrics.solver import LPInputError, LPSolverError, solve_lp
from lpmetrics.solver.backends import highs, host_highs
from lpmetrics.solver.backends.active_lu import _diagonal, lu_of_arrays, nonsingular_lu
from lpmetrics.solver.backends.scipy_ops import HostCSR, csr_matvec
from tests.test_solver_host_guess import _both as _both_routes
from tests.test_solver_host_guess import _compare, _same, _spy_general
from tests.test_solver_sparse_recovery import budget_lp, csr

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
f64 = torch.float64


def _both(monkeypatch, make, calls=None):
    return _both_routes(monkeypatch, make, calls, route=host_highs)


def _with_equalities(seed, n, m0, density, p):
    """:func:`budget_lp` with ``p`` sparse equality rows through its planted point."""
    c, A, b = budget_lp(seed, n=n, m0=m0, density=density)
    if not p:
        return c, A, b, None, None
    g = np.random.default_rng(1000 + seed)
    E = sp.random(p, n, density=max(density, 3 / n), random_state=g,
                  data_rvs=g.standard_normal, format="csr")
    res = linprog(np.zeros(n), A_ub=A, b_ub=b, bounds=(0, None), method="highs")
    return c, A, b, E, E @ res.x          # feasible: HiGHS's point of the inequalities


def _lp_case(seed):
    n = (20, 40, 90, 300)[seed % 4]
    return _with_equalities(seed, n, n, min(0.15, 6 / n), seed % 3)


@pytest.mark.parametrize("forward", ["highs", "auto"])
@pytest.mark.parametrize("seed", range(16))
def test_equals_the_general_route(monkeypatch, seed, forward):
    c, A, b, E, be = _lp_case(seed)
    if forward == "auto" and len(c) < 256:
        forward = "highs"                      # (auto runs Newton on a small LP)

    def make():
        ct, bt = torch.tensor(c, requires_grad=True), torch.tensor(b, requires_grad=True)
        bet = None if E is None else torch.tensor(be, requires_grad=True)
        sol = solve_lp(ct, csr(A), bt, None if E is None else csr(E), bet, forward=forward)
        w = torch.randn(len(c), generator=torch.Generator().manual_seed(seed), dtype=f64)
        (sol.value + (w * sol.z).sum() + sol.dual.sum() + (
            0 if E is None else sol.dual_eq.sum())).backward()
        return sol, [t.grad for t in (ct, bt, bet) if t is not None]
    calls = []
    host, general = _both(monkeypatch, make, calls)
    # the host route certifies exactly the vertices the general route's host certificate
    # does (seed 4's does not: both hand it to the torch recovery)
    certified = general[0].stats["active_factor"] == "sparse_lu"
    assert calls == [0 if certified else 1]
    assert certified or seed == 4
    assert host[0].stats["forward"] == "highs"
    _compare(host, general)
    res = linprog(c, A_ub=A, b_ub=b, A_eq=E, b_eq=be, bounds=(0, None), method="highs")
    assert abs(float(host[0].value) - res.fun) <= 1e-9 * (1 + abs(res.fun))


@pytest.mark.parametrize("seed", range(3))
def test_gradcheck_through_the_host_route(monkeypatch, seed):
    c, A, b, E, be = _with_equalities(seed, 20, 20, 0.15, 1)
    calls = _spy_general(monkeypatch)

    def f(cc, bb, bbe):
        sol = solve_lp(cc, csr(A), bb, csr(E), bbe, forward="highs", tol=1e-10)
        return sol.z, sol.value
    args = [torch.tensor(a, requires_grad=True) for a in (c, b, be)]
    assert torch.autograd.gradcheck(f, args, atol=1e-6, rtol=1e-5)
    assert not calls, "gradcheck ran the general route"


def test_a_degenerate_vertex_goes_to_the_general_route_with_highs_result(monkeypatch):
    c, A, b = budget_lp(2)
    res = linprog(c, A_ub=A, b_ub=b, bounds=(0, None), method="highs")
    tight = int(np.flatnonzero(b - A @ res.x < 1e-9)[0])   # a duplicated active row: n + 1
    A2, b2 = sp.vstack([A, A[tight]], format="csr"), np.append(b, b[tight])
    solves, real = [], highs._highs_direct

    def counted(*args):
        solves.append(1)
        return real(*args)
    monkeypatch.setattr(highs, "_highs_direct", counted)

    def make():
        bt = torch.tensor(b2, requires_grad=True)
        sol = solve_lp(torch.tensor(c), csr(A2), bt, forward="highs")
        sol.z.sum().backward()
        return sol, [bt.grad]
    calls = []
    host, general = _both(monkeypatch, make, calls)
    assert calls == [1] and len(solves) == 2, "HiGHS ran twice on the host route's call"
    assert host[0].stats["active_factor"] not in ("sparse_lu", "active_lu")
    _compare(host, general)


def _calls_general(monkeypatch, *args, **kwargs):
    count = _spy_general(monkeypatch)
    solve_lp(*args, **kwargs)
    return len(count)


def test_what_stays_with_the_general_route(monkeypatch):
    c, A, b = budget_lp(4)
    ct, bt, At = torch.tensor(c), torch.tensor(b), csr(A)
    assert _calls_general(monkeypatch, ct, At, bt, forward="highs") == 0
    for args, kw in [
        ((ct, At.to_sparse_coo(), bt), {}),                      # COO
        ((ct, At.to_dense(), bt), {}),                           # dense
        ((ct.float(), csr(A, torch.float32), bt.float()), {}),   # float32
        ((ct.expand(2, -1), At, bt), {}),                        # a batch
        ((ct, csr(A).requires_grad_(True), bt), {}),             # grad w.r.t. A's values
        ((ct, At, bt), {"linear_solver": "cholesky"}),
        ((ct, At, bt), {"compute_dtype": torch.float32}),
    ]:
        assert _calls_general(monkeypatch, *args, forward="highs", **kw) == 1, (args, kw)
    # forward="auto": n = 40 < 256 runs Newton; so does a separable A (one nonzero per row)
    assert _calls_general(monkeypatch, ct, At, bt) == 1
    n = 300
    eye = csr(-sp.identity(n, format="csr"))
    assert _calls_general(monkeypatch, torch.ones(n, dtype=f64), eye,      # (built twice: the
                          torch.full((n,), 0.5, dtype=f64)) >= 1              # route back to Newton)


def test_unsorted_columns_take_the_general_route(monkeypatch):
    A = torch.sparse_csr_tensor(torch.tensor([0, 2, 4]), torch.tensor([1, 0, 0, 1]),
                                torch.tensor([1.0, 2.0, 1.0, 1.0], dtype=f64), (2, 2))
    c, b = torch.tensor([-1.0, -1.0], dtype=f64), torch.tensor([4.0, 3.0], dtype=f64)
    assert host_highs._csr(A, 2) is None
    assert _calls_general(monkeypatch, c, A, b, forward="highs") == 1
    sol = solve_lp(c, A, b, forward="highs")
    res = linprog(c.numpy(), A_ub=A.to_dense().numpy(), b_ub=b.numpy(), method="highs")
    assert abs(float(sol.value) - res.fun) <= 1e-9


def test_bad_input_gets_the_general_routes_errors():
    c, A, b = budget_lp(1)
    bad = torch.tensor(b)
    bad[3] = float("nan")
    with pytest.raises(LPInputError, match="b"):
        solve_lp(torch.tensor(c), csr(A), bad, forward="highs")
    with pytest.raises(LPInputError):
        solve_lp(torch.tensor(c), csr(A), torch.tensor(b[:-1]), forward="highs")


def test_infeasible_and_unbounded_raise_typed_errors(monkeypatch):
    A = csr(sp.csr_matrix(np.array([[1.0, 1.0], [-1.0, -1.0]])))
    c = torch.tensor([1.0, 1.0], dtype=f64)
    calls = _spy_general(monkeypatch)
    with pytest.raises(LPSolverError) as err:           # z1 + z2 <= 1 and >= 2
        solve_lp(c, A, torch.tensor([1.0, -2.0], dtype=f64), forward="highs")
    assert err.value.kind == "infeasible" and err.value.instances == [0]
    A = csr(sp.csr_matrix(np.array([[1.0, -1.0]])))
    with pytest.raises(LPSolverError) as err:           # min -z1 with z1 - z2 <= 1
        solve_lp(torch.tensor([-1.0, 0.0], dtype=f64), A, torch.tensor([1.0], dtype=f64),
                 forward="highs")
    assert err.value.kind == "unbounded"
    assert not calls, "the errors came from the general route"


@pytest.mark.parametrize("seed", range(20))
def test_superlu_pivots_and_solves_equal_splu(seed):
    g = np.random.default_rng(seed)
    n = int(g.integers(2, 60))
    M = (sp.random(n, n, density=0.1, random_state=g) + sp.diags(g.uniform(0.5, 2, n))).tocsc()
    lu = lu_of_arrays(M.data, M.indices, M.indptr, n)
    ref = splu(M)
    r = g.standard_normal(n)
    assert np.array_equal(lu.solve(r), ref.solve(r))
    assert np.array_equal(lu.solve(r, trans="T"), ref.solve(r, trans="T"))
    U = ref.U.tocsc()
    assert np.array_equal(_diagonal(U.data, U.indices, U.indptr, n), np.abs(U.diagonal()))
    assert nonsingular_lu(M.copy()) is not None


def test_diagonal_of_any_csc_layout():
    g = np.random.default_rng(0)
    R = sp.random(30, 30, density=0.2, random_state=g, format="csc")
    M = sp.csc_matrix(R - sp.diags(R.diagonal()) + sp.diags(np.arange(1, 31.0)))
    M.sum_duplicates()          # sorted row indices: the diagonal is not last in most columns
    pad = (np.append(M.data, [7.0, 7.0]), np.append(M.indices, [0, 0]))  # SuperLU-like spare room
    for data, indices in ((M.data, M.indices), pad):
        assert np.array_equal(_diagonal(data, indices, M.indptr, 30), np.arange(1, 31.0))


def test_singular_matrices_are_refused():
    exact = sp.csc_matrix(np.array([[1.0, 2.0], [2.0, 4.0]]))
    near = sp.csc_matrix(np.array([[1.0, 1.0], [1.0, 1.0 + 1e-13]]))
    for M in (exact, near):
        assert lu_of_arrays(M.data, M.indices, M.indptr, 2) is None
        assert nonsingular_lu(M.copy()) is None


@pytest.mark.parametrize("seed", range(5))
def test_csr_matvec_is_scipys_product(seed):
    g = np.random.default_rng(seed)
    A = sp.random(40, 30, density=0.2, random_state=g, format="csr")
    x = g.standard_normal(30)
    T = torch.sparse_csr_tensor(torch.tensor(A.indptr, dtype=torch.long),
                                torch.tensor(A.indices, dtype=torch.long),
                                torch.tensor(A.data), A.shape)
    host = HostCSR(*(t.numpy() for t in (T.crow_indices(), T.col_indices(), T.values())),
                   A.shape)
    assert host.indices.dtype == np.int64 and A.indices.dtype == np.int32
    for X in (A, host):
        _same(torch.from_numpy(csr_matvec(X, x)), torch.from_numpy(A @ x))
    assert np.allclose(csr_matvec(A.toarray(), x), A @ x, rtol=1e-14, atol=1e-14)


def test_the_matrix_memo_is_held_weakly_and_notices_changes(monkeypatch):
    import gc
    import io
    c, A, b = budget_lp(6)
    At, ct = csr(A), torch.tensor(c)
    first = solve_lp(ct, At, torch.tensor(b), forward="highs")
    again = solve_lp(ct, At, torch.tensor(b), forward="highs")        # from the memo
    assert At in host_highs._CSR_MEMO and not At.__dict__
    _same(first.z, again.z)
    buf = io.BytesIO()
    torch.save(At, buf)                       # nothing added to the tensor: weights_only loads
    buf.seek(0)
    assert torch.equal(torch.load(buf).to_dense(), At.to_dense())
    # values changed in place: the next solve reads them (and equals a fresh tensor's)
    At.values().mul_(2.0)
    changed = solve_lp(ct, At, torch.tensor(b), forward="highs")
    _same(changed.z, solve_lp(ct, csr(A * 2.0), torch.tensor(b), forward="highs").z)
    # a pattern that becomes unsorted in place is refused, not served from the memo
    idx = At.col_indices()
    idx[[0, 1]] = idx[[1, 0]]
    assert host_highs._csr(At, len(c)) is None
    del At, idx
    gc.collect()
    assert len(host_highs._CSR_MEMO) == 0 and len(host_highs._METHOD_MEMO) == 0


def _zero_row_lp(seed):
    """:func:`budget_lp` with an empty inequality row that is tight (``0 <= 0``) and equality
    rows ``0 = 0`` (seeds 0, 1: that row alone; 2, 3: after a sparse equality row through a
    point of the polytope): ``n + 2`` tight rows, two of them void (the degenerate vertices
    of ``results/solver``'s random family, whose empty equality rows are tight)."""
    c, A, b = budget_lp(seed)
    n = len(c)
    E, be = sp.csr_matrix((1, n)), np.zeros(1)
    if seed >= 2:           # the midpoint of two vertices: E z = b_eq cuts through the inside
        g = np.random.default_rng(seed)
        mid = sum(linprog(g.standard_normal(n), A_ub=A, b_ub=b, bounds=(0, None),
                          method="highs").x for _ in range(2)) / 2
        E1 = sp.random(1, n, density=0.2, random_state=g, format="csr")
        E, be = sp.vstack([E1, E], format="csr"), np.append(E1 @ mid, 0.0)
    A = sp.vstack([A, sp.csr_matrix((1, n))], format="csr")
    return c, A, np.append(b, 0.0), E, be


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_void_rows_stay_out_of_the_square_system(monkeypatch, seed, dense):
    from lpmetrics.solver.backends import square_active
    c, A, b, E, be = _zero_row_lp(seed)
    mat = (lambda X: torch.tensor(X.toarray())) if dense else csr

    def run():
        ct, bt, bet = (torch.tensor(a, requires_grad=True) for a in (c, b, be))
        sol = solve_lp(ct, mat(A), bt, mat(E), bet, forward="highs")
        w = torch.randn(len(c), generator=torch.Generator().manual_seed(seed), dtype=f64)
        (sol.value + (w * sol.z).sum()).backward()
        return sol, ct.grad, bt.grad, bet.grad
    host = run()
    with monkeypatch.context() as mp:          # the torch recovery: pseudo-inverse on T
        mp.setattr(square_active, "eligible", lambda prob: None)
        mp.setattr(host_highs, "ENABLED", False)
        ref = run()
    assert host[0].stats["active_factor"] == ("dense_lu" if dense else "sparse_lu")
    assert ref[0].stats["active_factor"] not in ("dense_lu", "sparse_lu")
    assert bool(host[0].active[-1]) and float(host[0].dual[-1]) == 0.0
    assert float(host[0].dual_eq[-1]) == 0.0 and float(host[3][-1]) == 0.0
    for name in ("z", "dual", "dual_eq", "dual_bounds", "active", "active_bounds"):
        a, r = getattr(host[0], name), getattr(ref[0], name)
        assert torch.allclose(a.double(), r.double(), rtol=1e-9, atol=1e-10), name
    for a, r in zip(host[1:], ref[1:]):
        assert torch.allclose(a, r, rtol=1e-9, atol=1e-10)
    res = linprog(c, A_ub=A, b_ub=b, A_eq=E, b_eq=be, bounds=(0, None), method="highs")
    assert abs(float(host[0].value) - res.fun) <= 1e-9 * (1 + abs(res.fun))


@pytest.mark.parametrize("ptr,idx", [([0, 2, 4], [0, 10 ** 8, 1, 3]),   # a column past n
                                     ([1, 2, 4], [0, 1, 2, 3]),         # indptr not from 0
                                     ([0, 2, 6], [0, 1, 2, 3]),         # past the last entry
                                     ([0, 3, 2], [0, 1, 2, 3]),         # decreasing indptr
                                     ([0, 2, 4], [-1, 1, 2, 3])])       # a negative column
def test_malformed_csr_tensors_are_left_to_the_general_route(ptr, idx):
    """torch does not check a CSR tensor's invariants by default; HiGHS and scipy's kernels do
    not check bounds: the host route must never hand them such arrays (a crash, not an error)."""
    A = torch.sparse_csr_tensor(torch.tensor(ptr), torch.tensor(idx),
                                torch.ones(4, dtype=f64), (2, 4))
    assert host_highs._csr(A, 4) is None
    c, b = -torch.ones(4, dtype=f64), torch.tensor([1.0, 2.0], dtype=f64)
    for forward in ("highs", "newton"):       # and the general route names it
        with pytest.raises(LPInputError, match="CSR arrays"):
            solve_lp(c, A, b, forward=forward)


def test_coo_indices_outside_the_shape_are_named():
    A = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 4]]), torch.ones(2, dtype=f64),
                                (2, 4), check_invariants=False)
    with pytest.raises(LPInputError, match="COO indices"):
        solve_lp(-torch.ones(4, dtype=f64), A, torch.ones(2, dtype=f64), forward="highs")


def test_the_solver_choice_is_kept_per_equality_tensor(monkeypatch):
    """The choice is kept for the pair (A, A_eq), and another A_eq tensor -- here one whose
    dense rows make the Newton matrix dense, so the choice differs -- is counted again."""
    n = 300
    c, A, b, E, be = _with_equalities(0, n, n, 3 / n, 1)
    g = np.random.default_rng(7)
    x = linprog(np.zeros(n), A_ub=A, b_ub=b, A_eq=E, b_eq=be, bounds=(0, None),
                method="highs").x
    D = np.abs(g.standard_normal((20, n)))          # 20 dense rows: more than the low-rank cap
    At, ct, bt = csr(A), torch.tensor(c), torch.tensor(b)
    E1 = csr(E)
    E2 = csr(sp.vstack([E, sp.csr_matrix(D)], format="csr"))
    be1, be2 = torch.tensor(be), torch.tensor(np.concatenate([be, D @ x]))
    calls = []
    real = host_highs.auto_method
    monkeypatch.setattr(host_highs, "auto_method", lambda *a, **k: calls.append(1) or real(*a, **k))

    def method(*eq):
        return solve_lp(ct, At, bt, *eq, forward="highs").stats["linear_solver"]
    assert method(E1, be1) == "sparse" and len(calls) == 1
    assert method(E1, be1) == "sparse" and len(calls) == 1          # from the memo
    assert method(E2, be2) == "cholesky" and len(calls) == 2        # another A_eq: counted
    assert method(E1, be1) == "sparse" and len(calls) == 3
    assert method() == "sparse" and len(calls) == 4                 # no A_eq: counted
    assert method() == "sparse" and len(calls) == 4
    # a live reference, not an address: the same arrays (same key) in a new tensor right after
    # the memo holds (A, E1) are counted again
    assert method(E1, be1) == "sparse" and len(calls) == 5
    E3 = torch.sparse_csr_tensor(E1.crow_indices(), E1.col_indices(), E1.values(), E1.shape)
    assert method(E3, be1) == "sparse" and len(calls) == 6
