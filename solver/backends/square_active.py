r"""The square active system of a CPU LP, factorised once on the host: dense (LAPACK) or sparse
(SuperLU).

At a nondegenerate vertex the active set ``T`` (active rows of ``A z <= b``, every row of
``A_eq z = b_eq``, active bounds ``z_j = 0``) has exactly ``n`` rows, and the stacked matrix
:math:`M = [A_T; A_{eq}; -I_Z]` (the rows of :math:`G z \le h`, :mod:`solver.problem`) is square
and nonsingular.  Then :math:`K_T = M^\top M`, :math:`K_T^{-1} = M^{-1} M^{-\top}` and

* the vertex is :math:`z = M^{-1} h_T`,
* the least-norm multipliers on ``T`` (here the only ones) are :math:`u_T = -M^{-\top} c`
  (stationarity :math:`c + M^\top u_T = 0`),
* the active-set backward's solves are :math:`K_T^{-1} r = M^{-1}(M^{-\top} r)`; for the
  vertex itself, :math:`\lambda = M^{-\top} g` gives every data gradient (:class:`_SquareVertex`).

Why a separate path: the torch recovery (:mod:`solver.recover`) forms or factorises ``K_T``
through :class:`solver.linsolve.NewtonSystem`, solves with it five times and recomputes
residuals around each solve, every step a few torch dispatches.  On a small LP those
dispatches were most of the time (the ratio LPs of :mod:`objectives.ratio`, ``n = batch + 1``,
e.g. 65); behind HiGHS (``forward="highs"``, :mod:`solver.backends.highs`) they were
most of what the exact forward added to HiGHS's own time.  Here ``M`` is
gathered from the host copy of the data and factorised once per LP:

* ``kind="dense"`` (a dense ``A`` / ``A_eq``, ``n <= DENSE_LU_MAX_N``): LAPACK ``getrf``
  (~0.05 ms at n = 65), accepted where LAPACK's condition estimate (``getcon``, 1-norm; an
  estimate, usually within a small factor) says ``cond(M) <= sqrt(_CHOL_COND_MAX) = 1e4``: the
  bound under which the Cholesky path (:func:`solver.linsolve._certified_cholesky`,
  ``cond(K_T) = cond(M)^2 <= 1e8``) factorises ``K_T``, far below where its eigen fallback
  would drop a direction, so both paths compute the same vertex, multipliers and backward;
* ``kind="sparse"`` (``A`` / ``A_eq`` with no dense block, :func:`solver.backends.scipy_ops.row_counts`):
  the active bounds eliminated first, SuperLU of the free columns of the active rows only
  (:func:`sparse_factor`), with the pivot rule of :mod:`solver.backends.active_lu`, whose LU of the whole
  ``M`` the torch recovery uses on the same LPs: the same vertex, multipliers and gradients
  (``tests/test_solver_sparse_recovery.py``: to 1e-9 relative); nothing is densified.

Otherwise (a degenerate vertex with more tight rows than ``n``, fewer rows, a singular or
ill-conditioned ``M``, a point that fails the KKT check, GPU, float32 or other operators, a
large dense batch) :func:`recover` returns ``None`` and the caller runs the torch path from the
start, so results never depend on this one.  Used for a ``vertex_guess`` (the ratio losses'
closed form, :func:`solver.solve.run_from_guess`) and for HiGHS's vertex (:mod:`solver.backends.highs`).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np
import torch
from scipy.linalg import lapack

from lpmetrics.solver.backends.active_lu import lu_of_arrays, stacked_rows
from lpmetrics.solver.arrays import NUMPY
from lpmetrics.solver.linsolve import _CHOL_COND_MAX
from lpmetrics.solver.operators import DenseOperator, SparseOperator
from lpmetrics.solver.backends.scipy_ops import HostCSR, csr_matvec, host_matrix, row_counts

# the host LU is O(n^3) like the dense normal equations it replaces; above this n a sparse or
# iterative path is the better choice anyway
DENSE_LU_MAX_N = 1024
# cond(M) bound of the LU path: the Cholesky path's cond(K_T) <= _CHOL_COND_MAX with
# cond(K_T) = cond(M)^2 (2-norm; LAPACK's getcon estimates the 1-norm one, within a small factor)
_COND_MAX = _CHOL_COND_MAX ** 0.5
# dense LPs are factorised one at a time on the host: a large batch keeps the batched torch
# path (sparse ones are factorised one at a time on either path)
DENSE_LU_MAX_B = 16


def eligible(prob) -> str | None:
    """``"dense"``: dense float64 ``A`` / ``A_eq`` on the CPU, small ``n`` and batch;
    ``"sparse"``: float64 CPU data whose ``A`` / ``A_eq`` have no dense block; else ``None``
    (float32 LPs keep the torch path, whose KKT measures are computed in float32)."""
    if prob.device.type != "cpu" or prob.dtype != torch.float64:
        return None
    ops = [op for op in (prob.A, prob.A_eq) if op is not None]
    if all(type(op) is DenseOperator for op in ops):
        return "dense" if prob.n <= DENSE_LU_MAX_N and prob.B <= DENSE_LU_MAX_B else None
    if all(row_counts(op) is not None for op in ops):
        return "sparse"
    return None


def _host(t: torch.Tensor) -> np.ndarray:
    """The float64 CPU tensor ``t`` as a numpy array (shared memory, no copy)."""
    return (t.detach() if t.requires_grad else t).numpy()


class SquareActiveLU:
    """``K_T^{-1} = M^{-1} M^{-T}`` of a batch of square active systems, from the host LU of each
    ``M``, with the interface the recovery and :func:`solver.implicit.active_set_output` use."""

    method, pinv = "cholesky", True
    cg_iterations, cg_tol, cg_max_iter = 0, 0.0, 0
    _lu = False

    def __init__(self, tA, tz, solvers, index, kind):
        # tA, tz: the host's boolean active masks; solvers: (solve_t, solve) of each M;
        # index [B, n] (numpy): the row of G = [A; A_eq; -I] behind each row of M
        self._tA, self._tz, self.solvers, self.index = tA, tz, solvers, index
        self.factor_kind = "dense_lu" if kind == "dense" else "sparse_lu"

    @functools.cached_property
    def wA(self) -> torch.Tensor:
        """The 0/1 active rows as float64 (built on first use: the host routes never read it)."""
        return torch.from_numpy(self._tA.astype(np.float64))

    @functools.cached_property
    def wz(self) -> torch.Tensor:
        return torch.from_numpy(self._tz.astype(np.float64))

    def solve_t(self, r: np.ndarray) -> np.ndarray:
        """``M^{-T} r`` for a host ``r [B, n]``."""
        if len(self.solvers) == 1:
            return self.solvers[0][0](r[0])[None]
        return np.stack([st(r[i]) for i, (st, _) in enumerate(self.solvers)])

    def solve(self, r: torch.Tensor) -> torch.Tensor:
        y = self.solve_t(_host(r.to(torch.float64).expand(len(self.solvers), r.shape[-1])))
        x = np.stack([s(y[i]) for i, (_, s) in enumerate(self.solvers)])
        return torch.from_numpy(x).to(r.dtype)


def _dense_lu(M):
    """``(solve_t, solve)`` of a dense ``M`` by LAPACK, or ``None`` if ``cond(M)`` is too big."""
    lu, piv, info = lapack.dgetrf(M)
    if info != 0:
        return None
    rcond, info = lapack.dgecon(lu, np.abs(M).sum(0).max(), norm="1")
    if info != 0 or not rcond * _COND_MAX >= 1.0:      # (also rejects NaN)
        return None
    return (lambda r: lapack.dgetrs(lu, piv, r, trans=1)[0],
            lambda r: lapack.dgetrs(lu, piv, r)[0])


def sparse_factor(A_i, E_i, rows, bnds):
    r"""``(solve_t, solve)`` of ``M = [S; -I_Z]``, ``S = [A_T; A_eq]`` (``A_i``, ``E_i``: CSR
    matrices, ``E_i`` ``None`` for no equality rows), by SuperLU, or ``None`` where ``M`` is
    (numerically) singular.

    The bound rows are eliminated first: with ``F`` the columns not in ``Z``, ``M`` is square
    exactly when ``R = S[:, F]`` is, and nonsingular exactly when ``R`` is, so only ``R``
    (``k x k``, ``k = n - |Z|``) is factorised: :math:`M z = r` is :math:`z_Z = -r_Z`,
    :math:`z_F = R^{-1}(r_S - S z_Z)`, and :math:`M^\top \lambda = r` is
    :math:`\lambda_S = R^{-\top} r_F`, :math:`\lambda_Z = (S^\top \lambda_S)_Z - r_Z`.
    On the n = 500 LP of ``scripts/solver/time_sparse_lp.py`` (307 active bounds) ``R`` has 487 nonzeros
    against ``M``'s 1,274 and its LU is several times faster.  The pivot rule is
    :mod:`solver.backends.active_lu`'s, applied to ``R``."""
    n = A_i.shape[1]
    data, cols, lens = stacked_rows(A_i, E_i, rows)
    k = lens.size
    free = np.ones(n, dtype=bool)
    free[bnds] = False
    colmap = np.cumsum(free) - 1                 # column j of F -> its column in R
    if k == 0:                                   # every variable at its bound: M = -I
        return (lambda r: 0.0 - r), (lambda r: 0.0 - r)
    keep = free[cols]
    row_of = np.repeat(np.arange(k), lens)                  # the row of each nonzero of S
    counts = np.bincount(row_of[keep], minlength=k)
    R_ptr = np.concatenate([[0], np.cumsum(counts)])
    # the CSR arrays of R read as CSC: R^T, which is what SuperLU factorises (each row of S
    # has sorted, distinct columns, and colmap keeps their order)
    lu = lu_of_arrays(data[keep], colmap[cols[keep]], R_ptr, k)     # factors R^T
    if lu is None:
        return None
    F = np.flatnonzero(free)
    # the products with S straight from its arrays (a scipy matrix object costs more to build
    # than these two products on an n = 500 LP)

    def solve_t(r):                                    # M^-T r
        lam = np.empty(n)
        lam[:k] = lu.solve(r[F])
        lam[k:] = np.bincount(cols, data * lam[row_of], n)[bnds] - r[bnds]     # S^T lam_S
        return lam

    def solve(r):                                      # M^-1 r
        z = np.zeros(n)
        z[bnds] = 0.0 - r[k:]                          # (0.0 -: no -0.0 in z)
        z[F] = lu.solve(r[:k] - np.bincount(row_of, data * z[cols], k), trans="T")
        return z
    return solve_t, solve


def _rmatvec(X, y):
    """``X^T y`` for a numpy array or a CSR matrix ``X`` (for the latter from its arrays: no
    transposed matrix object is built)."""
    if isinstance(X, np.ndarray):
        return y @ X
    return np.bincount(X.indices, X.data * np.repeat(y, np.diff(X.indptr)), X.shape[1])


def _lp_data(prob, kind, i):
    """``(A_i, E_i)`` of LP ``i`` on the host: numpy arrays (dense) or CSR matrices (sparse,
    :func:`solver.backends.scipy_ops.host_matrix`, cached on the problem)."""
    if kind == "dense":
        A = _host(prob.A.A)
        E = None if prob.A_eq is None else _host(prob.A_eq.A)
        return (A if A.ndim == 2 else A[i]), (None if E is None else E if E.ndim == 2 else E[i])
    E = None if prob.A_eq is None else host_matrix(prob, "A_eq", i, sparse=True)
    return host_matrix(prob, "A", i, sparse=True), E


def _factor(kind, A_i, E_i, rows, bnds):
    """``(solve_t, solve)`` of ``M = [A_T; A_eq; -I_Z]`` of LP ``i``, or ``None``."""
    if kind == "sparse":
        return sparse_factor(A_i, E_i, rows, bnds)
    return dense_factor(A_i, E_i, rows, bnds)


def dense_factor(A_i, E_i, rows, bnds):
    """``(solve_t, solve)`` of a dense ``M = [A_T; A_eq; -I_Z]`` (:func:`_dense_lu`), or ``None``."""
    n, k, p = A_i.shape[1], rows.size, 0 if E_i is None else E_i.shape[0]
    M = np.zeros((n, n))
    M[:k] = A_i[rows]
    if p:
        M[k:k + p] = E_i
    M[np.arange(k + p, n), bnds] = -1.0
    return _dense_lu(M)


def recover(prob, x: torch.Tensor, accept_tol: float, tight_rel: float):
    """The recovery of :mod:`solver.recover` from a vertex ``x [B, n]`` (a guess, or an external
    solver's vertex) for an :func:`eligible` LP, on the host: T = the rows and bounds tight at
    ``x`` to ``tight_rel`` (:func:`solver.recover.tight_masks`), the vertex and the multipliers
    from the LU of ``M`` (see the module docstring), the KKT measures of
    :func:`solver.recover.kkt_terms`.  A :class:`solver.recover.Recovery` when every LP has a
    square, well-conditioned ``M`` and passes the KKT check to ``accept_tol``; else ``None``
    (the caller then runs the torch path from the start, so results never depend on this one)."""
    kind = eligible(prob)
    if kind is None:
        return None
    from lpmetrics.solver.recover import Recovery
    host = HostLP(_host(prob.c), _host(prob.b), _host(prob.b_eq) if prob.p else None,
                  _host(prob.h_scale), _host(prob.c_norm),
                  lambda i: _lp_data(prob, kind, i),
                  lambda i, A_i, E_i, rows, bnds: _factor(kind, A_i, E_i, rows, bnds))
    out = certify(host, _host(x), accept_tol, tight_rel)
    if out is None:
        return None
    t = torch.from_numpy
    system = out.system(kind)
    rec = Recovery(t(out.z), system.wA, system.wz, t(out.uA), t(out.uz),
                   None if out.uE is None else t(out.uE), *map(t, out.measures), system)
    rec.__dict__["_kkt_value"] = t(out.kkt)          # Recovery.kkt's cache
    return rec


class HostLP(NamedTuple):
    """A batch of ``B`` LPs on the host for :func:`certify`: ``c [B, n]``, ``b [B, m]``,
    ``b_eq [B, p]`` (or ``None``), the scales ``h_scale``, ``c_norm [B]`` of
    :class:`solver.problem.LPProblem`, ``data(i) -> (A_i, E_i)`` and ``factor(i, A_i, E_i,
    rows, bnds) -> (solve_t, solve)`` or ``None`` (:func:`_factor`)."""
    c: np.ndarray
    b: np.ndarray
    b_eq: np.ndarray | None
    h_scale: np.ndarray
    c_norm: np.ndarray
    data: Callable
    factor: Callable


class Certified(NamedTuple):
    """What :func:`certify` finds, as host arrays: the vertex ``z``, the multipliers, the tight
    masks ``tA``, ``tz``, the KKT ``measures`` (primal_inf, dual_res, gap, value) and ``kkt``,
    each LP's ``(solve_t, solve)`` and ``index`` (the row of ``G`` behind each row of ``M``)."""
    z: np.ndarray
    uA: np.ndarray
    uz: np.ndarray
    uE: np.ndarray | None
    tA: np.ndarray
    tz: np.ndarray
    measures: tuple
    kkt: np.ndarray
    solvers: list
    index: np.ndarray

    def system(self, kind: str) -> "SquareActiveLU":
        """The backward's :class:`SquareActiveLU` (``kind``: "dense" or "sparse")."""
        return SquareActiveLU(self.tA, self.tz, self.solvers, self.index, kind)


def certify(lp: HostLP, x: np.ndarray, accept_tol: float, tight_rel: float) -> Certified | None:
    """The host certificate of the vertex ``x [B, n]`` (see :func:`recover`), or ``None``."""
    from lpmetrics.solver.recover import _kkt, kkt_terms, tight_masks
    c, b, b_eq = lp.c, lp.b, lp.b_eq
    (B, n), m, p = c.shape, b.shape[1], 0 if b_eq is None else b_eq.shape[1]
    solvers, index = [], np.empty((B, n), dtype=np.int64)
    z, u = np.empty((B, n)), np.zeros((B, m + p + n))     # u: [uA, uE, uz] on the rows of G
    tA, tz = np.zeros((B, m), dtype=bool), np.zeros((B, n), dtype=bool)
    rA, stat = np.empty((B, m)), np.empty((B, n))
    rE = np.empty((B, p)) if p else None
    for i in range(B):
        A_i, E_i = lp.data(i)
        tA[i], tz[i] = tight_masks(csr_matvec(A_i, x[i]) - b[i], x[i], lp.h_scale[i], tight_rel)
        rows, bnds = np.flatnonzero(tA[i]), np.flatnonzero(tz[i])
        eq, E_T = slice(None), E_i
        if rows.size + p + bnds.size != n:
            # rows with no nonzero (0 <= b_i, 0 = b_eq_i) constrain nothing: where they make
            # the count, they stay out of M with multiplier 0 (the least-norm one; the torch
            # path's pseudo-inverse ignores a zero row alike) and a zero gradient
            rows = rows[~_zero_rows(A_i, rows)]
            if p:
                eq = np.flatnonzero(~_zero_rows(E_i, np.arange(p)))
                E_T = _take_rows(E_i, eq) if eq.size else None
            if rows.size + (p if E_T is E_i else eq.size) + bnds.size != n:
                return None
        k, pe = rows.size, 0 if E_T is None else E_T.shape[0]
        lu = lp.factor(i, A_i, E_T, rows, bnds)
        if lu is None:
            return None
        solvers.append(lu)
        index[i, :k], index[i, k + pe:] = rows, m + p + bnds
        index[i, k:k + pe] = m + np.arange(p)[eq]
        h = np.zeros(n)
        h[:k] = b[i, rows]
        if pe:
            h[k:k + pe] = b_eq[i, eq]
        z[i] = lu[1](h)
        u[i, index[i]] = -lu[0](c[i])                      # u_T = -M^-T c
        rA[i] = csr_matvec(A_i, z[i]) - b[i]
        stat[i] = c[i] + _rmatvec(A_i, u[i, :m]) - u[i, m + p:]
        if p:
            stat[i] += _rmatvec(E_i, u[i, m:m + p])
            rE[i] = csr_matvec(E_i, z[i]) - b_eq[i]
    uA, uE, uz = u[:, :m], (u[:, m:m + p] if p else None), u[:, m + p:]
    measures = kkt_terms(NUMPY, z, uA, uz, uE, rA, rE, stat, c, b, b_eq, lp.h_scale,
                         lp.c_norm)
    kkt = _kkt(measures, NUMPY)
    if not bool((kkt <= accept_tol).all()):
        return None
    return Certified(z, uA, uz, uE, tA, tz, measures, kkt, solvers, index)


def _zero_rows(X, sel):
    """Which of the rows ``sel`` of ``X`` (numpy array, scipy CSR or :class:`HostCSR`) have no
    nonzero value."""
    if isinstance(X, np.ndarray):
        return ~(X[sel] != 0).any(1)
    count = np.diff(X.indptr)
    nonzero = np.zeros(X.shape[0], dtype=bool)
    nonzero[np.repeat(np.arange(X.shape[0]), count)[X.data[:X.indptr[-1]] != 0]] = True
    return ~nonzero[sel]


def _take_rows(X, sel):
    """The rows ``sel`` of ``X``: a numpy array or a :class:`HostCSR`."""
    if isinstance(X, np.ndarray):
        return X[sel]
    data, cols, lens = stacked_rows(X, None, sel)
    return HostCSR(np.concatenate([[0], np.cumsum(lens)]), cols, data, (sel.size, X.shape[1]))


class _SquareVertex(torch.autograd.Function):
    r"""``z* = M^{-1} h_T`` as a function of ``A, b, A_eq, b_eq`` (its value is given).

    With :math:`\lambda = M^{-\top} g` for the incoming gradient ``g``:
    :math:`\partial L / \partial h_T = \lambda` and :math:`\partial L / \partial M = -\lambda z^\top`,
    read off on the rows of ``A`` / ``A_eq`` that ``M`` holds (the bound rows are constant): the
    whole ``[m, n]`` block for a dense matrix, its nonzeros (``values[k]`` at ``(row[k],
    col[k])``) for a :class:`solver.operators.SparseOperator`.  This is the active-set backward
    of :func:`solver.implicit.active_set_output`, :math:`\partial z^* = -K_T^{-1} \partial F`,
    for a square ``M`` (where :math:`G_T z^* = h_T`), as one node instead of the graph of ``F``.
    ``ops``: the two operators (``None`` for no equalities), read for their layout only."""

    @staticmethod
    def forward(ctx, z, system, m, p, ops, A, b, E, b_eq):
        # z [B, n], b [B, m]; or, for one LP (the host routes), z [n] and b [m] (b_eq alike)
        ctx.system, ctx.m, ctx.p, ctx.ops = system, m, p, ops
        ctx.z = _host(z).reshape(-1, z.shape[-1])
        ctx.one = tuple(h is not None and h.dim() == 1 for h in (b, b_eq))
        return z.clone()

    @staticmethod
    def backward(ctx, g):
        # on the host, like the forward: a handful of numpy ops on [n]-vectors
        system, m, p, z = ctx.system, ctx.m, ctx.p, ctx.z
        gh = _host(g if g.dtype == torch.float64 else g.double())
        lam = system.solve_t(gh.reshape(-1, gh.shape[-1]))
        lamG = np.zeros((lam.shape[0], m + p + lam.shape[1]))
        lamG[np.arange(lam.shape[0])[:, None], system.index] = lam
        grads = [None] * 4
        for j, (lo, hi) in enumerate(((0, m), (m, m + p))):
            need_M, need_h = ctx.needs_input_grad[5 + 2 * j], ctx.needs_input_grad[6 + 2 * j]
            lam_j = lamG[:, lo:hi]
            if need_M:
                grads[2 * j] = _to(torch.from_numpy(_matrix_grad(ctx.ops[j], lam_j, z)), g.dtype)
            if need_h:
                lam_j = lam_j[0] if ctx.one[j] else lam_j
                grads[2 * j + 1] = _to(torch.from_numpy(np.ascontiguousarray(lam_j)), g.dtype)
        return (None, None, None, None, None, *grads)


def _to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def _matrix_grad(op, lam, z):
    """``-lambda z^T`` on the data of ``op`` (dense block or sparse values); summed over the
    batch for a matrix the batch shares."""
    if isinstance(op, SparseOperator):
        row, col = op.row.numpy(), op.col.numpy()
        if op.bidx is None:
            return -(lam[:, row] * z[:, col]).sum(0)
        bi = op.bidx.numpy()
        return -lam[bi, row] * z[bi, col]
    # (-z: the same values as negating the product, on n entries instead of m n)
    # (an outer product by broadcasting: the same products as lam^T @ z without a GEMM call)
    return lam[:, :, None] * -z[:, None, :] if op.A.dim() == 3 else lam.T * -z if \
        lam.shape[0] == 1 else lam.T @ -z


def square_output(prob, z_star, system):
    """``z*`` carrying the active-set Jacobian w.r.t. ``A, b, A_eq, b_eq`` (see
    :class:`_SquareVertex`); ``z*`` itself where no data requires grad; ``None`` where a matrix
    that requires grad is neither dense nor a ``SparseOperator`` (the caller's generic path)."""
    ops = (prob.A, prob.A_eq)
    mats = []
    for op in ops:
        data = None if op is None else op.A if isinstance(op, DenseOperator) else \
            op.values if isinstance(op, SparseOperator) else None
        if op is not None and data is None and any(t.requires_grad for t in op.tensors()):
            return None
        mats.append(data)
    data = (mats[0], prob.b, mats[1], prob.b_eq)
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in data):
        return z_star
    return _SquareVertex.apply(z_star.detach(), system, prob.m, prob.p, ops, *data)
