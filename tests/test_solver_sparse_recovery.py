"""Sparse active-set recovery (:mod:`solver.backends.active_lu` for Newton and float32,
:mod:`solver.backends.square_active` for HiGHS's float64 vertex): for a ``torch.sparse`` LP on the CPU
whose active system is square, the vertex and the backward use one sparse LU of the active rows
-- never the (here dense) normal equations nor any dense ``[m, n]`` matrix.

The LPs carry a budget row ``1^T z <= s`` (it makes ``A^T W A`` dense, the case the LU is for)
and the box ``z <= 3``; oracle: HiGHS.  A degenerate vertex (a duplicated active row: ``n + 1``
active rows) must fall back to the least-squares path and still be right.
"""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.optimize import linprog

from lpmetrics.solver import SparseOperator, solve_lp
from lpmetrics.solver.linsolve import NewtonSystem
from lpmetrics.solver.operators import SparseOperator as _SparseOp

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def budget_lp(seed, n=40, m0=40, density=0.1):
    g = np.random.default_rng(seed)
    A0 = sp.random(m0 - 1, n, density=density, random_state=g, data_rvs=g.standard_normal)
    A0 = sp.vstack([A0, sp.csr_matrix(np.ones((1, n)))])
    z0 = g.uniform(0, 1, n)
    b0 = A0 @ z0 + g.uniform(0, 1, m0)
    A = sp.vstack([A0, sp.identity(n)], format="csr")
    return g.standard_normal(n), A, np.concatenate([b0, np.full(n, 3.0)])


def csr(A, dtype=torch.float64):
    return torch.sparse_csr_tensor(torch.tensor(A.indptr), torch.tensor(A.indices),
                                   torch.tensor(A.data, dtype=dtype), A.shape)


# the K_T factor each forward uses on these LPs: HiGHS's float64 vertex is certified on the
# host (solver.backends.square_active, bound rows eliminated), Newton's through NewtonSystem
FACTOR = {"highs": "sparse_lu", "newton": "active_lu"}


def highs(c, A, b):
    res = linprog(c, A_ub=A, b_ub=b, bounds=(0, None), method="highs")
    assert res.status == 0
    return res


@pytest.mark.parametrize("forward", ["highs", "newton"])
@pytest.mark.parametrize("seed", range(6))
def test_matches_highs_through_active_lu(seed, forward):
    c, A, b = budget_lp(seed)
    res = highs(c, A, b)
    sol = solve_lp(torch.tensor(c), csr(A), torch.tensor(b), forward=forward)
    assert sol.stats["converged"]
    assert sol.stats["active_factor"] == FACTOR[forward]
    assert abs(float(sol.value) - res.fun) <= 1e-9 * (1 + abs(res.fun))
    assert np.allclose(sol.z.numpy(), res.x, atol=1e-7)


def test_float32():
    c, A, b = budget_lp(11)
    res = highs(c, A, b)
    f = torch.float32
    sol = solve_lp(torch.tensor(c, dtype=f), csr(A, f), torch.tensor(b, dtype=f),
                   forward="highs")
    # HiGHS's vertex is recovered in float64 (compute_dtype's default for forward="highs")
    assert sol.z.dtype == f and sol.stats["active_factor"] == "sparse_lu"
    assert abs(float(sol.value) - res.fun) <= 1e-5 * (1 + abs(res.fun))


@pytest.mark.parametrize("seed,forward", [(0, "highs"), (1, "highs"), (0, "newton")])
def test_gradcheck_b_and_values(seed, forward):
    c, A, b = budget_lp(seed, n=20, m0=20, density=0.15)
    coo = A.tocoo()
    idx = torch.tensor(np.stack([coo.row, coo.col]), dtype=torch.long)
    vals = torch.tensor(coo.data, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)
    ct = torch.tensor(c)
    sol = solve_lp(ct, SparseOperator(idx, vals, A.shape), bt, forward=forward, tol=1e-10)
    assert sol.stats["active_factor"] == FACTOR[forward]

    def f(v, bb):
        return solve_lp(ct, SparseOperator(idx, v, A.shape), bb, forward=forward,
                        tol=1e-10).z
    # Newton re-solves from scratch per perturbation: b only there (the fast suite)
    args = (vals, bt) if forward == "highs" else (vals.detach(), bt)
    assert torch.autograd.gradcheck(f, args, atol=1e-6, rtol=1e-5)


def test_no_dense_matrix_formed(monkeypatch):
    c, A, b = budget_lp(5, n=300, m0=301, density=5e-3)
    res = highs(c, A, b)

    def refuse(*a, **k):
        raise AssertionError("densified on the sparse path")
    monkeypatch.setattr(torch.Tensor, "to_dense", refuse)
    monkeypatch.setattr(_SparseOp, "dense", refuse)
    monkeypatch.setattr(_SparseOp, "gram", refuse)
    monkeypatch.setattr(NewtonSystem, "dense", refuse)
    bt = torch.tensor(b, requires_grad=True)
    sol = solve_lp(torch.tensor(c), csr(A), bt, forward="highs")
    w = torch.tensor(np.random.default_rng(0).standard_normal(len(c)))
    (sol.z * w).sum().backward()
    assert sol.stats["active_factor"] == "sparse_lu"
    assert abs(float(sol.value) - res.fun) <= 1e-9 * (1 + abs(res.fun))
    assert bt.grad is not None and torch.isfinite(bt.grad).all()


def test_degenerate_vertex_falls_back_to_least_squares():
    c, A, b = budget_lp(2)
    res = highs(c, A, b)
    slack = b - A @ res.x
    tight = int(np.flatnonzero(slack < 1e-9)[0])       # duplicate an active row: n + 1 rows
    A2 = sp.vstack([A, A[tight]], format="csr")
    b2 = np.append(b, b[tight])
    sol = solve_lp(torch.tensor(c), csr(A2), torch.tensor(b2), forward="highs")
    assert sol.stats["active_factor"] not in ("active_lu", "sparse_lu")
    assert sol.stats["converged"]
    assert abs(float(sol.value) - res.fun) <= 1e-9 * (1 + abs(res.fun))


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_host_recovery_equals_the_torch_recovery(seed, batched, monkeypatch):
    """The host path (bound rows eliminated, SuperLU of ``R``) against the torch path (sparse
    LU of the whole ``M`` inside NewtonSystem) on the same HiGHS vertices: the same z, duals
    and gradients w.r.t. ``b`` and the sparse values, to roundoff.  ``batched``: two LPs with
    one pattern each (3-D indices), the values' gradient per LP; otherwise one ``A`` shared by
    two right-hand sides, its gradient summed over the batch."""
    from lpmetrics.solver.backends import square_active
    c, A, b = budget_lp(seed, n=30, m0=30, density=0.12)
    g = np.random.default_rng(100 + seed)
    coo = A.tocoo()
    if batched:
        idx = np.concatenate([np.stack([np.full(coo.nnz, k), coo.row, coo.col])
                              for k in (0, 1)], 1)
        vals0 = np.concatenate([coo.data, coo.data * (1 + 0.01 * g.standard_normal(coo.nnz))])
    else:
        idx, vals0 = np.stack([coo.row, coo.col]), coo.data
    b2 = np.stack([b, b + 0.01 * g.uniform(0, 1, b.size)])
    w = torch.tensor(g.standard_normal((2, len(c))))

    def run():
        vals = torch.tensor(vals0, requires_grad=True)
        bt = torch.tensor(b2, requires_grad=True)
        op = SparseOperator(torch.tensor(idx), vals, A.shape, 2 if batched else None)
        sol = solve_lp(torch.tensor(np.stack([c, c])), op, bt, forward="highs")
        (sol.z * w).sum().backward()
        return sol, vals.grad, bt.grad

    host, vg, bg = run()
    with monkeypatch.context() as mp:       # the host recovery off: solver.recover instead
        mp.setattr(square_active, "eligible", lambda prob: None)
        ref, vg_ref, bg_ref = run()
    assert host.stats["active_factor"] == "sparse_lu"
    assert ref.stats["active_factor"] == "active_lu"
    assert torch.equal(host.active, ref.active)
    assert torch.equal(host.active_bounds, ref.active_bounds)
    for a, r in [(host.z, ref.z), (host.dual, ref.dual), (host.dual_bounds, ref.dual_bounds),
                 (vg, vg_ref), (bg, bg_ref)]:
        assert torch.allclose(a, r, rtol=1e-9, atol=1e-10)


def test_host_recovery_all_variables_at_bounds():
    """``z* = 0`` (every bound active, no active row): ``M = -I``, nothing to factorise."""
    A = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]))
    bt = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    sol = solve_lp(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), csr(A), bt,
                   forward="highs")
    assert sol.stats["active_factor"] == "sparse_lu"
    assert torch.equal(sol.z, torch.zeros(3, dtype=torch.float64))
    assert torch.allclose(sol.dual_bounds, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    sol.z.sum().backward()
    assert torch.equal(bt.grad, torch.zeros(2, dtype=torch.float64))
