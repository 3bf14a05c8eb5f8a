r"""The square active system factorised by a sparse LU: ``K_T^+ = M^{-1} M^{-T}``.

At a nondegenerate vertex the active set ``T`` (active rows of ``A z <= b``, every row of
``A_eq z = b_eq``, active bounds ``z_j = 0``) has exactly ``n`` rows and the stacked matrix
:math:`M = [A_T; A_{eq}; I_{Z}]` is square and nonsingular.  Then
:math:`K_T = M^\top M` and :math:`K_T^{+} = K_T^{-1} = M^{-1} M^{-\top}`: one sparse LU of
``M`` (SuperLU, ``scipy.sparse.linalg.splu``) gives every solve the recovery and the
active-set backward need, as a transpose solve followed by a plain one.  ``M`` has the nonzeros
of the active rows only, whereas ``K_T`` is dense as soon as one active row is (a budget row
``1^T z <= s`` fills all of ``A^T W A``): on the ``ones`` LP of ``scripts/solver/time_sparse_lp.py``
(n = 500) the normal equations were a dense ``500 x 500`` eigen/Cholesky factorisation, the LU of
``M`` has a few thousand nonzeros.  It is also better conditioned (``cond(M)`` instead of
``cond(M)^2``).

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

from lpmetrics.solver.backends.scipy_ops import HostCSR, host_matrix, row_counts

try:    # SuperLU as splu calls it (pinned scipy), without building a matrix for A and for U
    from scipy.sparse.linalg._dsolve._superlu import gstrf as _gstrf
except ImportError:      # pragma: no cover - another scipy: splu itself
    _gstrf = None
# splu's defaults (scipy.sparse.linalg.splu): the same factorisation as splu(M)
_SPLU_OPTIONS = dict(DiagPivotThresh=None, ColPerm=None, PanelSize=None, Relax=None)

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
    Mt.sum_duplicates()                            # (what splu does first: sorted, distinct)
    return lu_of_arrays(Mt.data, Mt.indices, Mt.indptr, Mt.shape[0])


def lu_of_arrays(data, indices, indptr, n):
    """:func:`nonsingular_lu` of the ``n x n`` CSC matrix with these arrays (sorted, distinct
    row indices in each column), without a scipy matrix object: SuperLU as
    ``scipy.sparse.linalg.splu`` calls it, with its default options, and the pivots read off
    the arrays of ``U``."""
    if _gstrf is None:                                    # pragma: no cover - another scipy
        lu = _splu_or_none(sp.csc_matrix((data, indices, indptr), shape=(n, n)))
        if lu is None:
            return None
        U = lu.U.tocsc()
        U = (U.data, U.indices, U.indptr)
    else:
        try:
            lu = _gstrf(n, data.size, data, indices.astype(np.intc, copy=False),
                        indptr.astype(np.intc, copy=False), csc_construct_func=_arrays,
                        ilu=False, options=_SPLU_OPTIONS)
        except RuntimeError:                              # an exactly zero pivot
            return None
        U = lu.U[0]
    u = _diagonal(*U, n)
    if not u.size or u.min() <= _PIVOT_MIN * u.max():
        return None
    return lu


def _splu_or_none(M):
    try:
        return splu(M)
    except RuntimeError:
        return None


def _arrays(arrays, shape):
    """SuperLU's constructor for ``L`` and ``U``: their CSC arrays as they are."""
    return arrays, shape


def _diagonal(data, indices, indptr, n):
    """``|diag|`` of the CSC matrix with these arrays (SuperLU's may be longer than the
    ``indptr[-1]`` entries they hold).  SuperLU writes each column of ``U`` with its diagonal
    entry last: checked, and the general search where it is not so."""
    last = indptr[1:] - 1
    if bool((indices[last] == np.arange(n)).all()):
        return np.abs(data[last])
    col = np.repeat(np.arange(n), np.diff(indptr))
    nnz = col.size
    data, indices = data[:nnz], indices[:nnz]
    on = indices == col
    u = np.zeros(n)
    u[col[on]] = np.abs(data[on])
    return u


def active_rows(prob, i, rows):
    """``S = [A_T; A_eq]`` of LP ``i`` (the rows ``rows`` of ``A``, then every equality row) as
    CSR arrays ``(data, indices, row lengths)``, gathered from the host copies' arrays."""
    E = None if prob.A_eq is None else host_matrix(prob, "A_eq", i, sparse=True)
    return stacked_rows(host_matrix(prob, "A", i, sparse=True), E, rows)


def stacked_rows(A, E, rows):
    """``[A[rows]; E]`` (``E``: ``None`` for no equality rows) of the CSR matrices ``A``, ``E``
    (scipy or :class:`solver.backends.scipy_ops.HostCSR`) as CSR arrays ``(data, indices, row
    lengths)``."""
    blocks = [(_csr(A), rows)]
    if E is not None:
        E = _csr(E)
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


def _csr(X):
    return X if isinstance(X, HostCSR) else X.tocsr()


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
