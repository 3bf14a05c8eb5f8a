"""Sparse active-set recovery (issue 20 item 2, :mod:`solver.active_lu`): for a ``torch.sparse``
LP on the CPU whose active system is square, the vertex and the backward use one sparse LU of
the active rows -- never the (here dense) normal equations nor any dense ``[m, n]`` matrix.

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

from solver import SparseOperator, solve_lp
from solver.linsolve import NewtonSystem
from solver.operators import SparseOperator as _SparseOp

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
    assert sol.stats["active_factor"] == "active_lu"
    assert abs(float(sol.value) - res.fun) <= 1e-9 * (1 + abs(res.fun))
    assert np.allclose(sol.z.numpy(), res.x, atol=1e-7)


def test_float32():
    c, A, b = budget_lp(11)
    res = highs(c, A, b)
    f = torch.float32
    sol = solve_lp(torch.tensor(c, dtype=f), csr(A, f), torch.tensor(b, dtype=f),
                   forward="highs")
    assert sol.z.dtype == f and sol.stats["active_factor"] == "active_lu"
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
    assert sol.stats["active_factor"] == "active_lu"

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
    assert sol.stats["active_factor"] == "active_lu"
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
    assert sol.stats["active_factor"] != "active_lu" and sol.stats["converged"]
    assert abs(float(sol.value) - res.fun) <= 1e-9 * (1 + abs(res.fun))
