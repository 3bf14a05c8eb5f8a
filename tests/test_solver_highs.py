"""``solve_lp(..., forward="highs")``: HiGHS's forward with the active-set backward.

Checked against the Newton forward (value, z where the optimum is unique, dual where it is
unique, every gradient) and against HiGHS itself (``check_against_highs``) on the families of
``test_solver_oracle`` (nondegenerate, primal-/dual-degenerate, box, with equalities), on
sparse / diagonal / stacked operators and batches; gradcheck in float64; the failure paths.
"""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lpmetrics.solver import (DiagonalOperator, HStackOperator, LPInputError, LPLayer, LPSolverError,
                    SparseOperator, VStackOperator, solve_lp)
from lpmetrics.solver.backends.highs import check_call
from tests.test_solver_oracle import (check_against_highs, constructed_lp, highs, random_lp,
                                      to_torch)

NAMES = ("c", "A", "b", "A_eq", "b_eq")
D = torch.float64


def _solve_with_grads(lp, forward, weight, make_A=lambda A: A, **kw):
    """Solve, backprop ``weight . z`` and return (solution, grads of c, A, b, A_eq, b_eq)."""
    T = to_torch(lp)
    leaves = {k: None if T[k] is None else T[k].clone().requires_grad_() for k in NAMES}
    sol = solve_lp(leaves["c"], make_A(leaves["A"]), leaves["b"], leaves["A_eq"],
                   leaves["b_eq"], forward=forward, **kw)
    (sol.z * weight).sum().backward()
    grads = {k: None if v is None else (v.grad if v.grad is not None else torch.zeros_like(v))
             for k, v in leaves.items()}
    return sol, grads


def _nondegenerate(lp, res):
    """HiGHS's vertex is primal nondegenerate (exactly n tight rows + bounds + equalities,
    linearly independent): the dual is unique and the active set is the same for every
    forward.  At a degenerate vertex z* has no derivative; each forward returns the
    least-squares Jacobian of its own T (HiGHS: all tight rows; Newton: those tight within
    kappa of its penalty point), and the two T can differ."""
    n = len(lp["c"])
    tight_rows = lp["A"][res.ineqlin.residual <= 1e-9]
    tight_bounds = np.eye(n)[res.x <= 1e-9]
    blocks = [tight_rows, tight_bounds] + ([lp["A_eq"]] if lp["A_eq"] is not None else [])
    M = np.vstack(blocks)
    return M.shape[0] == n and np.linalg.matrix_rank(M) == n


@pytest.mark.parametrize("chunk", range(2))
def test_random_lps_match_newton_and_highs(chunk):
    """Every oracle family (4 kinds x 6, with equalities): value always, z where unique,
    active set, dual and gradients where the vertex is nondegenerate equal Newton's."""
    rng = np.random.default_rng(2000 + chunk)
    n_unique = n_dual = 0
    for i in range(24):
        lp, kind = random_lp(rng, i)
        w = torch.tensor(rng.standard_normal(len(lp["c"])))
        sh, gh = _solve_with_grads(lp, "highs", w)
        sn, gn = _solve_with_grads(lp, "newton", w)
        assert sh.stats["forward"] == "highs" and sn.stats["forward"] == "newton"
        assert sh.stats["converged"] and sh.stats["kkt_residual"] <= 1e-8
        unique = check_against_highs(lp, SimpleNamespace(value=sh.value.detach(), z=sh.z),
                                     rtol_obj=1e-9, ztol=1e-9)
        value, ref = float(sh.value.detach()), float(sn.value.detach())
        assert abs(value - ref) <= 1e-9 * (1 + abs(ref)), kind
        if not unique:
            continue
        n_unique += 1
        assert torch.allclose(sh.z, sn.z, atol=1e-9), kind
        if _nondegenerate(lp, highs(lp)[0]):
            n_dual += 1
            assert torch.equal(sh.active, sn.active), kind
            assert torch.equal(sh.active_bounds, sn.active_bounds), kind
            for k in NAMES:
                if gh[k] is not None:
                    assert torch.allclose(gh[k], gn[k], atol=1e-7), (kind, k)
            assert torch.allclose(sh.dual, sn.dual, atol=1e-8), kind
            if lp["A_eq"] is not None:
                assert torch.allclose(sh.dual_eq, sn.dual_eq, atol=1e-8), kind
    assert n_unique >= 10 and n_dual >= 5      # the z, gradient and dual checks ran


@pytest.mark.parametrize("seed", range(2))
def test_gradcheck(seed):
    lp = constructed_lp(np.random.default_rng(seed), 7, 5, 1)
    args = [t.clone().requires_grad_() for t in to_torch(lp).values()]
    f = lambda *a: solve_lp(*a, forward="highs", tol=1e-10).z  # noqa: E731
    assert torch.autograd.gradcheck(f, args, atol=1e-6, rtol=1e-5)


def test_gradcheck_batched_sparse_values():
    """A batch through a [B, m, n] torch.sparse A: gradients reach its stored values."""
    rng = np.random.default_rng(5)
    lps = [constructed_lp(rng, 6, 4) for _ in range(3)]
    c, A, b = (torch.tensor(np.stack([lp[k] for lp in lps])) for k in ("c", "A", "b"))
    idx = A.to_sparse().indices()
    vals = A.to_sparse().values().clone().requires_grad_()
    c, b = c.requires_grad_(), b.requires_grad_()

    def f(c, vals, b):
        return solve_lp(c, torch.sparse_coo_tensor(idx, vals, A.shape), b, forward="highs",
                        tol=1e-10).z

    assert torch.autograd.gradcheck(f, (c, vals, b), atol=1e-6, rtol=1e-5)


def test_value_gradients_are_primal_and_dual():
    """d(c^T z*)/dc = z*, d/db = -u, d/db_eq = -w, d/dA = u z*^T (LP sensitivity)."""
    lp = constructed_lp(np.random.default_rng(9), 30, 10, 2)
    T = to_torch(lp)
    c, A, b, Ae, be = (T[k].clone().requires_grad_() for k in NAMES)
    sol = solve_lp(c, A, b, Ae, be, forward="highs")
    sol.value.backward()
    assert np.abs(sol.z.detach().numpy() - lp["z"]).max() < 1e-12   # snapped onto the vertex
    assert torch.allclose(c.grad, sol.z.detach(), atol=1e-12)
    assert torch.allclose(b.grad, -sol.dual, atol=1e-9)
    assert torch.allclose(be.grad, -sol.dual_eq, atol=1e-9)
    assert torch.allclose(A.grad, sol.dual[:, None] * sol.z.detach()[None, :], atol=1e-9)


def _sparse_lp():
    lp = constructed_lp(np.random.default_rng(21), 24, 8, 1)
    A = lp["A"] * (np.random.default_rng(1).random(lp["A"].shape) < 0.6)   # real zeros
    return dict(lp, A=A, b=A @ lp["z"] + (lp["b"] - lp["A"] @ lp["z"]))


SPARSE_FORMS = {
    "coo": lambda A: A.to_sparse(),
    "csr": lambda A: A.to_sparse_csr(),
    "operator": lambda A: SparseOperator.from_torch(A.to_sparse()),
    "vstack": lambda A: VStackOperator([A[:10], A[10:].to_sparse()]),
    "hstack": lambda A: HStackOperator([A[:, :3], A[:, 3:].to_sparse()]),
}


@pytest.mark.parametrize("form", list(SPARSE_FORMS))
def test_sparse_and_stacked_operators_match_newton_dense(form):
    lp = _sparse_lp()
    w = torch.tensor(np.random.default_rng(0).standard_normal(8))
    ref, gref = _solve_with_grads(lp, "newton", w)
    sol, g = _solve_with_grads(lp, "highs", w, make_A=SPARSE_FORMS[form])
    assert torch.allclose(sol.z, ref.z, atol=1e-10)
    for k in ("b", "b_eq"):
        assert torch.allclose(g[k], gref[k], atol=1e-9), k
    mask = torch.tensor(lp["A"] != 0)
    gA = g["A"].to_dense() if g["A"].is_sparse else g["A"]
    zero = torch.zeros_like(gA)
    # sparse forms carry gradients on the stored entries only
    assert torch.allclose(torch.where(mask, gA, zero), torch.where(mask, gref["A"], zero),
                          atol=1e-9)


def test_auc_lp_diagonal_operator_and_sparse_identity():
    """Binary-AUC LP min 1^T z s.t. -z <= d - eps: z = max(0, eps - d), dz/dd = -[z > 0]."""
    d0 = torch.tensor(np.random.default_rng(4).standard_normal(40) * 0.1)
    eps = 0.1
    for make_A in (lambda n: DiagonalOperator(-torch.ones(n, dtype=D)),
                   lambda n: (-torch.eye(n, dtype=D)).to_sparse_csr()):
        d = d0.clone().requires_grad_()
        sol = solve_lp(torch.ones(40, dtype=D), make_A(40), d - eps, forward="highs")
        sol.value.backward()
        z = torch.relu(eps - d0)
        assert torch.allclose(sol.z, z, atol=1e-12)
        assert torch.allclose(d.grad, -(z > 0).to(D), atol=1e-12)


def test_batched_and_broadcast_equal_per_instance():
    rng = np.random.default_rng(0)
    lps = [constructed_lp(rng, 40, 12, 2, degenerate=i == 1) for i in range(4)]
    stack = [torch.tensor(np.stack([lp[k] for lp in lps])) for k in NAMES]
    sol = solve_lp(*stack, forward="highs")
    assert sol.z.shape == (4, 12) and sol.dual.shape == (4, 40) and sol.eps is None
    assert sol.instance_stats["iterations"].shape == (4,) and sol.stats["batch_size"] == 4
    for i, lp in enumerate(lps):
        T = to_torch(lp)
        one = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
        assert torch.allclose(sol.z[i], one.z, atol=1e-10)
    # a shared A with a [2, 3] batch of b
    T = to_torch(lps[0])
    b = T["b"] + torch.tensor(rng.uniform(0, 1, (2, 3, 40)))
    sol = solve_lp(T["c"], T["A"], b, T["A_eq"], T["b_eq"], forward="highs")
    newton = solve_lp(T["c"], T["A"], b, T["A_eq"], T["b_eq"])
    assert sol.z.shape == (2, 3, 12)
    assert torch.allclose(sol.z, newton.z, atol=1e-9)


def test_float32_data_and_layer():
    lp = constructed_lp(np.random.default_rng(11), 30, 8, 1)
    T = to_torch(lp, torch.float32)
    layer = LPLayer(forward="highs")
    sol = layer(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
    assert sol.z.dtype == torch.float32 and layer.last_stats["forward"] == "highs"
    assert np.abs(sol.z.double().numpy() - lp["z"]).max() < 1e-5


def t(x):
    return torch.tensor(x, dtype=D)


def test_infeasible_raises_typed_error():
    with pytest.raises(LPSolverError) as err:
        solve_lp(t([1.0, 1.0]), t([[1.0, 1.0]]), t([-1.0]), forward="highs")
    assert err.value.kind == "infeasible" and "Check" in str(err.value)
    assert err.value.stats["forward"] == "highs"
    with pytest.raises(LPSolverError, match="infeasible"):        # contradictory equalities
        solve_lp(t([1.0, 1.0]), t([[1.0, 1.0]]), t([3.0]), t([[1.0, 1.0]]), t([-1.0]),
                 forward="highs")


def test_infeasible_instance_in_a_batch_is_named():
    A = t([[1.0, 1.0]]).expand(3, 1, 2)
    with pytest.raises(LPSolverError) as err:
        solve_lp(t([1.0, 1.0]), A, t([[1.0], [-1.0], [2.0]]), forward="highs")
    assert err.value.kind == "infeasible" and err.value.instances == [1]


@pytest.mark.parametrize("c, A, b", [
    ([-1.0, 0.0], [[1.0, -1.0]], [1.0]),
    ([-1.0, -1.0], [[1.0, -1.0], [-1.0, 1.0]], [1.0, 1.0]),
    ([0.0, -1.0], [[1.0, 0.0]], [2.0]),
])
def test_unbounded_raises_typed_error(c, A, b):
    with pytest.raises(LPSolverError) as err:
        solve_lp(t(c), t(A), t(b), forward="highs")
    assert err.value.kind == "unbounded" and "unbounded" in str(err.value)


def test_bad_calls():
    c, A, b = t([1.0, 1.0]), t([[1.0, 1.0]]), t([1.0])
    with pytest.raises(LPInputError, match="forward"):
        solve_lp(c, A, b, forward="gurobi")
    with pytest.raises(LPInputError, match="active_set"):
        solve_lp(c, A, b, forward="highs", backward="unrolled")
    # CUDA data: a typed error that says what to do (checked without a GPU)
    with pytest.raises(LPInputError, match=r"\.cpu\(\)"):
        check_call(SimpleNamespace(device=torch.device("cuda", 0)), "active_set")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_raise():
    c, A, b = (x.cuda() for x in (t([1.0, 1.0]), t([[1.0, 1.0]]), t([1.0])))
    with pytest.raises(LPInputError, match="CPU"):
        solve_lp(c, A, b, forward="highs")
