"""Gradients of ``solver.solve_lp``: gradcheck (float64), closed forms, active-set vs unrolled,
and dense / sparse / operator forms of the same LP."""
import numpy as np
import pytest
import torch

from lpmetrics.solver import (DiagonalOperator, HStackOperator, SparseOperator, VStackOperator,
                    solve_lp)
from tests.test_solver_oracle import constructed_lp, to_torch

NAMES = ("c", "A", "b", "A_eq", "b_eq")


def _args(lp):
    T = to_torch(lp)
    return [T[k].clone().requires_grad_() for k in NAMES]


@pytest.mark.parametrize("seed", range(3))
def test_gradcheck_active_set(seed):
    lp = constructed_lp(np.random.default_rng(seed), 7, 5, 1)
    args = _args(lp)
    f = lambda *a: solve_lp(*a, tol=1e-10).z  # noqa: E731
    assert torch.autograd.gradcheck(f, args, atol=1e-6, rtol=1e-5)


def test_gradcheck_batched_without_equalities():
    rng = np.random.default_rng(5)
    lps = [constructed_lp(rng, 6, 4) for _ in range(3)]
    c, A, b = (torch.tensor(np.stack([lp[k] for lp in lps]), requires_grad=True)
               for k in ("c", "A", "b"))
    f = lambda c, A, b: solve_lp(c, A, b, tol=1e-10).z  # noqa: E731
    assert torch.autograd.gradcheck(f, (c, A, b), atol=1e-6, rtol=1e-5)


def test_value_gradients_are_primal_and_dual():
    """d(c^T z*)/dc = z*, d(c^T z*)/db = -u, d(c^T z*)/db_eq = -w (LP sensitivity)."""
    lp = constructed_lp(np.random.default_rng(9), 30, 10, 2)
    c, A, b, Ae, be = _args(lp)
    sol = solve_lp(c, A, b, Ae, be)
    sol.value.backward()
    assert torch.allclose(c.grad, sol.z.detach(), atol=1e-9)
    assert torch.allclose(b.grad, -sol.dual, atol=1e-8)
    assert torch.allclose(be.grad, -sol.dual_eq, atol=1e-8)
    # and d/dA = u z^T for the inequality rows
    assert torch.allclose(A.grad, sol.dual[:, None] * sol.z.detach()[None, :], atol=1e-8)


def _grads(lp, backward, weight, **kw):
    args = _args(lp)
    sol = solve_lp(*args, backward=backward, **kw)
    (sol.z * weight).sum().backward()
    return sol, torch.cat([(a.grad if a.grad is not None else torch.zeros_like(a)).flatten()
                           for a in args])


@pytest.mark.parametrize("seed", range(6))
def test_active_set_and_unrolled_gradients_agree(seed):
    rng = np.random.default_rng(100 + seed)
    lp = constructed_lp(rng, int(rng.integers(10, 80)), int(rng.integers(3, 20)), 1)
    w = torch.tensor(rng.standard_normal(len(lp["c"])))
    s1, g1 = _grads(lp, "active_set", w)
    s2, g2 = _grads(lp, "unrolled", w)
    assert torch.allclose(s1.z, s2.z, atol=1e-10)            # same forward value
    assert torch.nn.functional.cosine_similarity(g1, g2, dim=0) >= 0.999


def test_dense_sparse_operator_forms_agree():
    lp = constructed_lp(np.random.default_rng(21), 24, 8, 1)
    w = torch.tensor(np.random.default_rng(0).standard_normal(8))
    A_np = lp["A"] * (np.random.default_rng(1).random(lp["A"].shape) < 0.6)  # real zeros
    lp = dict(lp, A=A_np, b=A_np @ lp["z"] + (lp["b"] - lp["A"] @ lp["z"]))
    T = to_torch(lp)
    A_dense = T["A"]

    def run(make_A):
        c, b = T["c"].clone().requires_grad_(), T["b"].clone().requires_grad_()
        leaf = A_dense.clone().requires_grad_()
        sol = solve_lp(c, make_A(leaf), b, T["A_eq"], T["b_eq"])
        (sol.z * w).sum().backward()
        return sol.z.detach(), leaf.grad, b.grad

    ref = run(lambda A: A)
    forms = {
        "coo": lambda A: A.to_sparse(),
        "csr": lambda A: A.to_sparse_csr(),
        "operator": lambda A: SparseOperator.from_torch(A.to_sparse()),
        "vstack": lambda A: VStackOperator([A[:10], A[10:].to_sparse()]),
        "hstack": lambda A: HStackOperator([A[:, :3], A[:, 3:].to_sparse()]),
        "cg": lambda A: A,
    }
    mask = torch.tensor(A_np != 0)
    for name, make in forms.items():
        kw = {"linear_solver": "cg"} if name == "cg" else {}
        c, b = T["c"].clone().requires_grad_(), T["b"].clone().requires_grad_()
        leaf = A_dense.clone().requires_grad_()
        sol = solve_lp(c, make(leaf), b, T["A_eq"], T["b_eq"], **kw)
        (sol.z * w).sum().backward()
        assert torch.allclose(sol.z.detach(), ref[0], atol=1e-9), name
        assert torch.allclose(b.grad, ref[2], atol=1e-8), name
        gA = leaf.grad.to_dense() if leaf.grad.is_sparse else leaf.grad
        # sparse forms carry gradients on the stored entries only
        expect = ref[1] if name in ("cg",) else torch.where(mask, ref[1], torch.zeros_like(ref[1]))
        assert torch.allclose(torch.where(mask, gA, torch.zeros_like(gA)),
                              torch.where(mask, expect, torch.zeros_like(expect)), atol=1e-8), name


def test_diagonal_operator_gradient_matches_dense():
    """min 1^T z s.t. -diag(s) z <= d - 1: gradients reach the differentiable diagonal."""
    rng = np.random.default_rng(4)
    s0 = torch.tensor(rng.uniform(0.5, 2.0, 12))
    d = torch.tensor(rng.standard_normal(12))
    out = []
    for dense in (False, True):
        s = s0.clone().requires_grad_()
        A = torch.diag(-s) if dense else DiagonalOperator(-s)
        sol = solve_lp(torch.ones(12, dtype=torch.float64), A, d - 1.0)
        sol.z.sum().backward()
        out.append((sol.z.detach(), s.grad))
    assert torch.allclose(out[0][0], out[1][0], atol=1e-10)
    assert torch.allclose(out[0][1], out[1][1], atol=1e-8)
    # closed form: z = relu((1 - d) / s), dz/ds = -(1 - d)/s^2 where active
    zc = torch.relu((1 - d) / s0)
    assert torch.allclose(out[0][0], zc, atol=1e-10)
    assert torch.allclose(out[0][1], torch.where(zc > 0, -(1 - d) / s0 ** 2, 0 * d), atol=1e-8)


def test_unrolled_through_conjugate_gradients_and_sparse_values():
    """The unrolled backward also runs through PCG Newton solves of a sparse operator."""
    rng = np.random.default_rng(31)
    lp = constructed_lp(rng, 40, 8)
    w = torch.tensor(rng.standard_normal(8))
    grads = []
    for backward in ("active_set", "unrolled"):
        T = to_torch(lp)
        vals = T["A"].to_sparse().coalesce()
        values = vals.values().clone().requires_grad_()
        b = T["b"].clone().requires_grad_()
        op = SparseOperator(vals.indices(), values, tuple(T["A"].shape))
        sol = solve_lp(T["c"], op, b, backward=backward, linear_solver="cg")
        assert sol.stats["linear_solver"] == "cg"
        (sol.z * w).sum().backward()
        grads.append(torch.cat([values.grad, b.grad]))
    assert torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0) >= 0.999
