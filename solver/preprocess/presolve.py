r"""Simple presolve before Newton: empty rows and columns, singleton equality rows (fixed
variables).  Each reduction is an exact substitution, so the reduced LP has the same optimum;
the backward is then taken on the LP as given with the full active set (the removed rows'
zeros have derivatives of their own), :func:`solver.output.assemble`.

* Empty row of ``A`` (``0 <= b_i``): dropped, multiplier 0; ``b_i < 0`` in some LP: that LP is
  infeasible (typed error naming it).  Empty row of ``A_eq``: dropped if ``b_eq = 0`` (to
  roundoff), else infeasible.
* Singleton equality row ``a z_j = \beta``: fixes ``z_j = \beta / a`` (infeasible where
  negative); column ``j`` leaves the LP, ``b -= A_{:j} z_j``, ``b_{eq} -= A_{eq,:j} z_j``.  Its
  multiplier comes back from column ``j``'s stationarity,
  ``w = -(c_j + A_{:j}^\top u_A + A_{eq,:j}^\top u_{eq}) / a`` (other rows), and ``u_{z,j} = 0``.
* Empty column with ``c_j >= 0`` in every LP: ``z_j = 0``, ``u_{z,j} = c_j``.  (With some
  ``c_j < 0`` it stays: the LP is then unbounded or infeasible, which the solver reports.)

One pass of each, in that order, then the empty rows again (a singleton row's column can leave
another row empty).  Scope: unbatched dense or ``torch.sparse`` operators (the structure is
shared by the batch; ``b`` and ``c`` are per LP); anything else is solved as given.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lpmetrics.solver.errors import LPSolverError
from lpmetrics.solver.operators import DenseOperator, SparseOperator
from lpmetrics.solver.problem import LPProblem


@dataclass
class Reduction:
    rows: torch.Tensor          # [m] bool, rows of A kept
    eq_rows: torch.Tensor       # [p] bool, rows of A_eq kept
    cols: torch.Tensor          # [n] bool, variables kept
    fixed: torch.Tensor         # [B, n] values of the removed variables (0 where kept)
    singles: list               # (eq row k, column j, coefficient a) of the singleton rows


def _counts(op, dim):
    """Nonzeros per row (``dim=1``) or column (``dim=0``) of an unbatched operator."""
    if type(op) is DenseOperator:
        return (op.A.detach() != 0).sum(dim)
    keep = op.values.detach() != 0
    idx = op.row if dim == 1 else op.col
    size = op.shape[0] if dim == 1 else op.shape[1]
    return torch.zeros(size, dtype=torch.long, device=idx.device).index_add(
        0, idx[keep], torch.ones_like(idx[keep]))


def _entries(op, row):
    """(column, value) pairs of row ``row`` (values differentiable)."""
    if type(op) is DenseOperator:
        j = int((op.A.detach()[row] != 0).nonzero()[0])
        return j, op.A[row, j]
    k = int(((op.row == row) & (op.values.detach() != 0)).nonzero()[0])
    return int(op.col[k]), op.values[k]


def _column(op, j, B):
    """Column ``j`` as ``[rows]`` (differentiable)."""
    if type(op) is DenseOperator:
        return op.A[:, j]
    out = torch.zeros(op.shape[0], dtype=op.values.dtype, device=op.values.device)
    sel = op.col == j
    return out.index_add(0, op.row[sel], op.values[sel])


def _submatrix(op, rows, cols):
    if type(op) is DenseOperator:
        return DenseOperator(op.A[rows][:, cols])
    rmap = torch.cumsum(rows.long(), 0) - 1
    cmap = torch.cumsum(cols.long(), 0) - 1
    keep = rows[op.row] & cols[op.col]
    idx = torch.stack([rmap[op.row[keep]], cmap[op.col[keep]]])
    return SparseOperator(idx, op.values[keep], (int(rows.sum()), int(cols.sum())))


def _infeasible(what, bad):
    idx = bad.nonzero().flatten().tolist()
    return LPSolverError(
        f"LP infeasible (batch instances {idx[:10]}{'...' if len(idx) > 10 else ''}; found by "
        f"presolve): {what}. Check how the constraints are built (signs of b, contradictory "
        f"equalities) or relax them, e.g. with slack variables.", kind="infeasible",
        instances=idx)


@torch.no_grad()
def _plan(prob, tol):
    """Which rows/columns go, and the singleton rows; raises on an infeasible reduction."""
    m, p, n = prob.m, prob.p, prob.n
    dev = prob.device
    rows = _counts(prob.A, 1) > 0 if m else torch.zeros(0, dtype=torch.bool, device=dev)
    bad = (prob.b[:, ~rows] < -tol * prob.h_scale.unsqueeze(-1)).any(-1) if m else None
    if bad is not None and bool(bad.any()):
        raise _infeasible("an all-zero row of A has b < 0", bad)
    eq_rows = torch.ones(p, dtype=torch.bool, device=dev)
    singles = []
    if p:
        cnt = _counts(prob.A_eq, 1)
        zero = cnt == 0
        bad = (prob.b_eq[:, zero].abs() > tol * prob.h_scale.unsqueeze(-1)).any(-1)
        if bool(bad.any()):
            raise _infeasible("an all-zero row of A_eq has b_eq != 0", bad)
        eq_rows &= ~zero
        taken = set()
        for k in (cnt == 1).nonzero().flatten().tolist():
            j, a = _entries(prob.A_eq, k)
            if j not in taken:          # a second singleton on j stays as a row (consistency
                taken.add(j)            # is then checked by the solver itself)
                singles.append((k, j, a))
                eq_rows[k] = False
    cols = torch.ones(n, dtype=torch.bool, device=dev)
    for _, j, _a in singles:
        cols[j] = False
    used = _counts(prob.A, 0) if m else torch.zeros(n, dtype=torch.long, device=dev)
    if p:
        used = used + _counts(prob.A_eq, 0)
    empty = (used == 0) & (prob.c.detach() >= 0).all(0)
    cols &= ~empty
    return rows, eq_rows, cols, singles


def presolve(prob, tol=1e-9):
    """``(reduced LPProblem, Reduction)``, or ``(prob, None)`` when nothing reduces or the
    LP is out of scope (see the module docstring)."""
    ops = [prob.A] + ([prob.A_eq] if prob.A_eq is not None else [])
    if not all(type(op) in (DenseOperator, SparseOperator) and op.batch_size is None
               for op in ops):
        return prob, None
    rows, eq_rows, cols, singles = _plan(prob, tol)
    if bool(rows.all()) and bool(eq_rows.all()) and bool(cols.all()):
        return prob, None
    fixed = torch.zeros(prob.B, prob.n, dtype=prob.dtype, device=prob.device)
    b, b_eq = prob.b, prob.b_eq
    for k, j, a in singles:
        zj = prob.b_eq[:, k] / a                         # differentiable in b_eq and A_eq
        if bool((zj.detach() < -tol * prob.h_scale).any()):
            raise _infeasible(f"equality row {k} fixes z_{j} = b_eq / a < 0",
                              zj.detach() < -tol * prob.h_scale)
        fixed = fixed.index_put((torch.arange(prob.B), torch.full((prob.B,), j)), zj)
        if prob.m:
            b = b - zj.unsqueeze(-1) * _column(prob.A, j, prob.B)
        b_eq = b_eq - zj.unsqueeze(-1) * _column(prob.A_eq, j, prob.B)
    if not bool(cols.any()) or not (bool(rows.any()) or bool(eq_rows.any())):
        return prob, None  # nothing would be left to solve: the solver handles it as given
    keep_rows = rows
    A = _submatrix(prob.A, keep_rows, cols)
    E = _submatrix(prob.A_eq, eq_rows, cols) if prob.p and bool(eq_rows.any()) else None
    red = LPProblem(prob.c[:, cols], A, b[:, keep_rows], E,
                    None if E is None else b_eq[:, eq_rows], prob.batch_shape)
    return red, Reduction(keep_rows, eq_rows, cols, fixed, singles)


def restore(prob, red, z, uA, uz, uE):
    """Map a reduced solution back (values only: the caller attaches the backward on the LP
    as given, :func:`solver.output.assemble`)."""
    B, dev, dt = prob.B, prob.device, z.dtype
    z_full = red.fixed.to(dt).index_copy(1, red.cols.nonzero().flatten(), z)
    with torch.no_grad():
        uA_full = torch.zeros(B, prob.m, dtype=dt, device=dev)
        uA_full[:, red.rows] = uA
        uz_full = torch.zeros(B, prob.n, dtype=dt, device=dev)
        uz_full[:, red.cols] = uz
        uE_full = None
        if prob.p:
            uE_full = torch.zeros(B, prob.p, dtype=dt, device=dev)
            if uE is not None:
                uE_full[:, red.eq_rows] = uE
        # removed empty columns: stationarity c_j - u_z,j = 0
        empty = ~red.cols & ~_single_cols(red, prob.n, dev)
        uz_full[:, empty] = prob.c.detach()[:, empty].to(dt)
        for k, j, a in red.singles:     # column j's stationarity gives the singleton's w
            e = torch.zeros(B, prob.n, dtype=dt, device=dev)
            e[:, j] = 1.0
            s = prob.c.detach()[:, j].to(dt) + (prob.A.rmatvec(uA_full.to(prob.dtype))
                                                 .detach()[:, j].to(dt) if prob.m else 0.0)
            s = s + prob.A_eq.rmatvec(uE_full.to(prob.dtype)).detach()[:, j].to(dt)
            uE_full[:, k] = -s / float(a.detach())
    return z_full, uA_full, uz_full, uE_full


def restore_masks(prob, red, active, active_bounds, z_full):
    """Full-size ``active`` / ``active_bounds``: removed rows inactive, removed variables at
    their bound where their value is 0."""
    act = torch.zeros(prob.B, prob.m, dtype=torch.bool, device=prob.device)
    act[:, red.rows] = active
    bnd = (z_full.detach() == 0).clone()
    bnd[:, red.cols] = active_bounds
    return act, bnd


def _single_cols(red, n, dev):
    out = torch.zeros(n, dtype=torch.bool, device=dev)
    for _, j, _a in red.singles:
        out[j] = True
    return out
