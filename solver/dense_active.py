r"""The square active system of a small dense CPU LP, factorised once on the host.

At a nondegenerate vertex the active set ``T`` (active rows of ``A z <= b``, every row of
``A_eq z = b_eq``, active bounds ``z_j = 0``) has exactly ``n`` rows, and the stacked matrix
:math:`M = [A_T; A_{eq}; -I_Z]` (the rows of :math:`G z \le h`, :mod:`solver.problem`) is square
and nonsingular.  Then :math:`K_T = M^\top M`, :math:`K_T^{-1} = M^{-1} M^{-\top}` and

* the vertex is :math:`z = M^{-1} h_T`,
* the least-norm multipliers on ``T`` (here the only ones) are :math:`u_T = -M^{-\top} c`
  (stationarity :math:`c + M^\top u_T = 0`),
* the active-set backward's solves are :math:`K_T^{-1} r = M^{-1}(M^{-\top} r)`.

Why a separate path: for a small dense LP (the ratio LPs of :mod:`objectives.ratio` have
``n = batch + 1``, e.g. 65) the normal-equations path of :class:`solver.linsolve.NewtonSystem`
forms ``K_T``, certifies a Cholesky factor, solves with it four times and recomputes residuals
around each solve; every torch op on a 65-vector costs microseconds of dispatch, and together
they were most of the F1 loss's time (issue 20, item 4).  Here ``M`` is gathered from the host
copy of the data and factorised by LAPACK (``getrf``, ~0.05 ms at n = 65); every solve is a
pair of triangular solves (``getrs``) on the host.

The LU is used only where LAPACK's condition estimate (``getcon``, 1-norm; an estimate, not
a bound, usually within a small factor) says ``cond(M) <= sqrt(_CHOL_COND_MAX) = 1e4``: the
bound under which the Cholesky path (:func:`solver.linsolve._certified_cholesky`,
``cond(K_T) = cond(M)^2 <= 1e8``) factorises ``K_T``, far below where its eigen fallback would
drop a direction, so both paths compute the same vertex, multipliers and backward up to
roundoff.  Otherwise (a degenerate vertex with more tight rows than ``n``, fewer rows, a
singular or ill-conditioned ``M``, a guess that fails the KKT check, GPU, float32 or structured
data, a large batch) :func:`recover_guess` returns ``None`` and the caller
(:func:`solver.solve.run_from_guess`) runs :func:`solver.recover.recover_guess`, the torch
path, from the start.  Used for a ``vertex_guess`` only (the ratio losses' closed form).
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.linalg import lapack

from solver.linsolve import _CHOL_COND_MAX
from solver.operators import DenseOperator

# the host LU is O(n^3) like the dense normal equations it replaces; above this n a sparse or
# iterative path is the better choice anyway
DENSE_LU_MAX_N = 1024
# cond(M) bound of the LU path: the Cholesky path's cond(K_T) <= _CHOL_COND_MAX with
# cond(K_T) = cond(M)^2 (2-norm; LAPACK's getcon estimates the 1-norm one, within a small factor)
_COND_MAX = _CHOL_COND_MAX ** 0.5
# LPs are factorised one at a time on the host: a large batch keeps the batched torch path
DENSE_LU_MAX_B = 16


def eligible(prob) -> bool:
    """Dense float64 ``A`` / ``A_eq`` on the CPU, small ``n`` and batch (float32 LPs keep the
    torch path, whose KKT measures are computed in float32)."""
    return (prob.device.type == "cpu" and prob.dtype == torch.float64
            and prob.n <= DENSE_LU_MAX_N
            and prob.B <= DENSE_LU_MAX_B and type(prob.A) is DenseOperator
            and (prob.A_eq is None or type(prob.A_eq) is DenseOperator))


def _host(t: torch.Tensor) -> np.ndarray:
    """The float64 CPU tensor ``t`` as a numpy array (shared memory, no copy)."""
    return (t.detach() if t.requires_grad else t).numpy()


class DenseActiveLU:
    """``K_T^{-1} = M^{-1} M^{-T}`` of a batch of square active systems, from the host LU of each
    ``M``, with the interface the recovery and :func:`solver.implicit.active_set_output` use."""

    method, pinv, factor_kind = "cholesky", True, "dense_lu"
    cg_iterations, cg_tol, cg_max_iter = 0, 0.0, 0
    _lu = False

    def __init__(self, wA, wz, lus, index):
        # lus: (LU, pivots) of each M; index [B, n]: the row of G = [A; A_eq; -I] behind
        # each row of M
        self.wA, self.wz, self.lus, self.index = wA, wz, lus, index

    def solve_t(self, r: np.ndarray) -> np.ndarray:
        """``M^{-T} r`` for a host ``r [B, n]``."""
        return np.stack([lapack.dgetrs(lu, piv, r[i], trans=1)[0]
                         for i, (lu, piv) in enumerate(self.lus)])

    def solve(self, r: torch.Tensor) -> torch.Tensor:
        y = self.solve_t(_host(r.to(torch.float64).expand(len(self.lus), r.shape[-1])))
        x = np.stack([lapack.dgetrs(lu, piv, y[i])[0] for i, (lu, piv) in enumerate(self.lus)])
        return torch.from_numpy(x).to(r.dtype)


def _rows(A: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``A x`` for ``A [m, n]`` or ``[B, m, n]`` and ``x [B, n]``."""
    return x @ A.T if A.ndim == 2 else np.einsum("bmn,bn->bm", A, x)


def _rows_t(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``A^T y`` for ``A [m, n]`` or ``[B, m, n]`` and ``y [B, m]``."""
    return y @ A if A.ndim == 2 else np.einsum("bmn,bm->bn", A, y)


def recover_guess(prob, x: torch.Tensor, accept_tol: float):
    """:func:`solver.recover.recover_guess` for an :func:`eligible` LP, on the host: T = the
    rows and bounds tight at the guess ``x [B, n]`` (``GUESS_TIGHT``), the vertex and the
    multipliers from the LU of ``M`` (see the module docstring), the KKT measures of
    :func:`solver.recover.kkt_terms`.  A :class:`solver.recover.Recovery` when every LP has a
    square, well-conditioned ``M`` and passes the KKT check to ``accept_tol``; else ``None``
    (the caller then runs the torch path from the start, so results never depend on this one)."""
    if not eligible(prob):
        return None
    from solver.recover import GUESS_TIGHT, NUMPY_OPS, Recovery, _kkt, kkt_terms, tight_masks
    B, n, m, p = prob.B, prob.n, prob.m, prob.p
    A, c, b, x = _host(prob.A.A), _host(prob.c), _host(prob.b), _host(x)
    E, b_eq = (None, None) if prob.A_eq is None else (_host(prob.A_eq.A), _host(prob.b_eq))
    h_scale, c_norm = _host(prob.h_scale), _host(prob.c_norm)
    tA, tz = tight_masks(_rows(A, x) - b, x, h_scale, GUESS_TIGHT)
    lus, index = [], np.empty((B, n), dtype=np.int64)
    z, u = np.empty((B, n)), np.zeros((B, m + p + n))     # u: [uA, uE, uz] on the rows of G
    for i in range(B):
        rows, bnds = np.flatnonzero(tA[i]), np.flatnonzero(tz[i])
        k = rows.size
        if k + p + bnds.size != n:
            return None
        M = np.zeros((n, n))
        M[:k] = (A[i] if A.ndim == 3 else A)[rows]
        h = np.zeros(n)
        h[:k] = b[i, rows]
        if p:
            M[k:k + p] = E[i] if E.ndim == 3 else E
            h[k:k + p] = b_eq[i]
        M[np.arange(k + p, n), bnds] = -1.0
        lu, piv, info = lapack.dgetrf(M)
        if info != 0:
            return None
        rcond, info = lapack.dgecon(lu, np.abs(M).sum(0).max(), norm="1")
        if info != 0 or not rcond * _COND_MAX >= 1.0:      # (also rejects NaN)
            return None
        lus.append((lu, piv))
        index[i, :k], index[i, k:k + p], index[i, k + p:] = rows, m + np.arange(p), m + p + bnds
        z[i] = lapack.dgetrs(lu, piv, h)[0]
        u[i, index[i]] = -lapack.dgetrs(lu, piv, c[i], trans=1)[0]     # u_T = -M^-T c
    uA, uE, uz = u[:, :m], (u[:, m:m + p] if p else None), u[:, m + p:]
    stat = c + _rows_t(A, uA) - uz
    rE = None
    if p:
        stat = stat + _rows_t(E, uE)
        rE = _rows(E, z) - b_eq
    measures = kkt_terms(NUMPY_OPS, z, uA, uz, uE, _rows(A, z) - b, rE, stat, c, b, b_eq, h_scale,
                         c_norm)
    kkt = _kkt(measures, NUMPY_OPS)
    if not bool((kkt <= accept_tol).all()):
        return None
    t = torch.from_numpy
    wA, wz = t(tA.astype(np.float64)), t(tz.astype(np.float64))
    rec = Recovery(t(z), wA, wz, t(uA), t(uz), None if uE is None else t(uE),
                   *map(t, measures), DenseActiveLU(wA, wz, lus, t(index)))
    rec.__dict__["_kkt_value"] = t(kkt)          # Recovery.kkt's cache
    return rec


class _SquareVertex(torch.autograd.Function):
    r"""``z* = M^{-1} h_T`` as a function of ``A, b, A_eq, b_eq`` (its value is given).

    With :math:`\lambda = M^{-\top} g` for the incoming gradient ``g``:
    :math:`\partial L / \partial h_T = \lambda` and :math:`\partial L / \partial M = -\lambda z^\top`,
    read off on the rows of ``A`` / ``A_eq`` that ``M`` holds (the bound rows are constant).  This is
    the active-set backward of :func:`solver.implicit.active_set_output`,
    :math:`\partial z^* = -K_T^{-1} \partial F`, for a square ``M`` (where :math:`G_T z^* = h_T`), as
    one node instead of the graph of ``F``."""

    @staticmethod
    def forward(ctx, z, system, m, p, A, b, E, b_eq):
        ctx.system, ctx.m, ctx.p, ctx.z = system, m, p, _host(z)
        ctx.batched = [None if t is None else t.dim() == 3 for t in (A, E)]
        return z.clone()

    @staticmethod
    def backward(ctx, g):
        # on the host, like the forward: a handful of numpy ops on [n]-vectors
        system, m, p, z = ctx.system, ctx.m, ctx.p, ctx.z
        lam = system.solve_t(_host(g if g.dtype == torch.float64 else g.double()))
        lamG = np.zeros((lam.shape[0], m + p + lam.shape[1]))
        np.put_along_axis(lamG, system.index.numpy(), lam, 1)
        grads = [None] * 4
        for j, (lo, hi) in enumerate(((0, m), (m, m + p))):
            need_M, need_h = ctx.needs_input_grad[4 + 2 * j], ctx.needs_input_grad[5 + 2 * j]
            lam_j = lamG[:, lo:hi]
            if need_M:    # -lambda z^T on the rows of M; summed over the batch for a shared A
                gM = -(lam_j[:, :, None] * z[:, None, :]) if ctx.batched[j] else -(lam_j.T @ z)
                grads[2 * j] = torch.from_numpy(gM).to(g.dtype)
            if need_h:
                grads[2 * j + 1] = torch.from_numpy(np.ascontiguousarray(lam_j)).to(g.dtype)
        return (None, None, None, None, *grads)


def square_output(prob, z_star, system):
    """``z*`` carrying the active-set Jacobian w.r.t. ``A, b, A_eq, b_eq`` (see
    :class:`_SquareVertex`); ``z*`` itself where no data requires grad."""
    E, b_eq = (None, None) if prob.A_eq is None else (prob.A_eq.A, prob.b_eq)
    data = (prob.A.A, prob.b, E, b_eq)
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in data):
        return z_star
    return _SquareVertex.apply(z_star.detach(), system, prob.m, prob.p, *data)
