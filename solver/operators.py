"""Linear operators for the constraint matrix ``A`` (the protocol the Newton solver needs).

The Newton system of the exterior penalty (Mangasarian 2004, "A Newton method for linear
programming", JOTA 121; Meng et al. 2021, eq. 3-5) only touches ``A`` through

* ``matvec(x)``  = ``A x``            ``[B, n] -> [B, m]``
* ``rmatvec(y)`` = ``A^T y``          ``[B, m] -> [B, n]``
* ``gram_diag(w)`` = ``diag(A^T diag(w) A)``  ``[B, m] -> [B, n]`` (Jacobi preconditioner)
* ``gram(w)`` = ``A^T diag(w) A`` as a dense ``[B, n, n]`` (only for the Cholesky path)
* ``gram_is_diagonal``: ``A^T diag(w) A`` is diagonal for every ``w`` (each row of ``A`` has at
  most one nonzero), so the whole Newton system is solved elementwise in O(m);
  ``dense_gram_is_cheap``: ``gram`` is affordable (picks Cholesky over CG);
* ``dense()``, ``tensors()`` (data tensors: dtype/device/finiteness), ``to(dtype)``.

To add a structured operator, subclass :class:`LinearOperator` and implement these with
differentiable torch ops; ``matvec``/``rmatvec`` must broadcast over leading dimensions of
``x`` (the sketch passes ``[k, B, m]``).

Operators hold their data as tensors that may require grad; ``matvec``/``rmatvec`` are written
with ordinary differentiable torch ops, which is how gradients reach them (the active-set
backward differentiates ``A^T W (A z - b)`` at the solution, see :mod:`solver.implicit`).

Batching: an operator is either unbatched (shared by all LPs of a batch) or carries one leading
batch dimension ``B``; vectors are ``[B, k]``.
"""
from __future__ import annotations

import math

import torch

from lpmetrics.solver.errors import LPInputError


class LinearOperator:
    """Base class.  Subclasses set ``shape = (m, n)``, ``batch_size`` (``None`` if unbatched)
    and implement ``matvec``, ``rmatvec``, ``gram_diag``, ``dense`` and ``tensors``."""

    shape: tuple[int, int]
    batch_size: int | None = None
    gram_is_diagonal: bool = False
    dense_gram_is_cheap: bool = False

    def matvec(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rmatvec(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def gram_diag(self, w: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dense(self) -> torch.Tensor:
        """``[m, n]`` or ``[B, m, n]`` dense copy (tests, small problems)."""
        raise NotImplementedError

    def tensors(self) -> list[torch.Tensor]:
        """The data tensors (for dtype/device inference, finiteness checks, gradients)."""
        raise NotImplementedError

    def gram(self, w: torch.Tensor) -> torch.Tensor:
        """``A^T diag(w) A`` as a dense ``[B, n, n]``; default goes through :meth:`dense`."""
        d = self.dense()
        return (d * w.unsqueeze(-1)).transpose(-1, -2) @ d



    @property
    def dtype(self) -> torch.dtype:
        return self.tensors()[0].dtype

    @property
    def device(self) -> torch.device:
        return self.tensors()[0].device

    def to(self, dtype: torch.dtype) -> "LinearOperator":
        raise NotImplementedError

    def __repr__(self) -> str:
        bs = "" if self.batch_size is None else f"{self.batch_size} x "
        return f"{type(self).__name__}({bs}{self.shape[0]} x {self.shape[1]})"


class DenseOperator(LinearOperator):
    """A dense ``[m, n]`` or ``[B, m, n]`` tensor."""

    dense_gram_is_cheap = True

    def __init__(self, A: torch.Tensor):
        if A.dim() not in (2, 3):
            raise LPInputError(f"DenseOperator needs A of shape [m, n] or [B, m, n], got "
                               f"{tuple(A.shape)}; flatten extra batch dimensions first.")
        self.A = A
        self.shape = (A.shape[-2], A.shape[-1])
        self.batch_size = A.shape[0] if A.dim() == 3 else None

    # an unbatched A is applied as one matrix product ``x A^T`` (one GEMM for any leading
    # shape of x); a batched one as one bmm -- the generic broadcast ``A @ x[..., None]``
    # costs several extra expand/view dispatches per call, which dominate small LPs
    def matvec(self, x):
        if self.A.dim() == 2:
            return x @ self.A.mT
        if x.dim() == 2 and x.shape[0] == self.A.shape[0]:
            return torch.bmm(self.A, x.unsqueeze(-1)).squeeze(-1)
        return (self.A @ x.unsqueeze(-1)).squeeze(-1)

    def rmatvec(self, y):
        if self.A.dim() == 2:
            return y @ self.A
        if y.dim() == 2 and y.shape[0] == self.A.shape[0]:
            return torch.bmm(y.unsqueeze(-2), self.A).squeeze(-2)
        return (self.A.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1)

    def gram_diag(self, w):
        if self.A.dim() == 2:
            return w @ self.A.square()
        return (w.unsqueeze(-1) * self.A.square()).sum(-2)

    def gram(self, w):
        return (self.A * w.unsqueeze(-1)).transpose(-1, -2) @ self.A

    def dense(self):
        return self.A

    def tensors(self):
        return [self.A]

    def to(self, dtype):
        return DenseOperator(self.A.to(dtype))


class DiagonalOperator(LinearOperator):
    """``A = diag(d)`` (square ``n x n``); ``d`` is ``[n]`` or ``[B, n]`` and may require grad.

    The binary-AUC LP uses ``A = -I``: ``DiagonalOperator(-torch.ones(m))``.  Every Newton
    system with a diagonal operator is diagonal, so a solve costs O(m) time and memory.
    """

    gram_is_diagonal = True
    dense_gram_is_cheap = True

    def __init__(self, diag: torch.Tensor):
        if diag.dim() not in (1, 2):
            raise LPInputError(f"DiagonalOperator needs diag of shape [n] or [B, n], got "
                               f"{tuple(diag.shape)}.")
        self.d = diag
        self._d2 = None
        self.shape = (diag.shape[-1], diag.shape[-1])
        self.batch_size = diag.shape[0] if diag.dim() == 2 else None

    def matvec(self, x):
        return self.d * x

    def rmatvec(self, y):
        return self.d * y

    def gram_diag(self, w):
        if torch.is_grad_enabled() and self.d.requires_grad:
            return w * self.d.square()
        if self._d2 is None:
            self._d2 = self.d.detach().square()
        return w * self._d2

    def gram(self, w):
        return torch.diag_embed(self.gram_diag(w))

    def dense(self):
        return torch.diag_embed(self.d)

    def tensors(self):
        return [self.d]

    def to(self, dtype):
        return DiagonalOperator(self.d.to(dtype))


def _check_sparse_layout(A: torch.Tensor) -> None:
    """A CPU ``torch.sparse`` tensor's index arrays, checked (torch does not check them by
    default, and an index past the shape corrupts the conversion or crashes the host solvers,
    which do not check bounds either).  On other devices the check would be a host sync:
    skipped."""
    if A.device.type != "cpu" or A.layout not in (torch.sparse_coo, torch.sparse_csr):
        return
    if A.layout == torch.sparse_coo:
        idx = A._indices()
        bad = idx.numel() and (bool((idx < 0).any()) or bool(
            (idx.amax(1) >= torch.tensor(A.shape[:idx.shape[0]])).any()))
        what = "COO indices outside the shape"
    else:
        ptr, col = A.crow_indices(), A.col_indices()
        nnz = col.shape[-1]
        bad = ptr.shape[-1] != A.shape[-2] + 1 or bool((ptr[..., 0] != 0).any()) or \
            bool((ptr[..., -1] != nnz).any()) or bool((ptr.diff(dim=-1) < 0).any()) or \
            (col.numel() and (bool((col < 0).any()) or int(col.max()) >= A.shape[-1]))
        what = "CSR arrays that do not describe the shape (crow_indices from 0 to nnz, " \
               "non-decreasing; col_indices in [0, n))"
    if bad:
        raise LPInputError(f"sparse A of shape {tuple(A.shape)} has {what}; build it with "
                           f"torch.sparse_coo_tensor / sparse_csr_tensor from valid indices, "
                           f"or check them with torch.sparse.check_sparse_tensor_invariants.")


class SparseOperator(LinearOperator):
    """A sparse matrix in coordinate form: ``values[k]`` at ``(row[k], col[k])``.

    Build it from a ``torch.sparse`` COO or CSR tensor (``[m, n]`` shared by the batch, or
    ``[B, m, n]`` with one pattern per LP) with :meth:`from_torch`, or directly from
    ``indices`` (``[2, nnz]`` or ``[3, nnz]`` with the batch index first) and ``values``.
    Gradients flow to ``values`` (and from there to the torch.sparse tensor).
    """

    def __init__(self, indices: torch.Tensor, values: torch.Tensor, shape: tuple[int, int],
                 batch_size: int | None = None):
        if indices.dim() != 2 or indices.shape[0] not in (2, 3) or values.dim() != 1:
            raise LPInputError("SparseOperator needs indices [2 or 3, nnz] and values [nnz].")
        if (indices.shape[0] == 3) != (batch_size is not None):
            raise LPInputError("SparseOperator: 3-row indices (batch, row, col) need batch_size.")
        self.indices, self.values = indices, values
        self.shape = (int(shape[0]), int(shape[1]))
        self.batch_size = batch_size
        self.row, self.col = indices[-2], indices[-1]
        self.bidx = indices[0] if batch_size is not None else None

    @classmethod
    def from_torch(cls, A: torch.Tensor) -> "SparseOperator":
        _check_sparse_layout(A)
        if A.layout != torch.sparse_coo:
            A = A.to_sparse_coo()
        if A.sparse_dim() != A.dim() or A.dim() not in (2, 3):
            raise LPInputError("sparse A must be a fully sparse [m, n] or [B, m, n] tensor.")
        A = A.coalesce()
        batch = A.shape[0] if A.dim() == 3 else None
        return cls(A.indices(), A.values(), tuple(A.shape[-2:]), batch)

    def _apply(self, x, src, dst, size):
        # x: [B, k]; gather x at `src`, scale, scatter-add into `dst`
        if self.bidx is None:
            contrib = self.values * x[..., src]
            out = torch.zeros(*x.shape[:-1], size, dtype=contrib.dtype, device=contrib.device)
            return out.index_add(-1, dst, contrib)
        B = self.batch_size
        x = x.expand(B, x.shape[-1])
        contrib = self.values * x[self.bidx, src]
        out = torch.zeros(B * size, dtype=contrib.dtype, device=contrib.device)
        return out.index_add(0, self.bidx * size + dst, contrib).view(B, size)

    def matvec(self, x):
        return self._apply(x, self.col, self.row, self.shape[0])

    def rmatvec(self, y):
        return self._apply(y, self.row, self.col, self.shape[1])

    @property
    def dense_gram_is_cheap(self):
        # A^T W A is n x n: affordable for moderate n whatever m is (built sparse-sparse)
        return self.shape[1] <= 2048

    def gram_diag(self, w):
        sq = SparseOperator(self.indices, self.values.square(), self.shape, self.batch_size)
        return sq.rmatvec(w)

    def gram(self, w):
        if self.bidx is not None or (torch.is_grad_enabled() and self.values.requires_grad):
            return super().gram(w)
        A = torch.sparse_coo_tensor(torch.stack([self.row, self.col]), self.values,
                                    self.shape).coalesce()
        out = []
        lead = w.shape[:-1]
        # (the leading size spelled out: with m = 0 rows a -1 would be ambiguous)
        for wb in w.reshape(math.prod(lead), self.shape[0]):
            Aw = torch.sparse_coo_tensor(torch.stack([self.col, self.row]),
                                         self.values * wb[self.row], self.shape[::-1])
            out.append(torch.sparse.mm(Aw, A).to_dense())
        return torch.stack(out).reshape(*lead, *self.shape[1:], self.shape[1])

    def dense(self):
        size = self.shape if self.batch_size is None else (self.batch_size, *self.shape)
        out = torch.zeros(size, dtype=self.values.dtype, device=self.values.device)
        return out.index_put(tuple(self.indices), self.values, accumulate=True)

    def tensors(self):
        return [self.values]

    def to(self, dtype):
        return SparseOperator(self.indices, self.values.to(dtype), self.shape, self.batch_size)


def as_operator(A) -> LinearOperator:
    """Wrap a dense tensor / torch.sparse tensor / operator into a :class:`LinearOperator`."""
    if isinstance(A, LinearOperator):
        return A
    if isinstance(A, torch.Tensor):
        if A.layout in (torch.sparse_coo, torch.sparse_csr):
            return SparseOperator.from_torch(A)
        if A.layout == torch.strided:
            return DenseOperator(A)
    raise LPInputError(f"A must be a torch.Tensor (dense or torch.sparse COO/CSR) or a "
                       f"solver.LinearOperator, got {type(A).__name__}.")
