r"""The square active system of a small dense CPU LP, inverted once on the host.

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
copy of the data, inverted by LAPACK (``getrf`` + ``getri``: ~0.1 ms at n = 65) and every solve
is a product with ``M^{-1}``.

The inverse is used only where it is certified by the bound the Cholesky path uses
(:func:`solver.linsolve._certified_cholesky`): ``trace(K_T) trace(K_T^{-1}) =
|M|_F^2 |M^{-1}|_F^2 >= cond(K_T)`` at most ``_CHOL_COND_MAX``, so both paths compute the same
``K_T^{-1}`` up to roundoff.  Otherwise (a degenerate vertex with more tight rows than ``n``,
fewer rows, a singular or ill-conditioned ``M``, GPU or structured data) :func:`square_system`
returns ``None`` and the caller keeps the least-squares path.  The KKT check after it certifies
whichever path ran (:func:`solver.recover.recover_guess`).
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.linalg import lapack

from solver.linsolve import _CHOL_COND_MAX
from solver.operators import DenseOperator

# the host inverse is O(n^3) like the dense normal equations it replaces; above this n a
# sparse or iterative path is the better choice anyway
DENSE_INVERSE_MAX_N = 1024
# LPs are inverted one at a time on the host: a large batch keeps the batched torch path
DENSE_INVERSE_MAX_B = 16


def eligible(prob) -> bool:
    """Dense ``A`` / ``A_eq`` on the CPU, small ``n`` and batch."""
    return (prob.device.type == "cpu" and prob.n <= DENSE_INVERSE_MAX_N
            and prob.B <= DENSE_INVERSE_MAX_B and type(prob.A) is DenseOperator
            and (prob.A_eq is None or type(prob.A_eq) is DenseOperator))


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


class DenseActiveInverse:
    """``K_T^{-1} = M^{-1} M^{-T}`` of a batch of square active systems (``Minv [B, n, n]``),
    with the interface the recovery and :func:`solver.implicit.active_set_output` use."""

    method, pinv, factor_kind = "cholesky", True, "dense_inverse"
    cg_iterations, cg_tol, cg_max_iter = 0, 0.0, 0
    _lu = False

    def __init__(self, wA, wz, Minv, index):
        # index [B, n]: the row of G = [A; A_eq; -I] behind each row of M
        self.wA, self.wz, self.Minv, self.index = wA, wz, Minv, index

    def solve(self, r: torch.Tensor) -> torch.Tensor:
        Minv = self.Minv if self.Minv.dtype == r.dtype else self.Minv.to(r.dtype)
        r = r.expand(Minv.shape[0], Minv.shape[-1])
        y = torch.bmm(r.unsqueeze(-2), Minv)                  # (M^-T r)^T
        return torch.bmm(Minv, y.mT).squeeze(-1)


def square_system(prob, wA: torch.Tensor, wz: torch.Tensor):
    """``(z, uA, uz, uE, system)`` from the square active systems marked by the 0/1 weights
    ``wA [B, m]``, ``wz [B, n]`` (see the module docstring), or ``None`` where some LP's system
    is not square, not certified nonsingular, or the problem is not :func:`eligible`."""
    if not eligible(prob):
        return None
    B, n, m, p = prob.B, prob.n, prob.m, prob.p
    A, c, b = _host(prob.A.A), _host(prob.c), _host(prob.b)
    E = None if prob.A_eq is None else _host(prob.A_eq.A)
    b_eq = None if prob.A_eq is None else _host(prob.b_eq)
    rows_all, bnds_all = _host(wA) > 0, _host(wz) > 0
    Minv, index = np.empty((B, n, n)), np.empty((B, n), dtype=np.int64)
    z, u = np.empty((B, n)), np.zeros((B, m + p + n))     # u: [uA, uE, uz] on the rows of G
    for i in range(B):
        rows, bnds = np.flatnonzero(rows_all[i]), np.flatnonzero(bnds_all[i])
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
        inv, info = lapack.dgetri(lu, piv)
        # the Cholesky path's certificate (also rejects NaN)
        if info != 0 or not (M * M).sum() * (inv * inv).sum() <= _CHOL_COND_MAX:
            return None
        Minv[i] = inv
        index[i, :k], index[i, k:k + p], index[i, k + p:] = rows, m + np.arange(p), m + p + bnds
        z[i] = inv @ h
        v = -(c[i] @ inv)                                   # u_T = -M^-T c
        u[i, rows], u[i, m + p + bnds] = v[:k], v[k + p:]
        u[i, m:m + p] = v[k:k + p]
    dt = prob.dtype
    z, u = torch.from_numpy(z).to(dt), torch.from_numpy(u).to(dt)
    uA, uE, uz = u[:, :m], (u[:, m:m + p] if p else None), u[:, m + p:]
    return z, uA, uz, uE, DenseActiveInverse(wA, wz, torch.from_numpy(Minv),
                                             torch.from_numpy(index))


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
        ctx.system, ctx.m, ctx.p = system, m, p
        ctx.save_for_backward(z)
        ctx.shapes = [None if t is None else t.shape for t in (A, b, E, b_eq)]
        return z.clone()

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        system, m, p = ctx.system, ctx.m, ctx.p
        Minv = system.Minv if system.Minv.dtype == g.dtype else system.Minv.to(g.dtype)
        lam = torch.bmm(g.unsqueeze(-2), Minv).squeeze(-2)          # (M^-T g)^T, [B, n]
        lamG = g.new_zeros(g.shape[0], m + p + g.shape[1]).scatter_(1, system.index, lam)
        grads = [None] * 4
        for j, (lo, hi) in enumerate(((0, m), (m, m + p))):
            need_M, need_h = ctx.needs_input_grad[4 + 2 * j], ctx.needs_input_grad[5 + 2 * j]
            lam_j = lamG[:, lo:hi]
            if need_M:
                shape = ctx.shapes[2 * j]
                grads[2 * j] = -(lam_j.mT @ z if len(shape) == 2 else lam_j.unsqueeze(-1) * z.unsqueeze(-2))
            if need_h:
                grads[2 * j + 1] = lam_j
        return (None, None, None, None, *grads)


def square_output(prob, z_star, system):
    """``z*`` carrying the active-set Jacobian w.r.t. ``A, b, A_eq, b_eq`` (see
    :class:`_SquareVertex`); ``z*`` itself where no data requires grad."""
    E, b_eq = (None, None) if prob.A_eq is None else (prob.A_eq.A, prob.b_eq)
    data = (prob.A.A, prob.b, E, b_eq)
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in data):
        return z_star
    return _SquareVertex.apply(z_star.detach(), system, prob.m, prob.p, *data)
