"""One LP instance's constraint matrix as a scipy matrix (for HiGHS and the sparse factorisation).

``to_scipy(op, i)`` returns ``A`` of batch instance ``i`` in float64 on the host: a
``scipy.sparse.csr_matrix`` for sparse, diagonal and stacked operators (never densified), a
numpy array for dense ones.  An operator this module does not know goes through its
``dense()`` (correct, but dense: give a new structured operator a branch here).

The result is plain data (detached): the differentiable path always goes through the operator's
torch products, never through these copies.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import torch

from lpmetrics.solver.operators import DenseOperator, DiagonalOperator, LinearOperator, SparseOperator
from lpmetrics.solver.stacked import HStackOperator, VStackOperator


try:    # scipy's CSR kernels (pinned scipy): the product without the matrix object's dispatch
    from scipy.sparse import _sparsetools
except ImportError:      # pragma: no cover - another scipy: the matrix object's product
    _sparsetools = None


class HostCSR(NamedTuple):
    """A CSR matrix as its arrays (``indptr``, ``indices``: one integer dtype; ``data``
    float64), e.g. those of a ``torch.sparse_csr_tensor`` shared without a copy: what HiGHS
    and the host certificate read (:mod:`solver.backends.host_highs`), without a scipy matrix object
    (whose construction checks cost more than the products on an ``n = 500`` LP)."""
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple

    def tocsr(self) -> sp.csr_matrix:
        return sp.csr_matrix((self.data, self.indices, self.indptr), shape=self.shape)


def csr_matvec(X, x: np.ndarray) -> np.ndarray:
    """``X @ x`` for a numpy array, a scipy CSR matrix or a :class:`HostCSR` ``X``; for the
    latter two scipy's own CSR kernel, so both give the same bits."""
    if isinstance(X, np.ndarray):
        return X @ x
    if _sparsetools is None:
        return (X.tocsr() if isinstance(X, HostCSR) else X) @ x
    y = np.zeros(X.shape[0], dtype=np.result_type(X.data, x))
    _sparsetools.csr_matvec(X.shape[0], X.shape[1], X.indptr, X.indices, X.data, x, y)
    return y


def _np(t: torch.Tensor):
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def to_scipy(op: LinearOperator, i: int = 0, sparse: bool = False):
    """``A`` of instance ``i`` (ignored for an unbatched ``op``); ``sparse=True`` also turns
    dense blocks into CSR (a sparse Gram matrix needs every block sparse)."""
    if isinstance(op, SparseOperator):
        keep = slice(None) if op.bidx is None else (op.bidx == i)
        rows, cols = (t[keep].detach().cpu().numpy() for t in (op.row, op.col))
        vals = _np(op.values[keep])
        key = rows.astype(np.int64) * op.shape[1] + cols
        if key.size and bool((np.diff(key) > 0).all()):
            # coalesced (row-major, no duplicates; what from_torch makes): the CSR arrays
            # directly, without the COO -> CSR sort
            indptr = np.searchsorted(rows, np.arange(op.shape[0] + 1))
            return sp.csr_matrix((vals, cols, indptr), shape=op.shape)
        return sp.csr_matrix((vals, (rows, cols)), shape=op.shape)
    if isinstance(op, DiagonalOperator):
        d = op.d if op.d.dim() == 1 else op.d[i]
        return sp.diags(_np(d), format="csr")
    if isinstance(op, (VStackOperator, HStackOperator)):
        parts = [to_scipy(b, i, sparse=True) for b in op.blocks]
        stack = sp.vstack if isinstance(op, VStackOperator) else sp.hstack
        return stack(parts, format="csr")
    if isinstance(op, DenseOperator):
        A = _np(op.A if op.A.dim() == 2 else op.A[i])
    else:
        A = op.dense()
        A = _np(A if A.dim() == 2 else A[i])
    return sp.csr_matrix(A) if sparse else A


def host_matrix(prob, name: str, i: int = 0, sparse: bool = False):
    """``to_scipy(prob.<name>, i)``, cached on the problem (its data are constant during a
    solve; an unbatched operator is converted once for the whole batch)."""
    op = getattr(prob, name)
    # these come back sparse whatever ``sparse`` says: one cached copy serves both callers
    sparse = sparse or isinstance(op, (SparseOperator, DiagonalOperator, VStackOperator,
                                       HStackOperator))
    key = (name, 0 if op.batch_size is None else i, sparse)
    cache = prob.__dict__.setdefault("_host_matrices", {})
    if key not in cache:
        cache[key] = to_scipy(op, key[1], sparse=sparse)
    return cache[key]


def row_counts(op: LinearOperator) -> torch.Tensor | None:
    """Nonzeros per row of ``A`` (the most over the batch), ``[m]``; ``None`` if ``op`` has a
    dense block.  ``sum(counts**2)`` bounds ``nnz(A^T W A)`` for every 0/1 ``W``."""
    if isinstance(op, SparseOperator):
        # counted once per pattern (eligibility checks and the solver choice each ask for it);
        # the key notices a new or in-place modified index tensor
        key = (id(op.indices), op.indices._version)
        counts = op.__dict__.get("_row_counts", {}).get(key)
        if counts is None:
            m = op.shape[0]
            if op.bidx is None:
                counts = torch.bincount(op.row, minlength=m)
            else:
                flat = torch.bincount(op.bidx * m + op.row, minlength=op.batch_size * m)
                counts = flat.view(op.batch_size, m).amax(0)
            op.__dict__["_row_counts"] = {key: counts}
        return counts
    if isinstance(op, DiagonalOperator):
        return torch.ones(op.shape[0], dtype=torch.long, device=op.d.device)
    if isinstance(op, (VStackOperator, HStackOperator)):
        parts = [row_counts(b) for b in op.blocks]
        if any(p is None for p in parts):
            return None
        return torch.cat(parts) if isinstance(op, VStackOperator) else sum(parts)
    return None


# a row of A with more nonzeros than this (and than a tenth of n) is "dense": alone it would
# fill A^T W A; up to MAX_DENSE_ROWS such rows the sparse Newton solve takes them as a
# low-rank update of the rest (solver.backends.sparse_factor) instead of factorising a dense K -- up to
# DENSE_ROWS_MAX_N variables: the minimum-norm solves (recovery, backward) of a non-square
# active set still factorise K with those rows in, i.e. a dense n x n matrix, which is what the
# dense Cholesky path costs anyway up to its own limit (linsolve: n <= 2048)
DENSE_ROW_MIN_NNZ = 32
MAX_DENSE_ROWS = 16
DENSE_ROWS_MAX_N = 2048


def dense_rows(prob, name: str = "A") -> np.ndarray:
    """Indices of the rows of ``prob.<name>`` (``"A"`` or ``"A_eq"``) that the sparse Newton
    solve takes as a low-rank update (:func:`dense_row_index` of the nonzero counts over the
    whole batch, :func:`row_counts`, so that every LP of a batch and :func:`gram_nnz` leave out
    the same rows)."""
    op = getattr(prob, name)
    counts = None if op is None else row_counts(op)
    if counts is None:
        return np.zeros(0, dtype=np.int64)
    return dense_row_index(counts.cpu().numpy(), prob.n)


def dense_row_index(counts: np.ndarray, n: int) -> np.ndarray:
    """The rows whose nonzero count ``counts [m]`` makes them "dense" (see ``DENSE_ROW_MIN_NNZ``);
    empty when there are none, more than ``MAX_DENSE_ROWS``, or ``n > DENSE_ROWS_MAX_N``."""
    if n > DENSE_ROWS_MAX_N:
        return np.zeros(0, dtype=np.int64)
    dense = np.flatnonzero(counts > max(DENSE_ROW_MIN_NNZ, n // 10))
    return np.zeros(0, dtype=np.int64) if dense.size > MAX_DENSE_ROWS else dense


def gram_nnz(prob) -> int | None:
    """Upper bound of ``nnz(K)`` for the sparse Newton matrix ``K`` of ``prob``
    (:func:`gram_nnz_of` the row counts of ``A`` and ``A_eq``); ``None`` when ``A`` or
    ``A_eq`` has a dense block (``K`` is then dense too)."""
    counts = [row_counts(op) for op in (prob.A, prob.A_eq) if op is not None]
    if any(k is None for k in counts):
        return None
    return gram_nnz_of(prob.n, [k.cpu().numpy() for k in counts])


def gram_nnz_of(n: int, counts: list) -> int:
    """``n`` + the ``sum_i nnz(row_i)^2`` of the rows counted in ``counts`` (one ``[m]`` array
    of nonzeros per row for ``A``, then ``A_eq``), without their :func:`dense_row_index`: those
    enter the sparse Newton matrix as a low-rank update."""
    nnz = n
    for k in counts:
        dense = dense_row_index(k, n)
        if dense.size:
            k = k.copy()
            k[dense] = 0
        nnz += int(np.square(k.astype(np.int64)).sum())
    return nnz
