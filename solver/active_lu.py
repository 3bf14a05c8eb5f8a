r"""The square active system factorised by a sparse LU: ``K_T^+ = M^{-1} M^{-T}``.

At a nondegenerate vertex the active set ``T`` (active rows of ``A z <= b``, every row of
``A_eq z = b_eq``, active bounds ``z_j = 0``) has exactly ``n`` rows and the stacked matrix
:math:`M = [A_T; A_{eq}; I_{Z}]` is square and nonsingular.  Then
:math:`K_T = M^\top M` and :math:`K_T^{+} = K_T^{-1} = M^{-1} M^{-\top}`: one sparse LU of
``M`` (SuperLU, ``scipy.sparse.linalg.splu``) gives every solve the recovery and the
active-set backward need, as a transpose solve followed by a plain one.  ``M`` has the nonzeros
of the active rows only, whereas ``K_T`` is dense as soon as one active row is (a budget row
``1^T z <= s`` fills all of ``A^T W A``): on the issue-20 LP (n = 500, one ones-row) the
normal equations were a dense ``500 x 500`` eigen/Cholesky factorisation, the LU of ``M`` has
a few thousand nonzeros.  It is also better conditioned (``cond(M)`` instead of ``cond(M)^2``).

Used by :class:`solver.linsolve.NewtonSystem` for the minimum-norm solves (``pinv=True``) of
CPU problems whose ``A`` / ``A_eq`` are sparse (no dense block), whenever every LP of the
batch has a square active system with no tiny pivot (``_PIVOT_MIN`` relative); otherwise
(degenerate vertex, more or fewer rows than ``n``, numerically singular) the caller keeps its
least-squares path.  Nothing here forms a dense ``[m, n]`` or ``[n, n]`` matrix.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import splu

from solver.scipy_ops import host_matrix, row_counts

# a pivot of U below this fraction of the largest marks M numerically singular (cond(M) above
# ~1e10 relative: the normal-equations path, whose eigen filter drops directions below
# ~10 n eps64 of K's top eigenvalue, i.e. cond(M) > ~1e6-1e7, treats such M as singular too;
# the KKT check after the recovery certifies whichever path ran)
_PIVOT_MIN = 1e-10
# smallest n for the LU: below it the batched dense solve is as fast and has no Python loop
ACTIVE_LU_MIN_N = 16


def eligible(prob) -> bool:
    """CPU data whose ``A`` and ``A_eq`` have no dense block (their host copy stays sparse)."""
    if prob.device.type != "cpu" or prob.n < ACTIVE_LU_MIN_N:
        return False
    return all(op is None or row_counts(op) is not None for op in (prob.A, prob.A_eq))


def nonsingular_lu(Mt):
    """SuperLU of the CSC matrix ``Mt``, or ``None`` where it is singular: exactly (SuperLU
    stops) or numerically (a pivot of ``U`` below ``_PIVOT_MIN`` of the largest)."""
    try:
        lu = splu(Mt)
    except RuntimeError:                           # an exactly zero pivot
        return None
    u = np.abs(lu.U.diagonal())
    if not u.size or u.min() <= _PIVOT_MIN * u.max():
        return None
    return lu


def active_rows(prob, i, rows):
    """``S = [A_T; A_eq]`` of LP ``i`` (the rows ``rows`` of ``A``, then every equality row) as
    CSR arrays ``(data, indices, row lengths)``, gathered from the host copies' arrays."""
    blocks = [(host_matrix(prob, "A", i, sparse=True).tocsr(), rows)]
    if prob.A_eq is not None:
        E = host_matrix(prob, "A_eq", i, sparse=True).tocsr()
        blocks.append((E, np.arange(E.shape[0])))
    lens, idx, dat = [], [], []
    for X, sel in blocks:
        start, cnt = X.indptr[sel], np.diff(X.indptr)[sel]
        # positions of the selected rows' nonzeros in X.indices / X.data
        pos = np.repeat(start - np.cumsum(cnt) + cnt, cnt) + np.arange(cnt.sum())
        lens.append(cnt)
        idx.append(X.indices[pos])
        dat.append(X.data[pos])
    return np.concatenate(dat), np.concatenate(idx), np.concatenate(lens)


def _active_matrix_t(prob, i, rows, bounds):
    """``M^T`` as a CSC matrix (the CSR arrays of ``M``, read column-wise: no conversion)."""
    dat, idx, lens = active_rows(prob, i, rows)
    lens = np.concatenate([lens, np.ones(bounds.size, dtype=np.int64)])
    indptr = np.concatenate([[0], np.cumsum(lens)])
    return sp.csc_matrix((np.concatenate([dat, np.ones(bounds.size)]),
                          np.concatenate([idx, bounds]).astype(np.int32),
                          indptr.astype(np.int32)), shape=(prob.n, prob.n))


class ActiveLU:
    """Per-LP sparse LU of the square active matrix ``M``; ``solve(r [B, n]) = K_T^{-1} r``.
    Build with :meth:`build`, which returns None where some LP's ``M`` is not square or is
    numerically singular."""

    def __init__(self, prob, lus):
        self.prob, self.lus = prob, lus

    @classmethod
    def build(cls, prob, wA, wz):
        wA = wA.detach().to(device="cpu", dtype=torch.float64).numpy()
        wz = wz.detach().to(device="cpu", dtype=torch.float64).numpy()
        p = 0 if prob.A_eq is None else prob.p
        sizes = (wA > 0).sum(-1) + (wz > 0).sum(-1) + p
        if not bool((sizes == prob.n).all()):      # degenerate or under-determined: lstsq
            return None
        lus = []
        for i in range(prob.B):
            Mt = _active_matrix_t(prob, i, np.flatnonzero(wA[i] > 0),
                                  np.flatnonzero(wz[i] > 0))
            lu = nonsingular_lu(Mt)                # M^T = P^T L U Q^T
            if lu is None:
                return None
            lus.append(lu)
        return cls(prob, lus)

    def solve(self, r: torch.Tensor) -> torch.Tensor:
        B, n = self.prob.B, self.prob.n
        r64 = r.detach().to(device="cpu", dtype=torch.float64).expand(B, n).numpy()
        # K^-1 r = M^-1 (M^-T r); lu factors M^T
        x = np.stack([lu.solve(lu.solve(np.ascontiguousarray(r64[i])), trans="T")
                      for i, lu in enumerate(self.lus)])
        return torch.from_numpy(x).to(device=r.device, dtype=r.dtype)
