"""Block operators: ``[A1; A2; ...]`` (rows stacked) and ``[A1 A2 ...]`` (columns stacked).

They let an objective assemble its constraint matrix from structured pieces (a diagonal block,
a sparse block, a small dense block) without materialising the whole matrix.
"""
from __future__ import annotations

import torch

from lpmetrics.solver.errors import LPInputError
from lpmetrics.solver.operators import LinearOperator, as_operator


def _common_batch(ops) -> int | None:
    sizes = {op.batch_size for op in ops if op.batch_size is not None}
    if len(sizes) > 1:
        raise LPInputError(f"stacked blocks have different batch sizes {sorted(sizes)}.")
    return sizes.pop() if sizes else None


class VStackOperator(LinearOperator):
    """``[A1; A2; ...]``: blocks with the same number of columns, rows concatenated."""

    def __init__(self, blocks):
        self.blocks = [as_operator(b) for b in blocks]
        if not self.blocks:
            raise LPInputError("VStackOperator needs at least one block.")
        ns = {b.shape[1] for b in self.blocks}
        if len(ns) != 1:
            raise LPInputError(f"VStackOperator blocks must share the column count, got {ns}.")
        self.rows = [b.shape[0] for b in self.blocks]
        self.shape = (sum(self.rows), ns.pop())
        self.batch_size = _common_batch(self.blocks)
        self.gram_is_diagonal = all(b.gram_is_diagonal for b in self.blocks)
        self.dense_gram_is_cheap = all(b.dense_gram_is_cheap for b in self.blocks)

    def _split(self, y):
        return torch.split(y, self.rows, dim=-1)

    def matvec(self, x):
        outs = [b.matvec(x) for b in self.blocks]
        lead = torch.broadcast_shapes(*[o.shape[:-1] for o in outs])
        return torch.cat([o.expand(*lead, o.shape[-1]) for o in outs], dim=-1)

    def rmatvec(self, y):
        return sum(b.rmatvec(part) for b, part in zip(self.blocks, self._split(y)))

    def gram_diag(self, w):
        return sum(b.gram_diag(part) for b, part in zip(self.blocks, self._split(w)))

    def gram(self, w):
        return sum(b.gram(part) for b, part in zip(self.blocks, self._split(w)))

    def dense(self):
        ds = [b.dense() for b in self.blocks]
        if self.batch_size is not None:
            ds = [d.expand(self.batch_size, *d.shape[-2:]) for d in ds]
        return torch.cat(ds, dim=-2)

    def tensors(self):
        return [t for b in self.blocks for t in b.tensors()]

    def to(self, dtype):
        return VStackOperator([b.to(dtype) for b in self.blocks])


class HStackOperator(LinearOperator):
    """``[A1 A2 ...]``: blocks with the same number of rows, columns concatenated."""

    def __init__(self, blocks):
        self.blocks = [as_operator(b) for b in blocks]
        if not self.blocks:
            raise LPInputError("HStackOperator needs at least one block.")
        ms = {b.shape[0] for b in self.blocks}
        if len(ms) != 1:
            raise LPInputError(f"HStackOperator blocks must share the row count, got {ms}.")
        self.cols = [b.shape[1] for b in self.blocks]
        self.shape = (ms.pop(), sum(self.cols))
        self.batch_size = _common_batch(self.blocks)
        self.gram_is_diagonal = False
        self.dense_gram_is_cheap = all(b.dense_gram_is_cheap for b in self.blocks)

    def matvec(self, x):
        return sum(b.matvec(part) for b, part in
                   zip(self.blocks, torch.split(x, self.cols, dim=-1)))

    def rmatvec(self, y):
        outs = [b.rmatvec(y) for b in self.blocks]
        lead = torch.broadcast_shapes(*[o.shape[:-1] for o in outs])
        return torch.cat([o.expand(*lead, o.shape[-1]) for o in outs], dim=-1)

    def gram_diag(self, w):
        outs = [b.gram_diag(w) for b in self.blocks]
        lead = torch.broadcast_shapes(*[o.shape[:-1] for o in outs])
        return torch.cat([o.expand(*lead, o.shape[-1]) for o in outs], dim=-1)

    def dense(self):
        ds = [b.dense() for b in self.blocks]
        if self.batch_size is not None:
            ds = [d.expand(self.batch_size, *d.shape[-2:]) for d in ds]
        return torch.cat(ds, dim=-1)

    def tensors(self):
        return [t for b in self.blocks for t in b.tensors()]

    def to(self, dtype):
        return HStackOperator([b.to(dtype) for b in self.blocks])
