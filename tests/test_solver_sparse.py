"""``linear_solver="sparse"``: the Newton system factorised sparse (SuperLU), never densified.

Forced on the oracle families of ``test_solver_oracle`` it must return what the dense Cholesky
path returns (value, z, gradients; singular ``K_T`` included: dual-degenerate LPs); ``auto``
must pick it for large sparse ``A`` on the CPU and not otherwise.
"""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from lpmetrics.solver import LPInputError, SparseOperator, VStackOperator, solve_lp
from tests.test_solver_oracle import check_against_highs, constructed_lp, random_lp, to_torch

NAMES = ("c", "A", "b", "A_eq", "b_eq")
D = torch.float64


def _grads(T, weight, **kw):
    leaves = [None if T[k] is None else T[k].clone().requires_grad_() for k in NAMES]
    sol = solve_lp(*leaves, **kw)
    (sol.z * weight).sum().backward()
    return sol, torch.cat([(a.grad if a.grad is not None else torch.zeros_like(a)).flatten()
                           for a in leaves if a is not None])


def test_oracle_families_match_dense_cholesky():
    rng = np.random.default_rng(77)
    kinds = set()
    for i in range(24):
        lp, kind = random_lp(rng, i)
        T = to_torch(lp)
        w = torch.tensor(rng.standard_normal(len(lp["c"])))
        s1, g1 = _grads(T, w, linear_solver="cholesky")
        s2, g2 = _grads(T, w, linear_solver="sparse")
        assert s2.stats["linear_solver"] == "sparse" and s2.stats["converged"]
        assert abs(float(s1.value.detach() - s2.value.detach())) <= 1e-9 * (
            1 + abs(float(s1.value.detach())))
        if check_against_highs(lp, s2):          # unique optimum: same z, same Jacobian
            assert torch.allclose(s1.z, s2.z, atol=1e-9), kind
            assert torch.allclose(g1, g2, atol=1e-7 * (1 + float(g1.abs().max()))), kind
        kinds.add(kind)
    assert len(kinds) == 4


def test_gradcheck_sparse_solver_with_equalities():
    lp = constructed_lp(np.random.default_rng(3), 7, 5, 1)
    args = [t.clone().requires_grad_() for t in to_torch(lp).values()]
    f = lambda *a: solve_lp(*a, linear_solver="sparse", tol=1e-10).z  # noqa: E731
    assert torch.autograd.gradcheck(f, args, atol=1e-6, rtol=1e-5)


def _random_sparse(rng, n, m0, density=5e-3):
    A0 = sp.random(m0, n, density=density, random_state=rng, data_rvs=rng.standard_normal)
    z0 = rng.uniform(0, 1, n)
    A = sp.vstack([A0, sp.identity(n)]).tocoo()
    b = np.concatenate([A0 @ z0 + rng.uniform(0, 1, m0), np.full(n, 3.0)])
    return rng.standard_normal(n), A, b


def _torch_coo(A):
    return torch.sparse_coo_tensor(np.vstack([A.row, A.col]), A.data, A.shape)


def test_auto_picks_sparse_for_a_large_sparse_lp():
    rng = np.random.default_rng(0)
    c, A, b = _random_sparse(rng, 300, 301)
    lp = dict(c=c, A=A.toarray(), b=b, A_eq=None, b_eq=None)
    sol = solve_lp(torch.tensor(c), _torch_coo(A), torch.tensor(b))
    assert sol.stats["linear_solver"] == "sparse"
    check_against_highs(lp, sol)
    # the same LP as a dense tensor, or with the unrolled backward, keeps the dense path
    dense = solve_lp(torch.tensor(c), torch.tensor(lp["A"]), torch.tensor(b))
    assert dense.stats["linear_solver"] == "cholesky"
    assert torch.allclose(dense.z, sol.z, atol=1e-9)
    unrolled = solve_lp(torch.tensor(c), _torch_coo(A), torch.tensor(b), backward="unrolled")
    assert unrolled.stats["linear_solver"] != "sparse"
    with pytest.raises(LPInputError, match="unrolled"):
        solve_lp(torch.tensor(c), _torch_coo(A), torch.tensor(b), backward="unrolled",
                 linear_solver="sparse")


def test_auc_lp_sparse_identity_closed_form():
    """1,024-pair binary-AUC LP with A = -I as torch.sparse CSR: z = max(0, eps - d).  One
    nonzero per row: auto takes the separable (diagonal) path; forced sparse agrees."""
    d0 = torch.tensor(np.random.default_rng(4).standard_normal(1024) * 0.05)
    A = (-torch.eye(1024, dtype=D)).to_sparse_csr()
    z = torch.relu(0.01 - d0)
    for solver, expect in (("auto", "diagonal"), ("sparse", "sparse")):
        d = d0.clone().requires_grad_()
        sol = solve_lp(torch.ones(1024, dtype=D), A, d - 0.01, linear_solver=solver)
        assert sol.stats["linear_solver"] == expect
        sol.value.backward()
        assert torch.allclose(sol.z, z, atol=1e-12)
        assert torch.allclose(d.grad, -(z > 0).to(D), atol=1e-12)


def test_batched_sparse_operator_with_equalities():
    """[B, m, n] sparse A and A_eq, and a stacked operator: every instance is its vertex."""
    rng = np.random.default_rng(6)
    lps = [constructed_lp(rng, 12, 6, 1) for _ in range(3)]
    c, A, b, Ae, be = (torch.tensor(np.stack([lp[k] for lp in lps])) for k in NAMES)
    for make in (lambda A: A.to_sparse(), lambda A: VStackOperator(
            [SparseOperator.from_torch(A[:, :5].to_sparse()), A[:, 5:].to_sparse()])):
        sol = solve_lp(c, make(A), b, Ae.to_sparse(), be, linear_solver="sparse")
        for i, lp in enumerate(lps):
            assert np.abs(sol.z[i].numpy() - lp["z"]).max() < 1e-9


def _budget_lp(rng, n, m0, dense_rows=1, density=5e-3):
    """``_random_sparse`` with ``dense_rows`` of its random rows replaced by dense ones (the first
    a budget row ``1^T z <= s``, the others dense random rows): each alone fills ``A^T W A``."""
    A0 = sp.random(m0 - dense_rows, n, density=density, random_state=rng,
                   data_rvs=rng.standard_normal)
    D = np.vstack([np.ones(n)] + [rng.uniform(0.5, 1.5, n) for _ in range(dense_rows - 1)])
    A0 = sp.vstack([A0, sp.csr_matrix(D)])
    z0 = rng.uniform(0, 1, n)
    A = sp.vstack([A0, sp.identity(n)]).tocoo()
    b = np.concatenate([A0 @ z0 + rng.uniform(0, 1, m0), np.full(n, 3.0)])
    return rng.standard_normal(n), A, b


@pytest.mark.parametrize("equality", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_dense_rows_enter_as_a_low_rank_update(seed, equality):
    """The Newton system of an LP with dense rows: the sparse solver leaves them out of the
    pattern (``K_s`` stays sparse) and solves with ``K_s + U^T U`` by Sherman-Morrison-Woodbury
    (``delta > 0``) or factorises the sum (``pinv``); oracle: a dense solve of ``K``.
    ``equality``: also a simplex row ``1^T z = s`` (and two sparse rows) in ``A_eq``."""
    from lpmetrics.solver.linsolve import NewtonSystem
    from lpmetrics.solver.problem import build_problem
    from lpmetrics.solver.backends.sparse_factor import _pattern
    rng = np.random.default_rng(seed)
    n = 120
    c, A, b = _budget_lp(rng, n, 121, dense_rows=1 + seed)
    eq, EtE = (None, None), torch.zeros(n, n, dtype=D)
    if equality:
        E = sp.vstack([sp.csr_matrix(np.ones((1, n))),
                       sp.random(2, n, density=0.03, random_state=rng)]).tocoo()
        eq, Ed = (_torch_coo(E), torch.tensor(E @ np.full(n, 0.5))), torch.tensor(E.toarray())
        EtE = Ed.T @ Ed
    prob = build_problem(torch.tensor(c), _torch_coo(A), torch.tensor(b), *eq)
    Ad = torch.tensor(A.toarray())
    pat = _pattern(prob, 0)
    assert pat.dense.size == 1 + seed and pat.nnz < 0.2 * n * n
    assert (pat.D_eq is not None and pat.D_eq.shape[0] == 1) == equality
    r = torch.tensor(rng.standard_normal((1, n)))
    for trial in range(4):
        wA = torch.tensor((rng.uniform(size=(1, A.shape[0])) < 0.5).astype(float))
        wA[0, 120 - seed:121] = float(trial % 2)         # the dense rows on / off together
        for pinv, delta in ((False, 1e-3), (True, 0.0)):
            # (pinv: most bounds on, so K is mostly nonsingular on the variables it touches and
            # its pseudo-inverse a plain inverse there; singular K_T: the oracle tests above)
            wz = torch.tensor((rng.uniform(size=(1, n)) < (0.9 if pinv else 0.3)).astype(float))
            d = torch.full((1,), delta, dtype=D)
            K = Ad.T @ (wA[0, :, None] * Ad) + EtE + torch.diag(wz[0] + delta)
            x = NewtonSystem(prob, wA, wz, d, "sparse", pinv=pinv).solve(r)
            if pinv:
                keep = K.diagonal() > 0
                ev = torch.linalg.eigvalsh(K[keep][:, keep])
                if ev[0] < 1e-8 * ev[-1]:      # singular where it is touched: not this test's
                    continue
                ref = torch.zeros(n, dtype=D)
                ref[keep] = torch.linalg.lstsq(K[keep][:, keep], r[0, keep]).solution
            else:
                ref = torch.linalg.solve(K, r[0])
            assert torch.allclose(x[0], ref, rtol=1e-7, atol=1e-9 * float(ref.abs().max())), \
                (trial, pinv)


def test_auto_picks_sparse_with_a_budget_row():
    """A budget row (the ``ones`` LP of ``scripts/solver/time_sparse_lp.py``, in small) does not send
    Newton to the dense Cholesky path; the vertex, the value and the gradient are the dense path's
    (and HiGHS's)."""
    rng = np.random.default_rng(1)
    c, A, b = _budget_lp(rng, 260, 261, dense_rows=2)
    lp = dict(c=c, A=A.toarray(), b=b, A_eq=None, b_eq=None)
    w = torch.tensor(rng.standard_normal(260))
    sols = {}
    for solver in ("auto", "cholesky"):
        bt = torch.tensor(b, requires_grad=True)
        sol = solve_lp(torch.tensor(c), _torch_coo(A), bt, forward="newton",
                       linear_solver=solver)
        (sol.z * w).sum().backward()
        sols[solver] = (sol, bt.grad)
    sol, g = sols["auto"]
    assert sol.stats["linear_solver"] == "sparse" and sol.stats["converged"]
    check_against_highs(lp, sol)
    ref, g_ref = sols["cholesky"]
    assert torch.allclose(sol.z, ref.z, atol=1e-9)
    assert torch.allclose(g, g_ref, atol=1e-8 * (1 + float(g_ref.abs().max())))


@pytest.mark.parametrize("dense_rows", [4, 8])
def test_many_dense_rows_at_the_default_delta(dense_rows):
    """Several dense rows at the default (tiny) ``delta``: ``C = I + U K_s^{-1} U^T`` is then
    ill-conditioned (cond ~1e8-1e10) although ``K`` is not; it must be factorised, not inverted,
    or the Newton directions lose every digit and Newton does not converge (review of
    ce44f39: an explicit inverse failed here)."""
    rng = np.random.default_rng(0)
    c, A, b = _budget_lp(rng, 300, 301, dense_rows=dense_rows)
    lp = dict(c=c, A=A.toarray(), b=b, A_eq=None, b_eq=None)
    sols = {s: solve_lp(torch.tensor(c), _torch_coo(A), torch.tensor(b), forward="newton",
                        linear_solver=s) for s in ("sparse", "cholesky")}
    assert sols["sparse"].stats["converged"]
    check_against_highs(lp, sols["sparse"])
    assert torch.allclose(sols["sparse"].z, sols["cholesky"].z, atol=1e-9)


def test_row_counts_follow_an_index_changed_in_place():
    """The row counts cached on a ``SparseOperator`` are recounted when its index tensor is
    modified in place (a stale count once sent such an LP to the diagonal solver)."""
    from lpmetrics.solver.backends.scipy_ops import row_counts
    idx = torch.arange(5).repeat(2, 1)
    op = SparseOperator(idx.clone(), torch.ones(5, dtype=D), (5, 5))
    assert row_counts(op).tolist() == [1, 1, 1, 1, 1]
    op.indices[0, 1] = 0                        # row 0 now holds two nonzeros
    assert row_counts(op).tolist() == [2, 0, 1, 1, 1]


@pytest.mark.parametrize("forward", ["newton", "highs"])
def test_equalities_only_with_an_empty_sparse_A(forward):
    """``A`` with no rows as a ``torch.sparse`` tensor, the LP in ``A_eq`` alone: its Gram
    matrix (m = 0) is the zero matrix (a reshape once failed on it); oracle: HiGHS."""
    g = np.random.default_rng(0)
    E = g.uniform(0.5, 1.5, (3, 6))
    be, c = E @ g.uniform(0, 1, 6), g.uniform(0.1, 1, 6)
    from scipy.optimize import linprog
    res = linprog(c, A_eq=E, b_eq=be, bounds=(0, None), method="highs")
    sol = solve_lp(torch.tensor(c), torch.zeros(0, 6, dtype=D).to_sparse(),
                   torch.zeros(0, dtype=D), torch.tensor(E).to_sparse(), torch.tensor(be),
                   forward=forward, linear_solver="cholesky")
    assert sol.stats["converged"]
    assert abs(float(sol.value) - res.fun) <= 1e-9 * (1 + abs(res.fun))
    assert np.abs(sol.z.numpy() - res.x).max() <= 1e-8


def test_a_dense_equality_row_enters_as_a_low_rank_update():
    """A simplex row ``1^T z = s`` in ``A_eq`` (it fills ``A_eq^T A_eq``) plus a dense row of
    ``A``: ``auto`` keeps the sparse solver (both rows in the low-rank part), and the vertex and
    gradients (w.r.t. ``b`` and ``b_eq``) are the dense path's and HiGHS's."""
    from lpmetrics.solver.problem import build_problem
    from lpmetrics.solver.backends.sparse_factor import _pattern
    rng = np.random.default_rng(2)
    n = 260
    c, A, b = _budget_lp(rng, n, 261, dense_rows=2)
    E = sp.vstack([sp.csr_matrix(np.ones((1, n))),
                   sp.random(2, n, density=0.02, random_state=rng)]).tocoo()
    be = E @ np.full(n, 0.5)                      # the equalities hold at z = 0.5
    lp = dict(c=c, A=A.toarray(), b=b, A_eq=E.toarray(), b_eq=be)
    from scipy.optimize import linprog
    res = linprog(c, A_ub=lp["A"], b_ub=b, A_eq=lp["A_eq"], b_eq=be, bounds=(0, None),
                  method="highs")
    assert res.status == 0
    prob = build_problem(torch.tensor(c), _torch_coo(A), torch.tensor(b), _torch_coo(E),
                         torch.tensor(be))
    pat = _pattern(prob, 0)
    assert pat.D_eq is not None and pat.D_eq.shape[0] == 1 and pat.dense.size == 2
    w = torch.tensor(rng.standard_normal(n))
    out = {}
    for solver in ("auto", "cholesky"):
        bt, bet = torch.tensor(b, requires_grad=True), torch.tensor(be, requires_grad=True)
        sol = solve_lp(torch.tensor(c), _torch_coo(A), bt, _torch_coo(E), bet,
                       forward="newton", linear_solver=solver)
        (sol.z * w).sum().backward()
        out[solver] = (sol, torch.cat([bt.grad, bet.grad]))
    sol, g = out["auto"]
    assert sol.stats["linear_solver"] == "sparse" and sol.stats["converged"]
    assert abs(float(sol.value) - res.fun) <= 1e-8 * (1 + abs(res.fun))
    assert torch.allclose(sol.z, out["cholesky"][0].z, atol=1e-9)
    assert torch.allclose(g, out["cholesky"][1], atol=1e-8 * (1 + float(g.abs().max())))
