"""One LP instance's constraint matrix as a scipy matrix (for HiGHS and the sparse factorisation).

``to_scipy(op, i)`` returns ``A`` of batch instance ``i`` in float64 on the host: a
``scipy.sparse.csr_matrix`` for sparse, diagonal and stacked operators (never densified), a
numpy array for dense ones.  An operator this module does not know goes through its
``dense()`` (correct, but dense: give a new structured operator a branch here).

The result is plain data (detached): the differentiable path always goes through the operator's
torch products, never through these copies.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from solver.operators import DenseOperator, DiagonalOperator, LinearOperator, SparseOperator
from solver.stacked import HStackOperator, VStackOperator


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
# low-rank update of the rest (solver.sparse_factor) instead of factorising a dense K -- up to
# DENSE_ROWS_MAX_N variables: the minimum-norm solves (recovery, backward) of a non-square
# active set still factorise K with those rows in, i.e. a dense n x n matrix, which is what the
# dense Cholesky path costs anyway up to its own limit (linsolve: n <= 2048)
DENSE_ROW_MIN_NNZ = 32
MAX_DENSE_ROWS = 16
DENSE_ROWS_MAX_N = 2048


def dense_rows(prob, name: str = "A") -> np.ndarray:
    """Indices of the rows of ``prob.<name>`` (``"A"`` or ``"A_eq"``) that the sparse Newton
    solve takes as a low-rank update (empty when there are none, more than ``MAX_DENSE_ROWS``,
    or ``n > DENSE_ROWS_MAX_N``); from the nonzero counts over the whole batch
    (:func:`row_counts`), so that every LP of a batch and :func:`gram_nnz` leave out the same
    rows."""
    op = getattr(prob, name)
    counts = None if op is None else row_counts(op)
    if counts is None or prob.n > DENSE_ROWS_MAX_N:
        return np.zeros(0, dtype=np.int64)
    dense = (counts > max(DENSE_ROW_MIN_NNZ, prob.n // 10)).nonzero().flatten()
    if dense.numel() > MAX_DENSE_ROWS:
        return np.zeros(0, dtype=np.int64)
    return dense.cpu().numpy()


def gram_nnz(prob) -> int | None:
    """Upper bound of ``nnz(K)`` for the sparse Newton matrix ``K`` of ``prob`` (``n`` + the
    ``sum_i nnz(row_i)^2`` of ``A`` and ``A_eq``, without their :func:`dense_rows`: those
    enter as a low-rank update); ``None`` when ``A`` or
    ``A_eq`` has a dense block (``K`` is then dense too)."""
    nnz = prob.n
    for name in ("A", "A_eq"):
        op = getattr(prob, name)
        if op is None:
            continue
        counts = row_counts(op)
        if counts is None:
            return None
        dense = dense_rows(prob, name)
        if dense.size:
            counts = counts.clone()
            counts[torch.from_numpy(dense).to(counts.device)] = 0
        nnz += int(counts.square().sum())
    return nnz
