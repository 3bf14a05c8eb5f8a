r"""Equilibration: Ruiz row and column scaling of a general LP before the Newton forward.

The exterior penalty weighs every row's violation by its own scale: a row 1e3 times longer than
another dominates ``A^T W A``, the eps rule's threshold and the active-set tolerances.  Classic
LPs (netlib's ``share2b``: entries from 0.01 to 103) then stall.  Ruiz's iteration (Ruiz 2001,
"A scaling algorithm to equilibrate both rows and columns norms in matrices", RAL-TR-2001-034)
divides each row of ``[A; A_eq]`` and each column by the square root of its largest entry,
``rounds`` times; the infinity norms of all rows and columns tend to 1.

With ``D_r, D_e, D_s`` the products of the factors the scaled LP is

.. math::  \min (D_s c)^\top \hat z \;\text{s.t.}\; D_r A D_s \hat z \le D_r b,\;
           D_e A_{eq} D_s \hat z = D_e b_{eq},\; \hat z \ge 0,

the same LP in ``z = D_s \hat z``.  Its multipliers map back as ``u_A = D_r \hat u_A``,
``u_{eq} = D_e \hat u_{eq}``, ``u_z = D_s^{-1} \hat u_z`` (stationarity
``D_s c + D_s A^\top D_r \hat u_A - \hat u_z + \dots = 0`` times ``D_s^{-1}``).

Exact backward: the factors are computed without autograd and the scaled data are
differentiable products of the caller's tensors with them, so ``z = D_s \hat z(D_r A D_s,
D_r b, ...)`` carries the active-set Jacobian of the scaled LP through those products.  The
map ``(A, b) -> z*`` does not depend on which constant factors were used, so holding them fixed
gives its exact derivative (``tests/test_solver_scaling.py`` checks with ``gradcheck``).

Scope: dense and ``torch.sparse`` operators, all unbatched (one set of factors shared by the
batch, whose ``c`` and ``b`` are scaled per LP) or all batched dense (factors per LP).
Structured operators, separable LPs and mixed batching are solved unscaled.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lpmetrics.solver.operators import DenseOperator, SparseOperator
from lpmetrics.solver.problem import LPProblem


@dataclass
class Scaling:
    r: torch.Tensor          # [m] or [B, m]
    re: torch.Tensor | None  # [p] or [B, p]
    s: torch.Tensor          # [n] or [B, n]


def _scalable(prob):
    ops = [prob.A] + ([prob.A_eq] if prob.A_eq is not None else [])
    if not all(type(op) in (DenseOperator, SparseOperator) for op in ops):
        return None
    if all(op.batch_size is None for op in ops):
        return "shared"
    if all(type(op) is DenseOperator and op.batch_size is not None for op in ops):
        return "batched"
    return None


def _abs_max_rows_cols(op, r, s, reduce_rows):
    """Largest ``|r_i a_ij s_j|`` per row (``reduce_rows``) or per column."""
    if op.shape[0] == 0:        # no rows (all removed by presolve): nothing to take a max of
        return r if reduce_rows else torch.zeros_like(s)
    if type(op) is DenseOperator:
        M = op.A.detach().abs() * r.unsqueeze(-1) * s.unsqueeze(-2)
        return M.amax(-1) if reduce_rows else M.amax(-2)
    v = op.values.detach().abs() * r[op.row] * s[op.col]
    idx, size = (op.row, op.shape[0]) if reduce_rows else (op.col, op.shape[1])
    return torch.zeros(size, dtype=v.dtype, device=v.device).scatter_reduce(
        0, idx, v, "amax", include_self=True)


def _inv_sqrt(x):
    # an empty row or column keeps factor 1 (nothing to equilibrate)
    return torch.where(x > 0, x.rsqrt(), torch.ones_like(x))


@torch.no_grad()
def ruiz_factors(prob, rounds):
    """The :class:`Scaling` of ``prob`` after ``rounds`` Ruiz rounds, or ``None`` where
    the LP is out of scope (see the module docstring)."""
    mode = _scalable(prob)
    if mode is None or rounds <= 0:
        return None
    lead = (prob.B,) if mode == "batched" else ()
    kw = dict(dtype=prob.dtype, device=prob.device)
    r = torch.ones(*lead, prob.m, **kw)
    re = torch.ones(*lead, prob.p, **kw) if prob.A_eq is not None else None
    s = torch.ones(*lead, prob.n, **kw)
    for _ in range(rounds):
        r = r * _inv_sqrt(_abs_max_rows_cols(prob.A, r, s, True))
        if re is not None:
            re = re * _inv_sqrt(_abs_max_rows_cols(prob.A_eq, re, s, True))
        col = _abs_max_rows_cols(prob.A, r, s, False)
        if re is not None:
            col = torch.maximum(col, _abs_max_rows_cols(prob.A_eq, re, s, False))
        s = s * _inv_sqrt(col)
    return Scaling(r, re, s)


def _scaled_op(op, r, s):
    if type(op) is DenseOperator:
        return DenseOperator(op.A * r.unsqueeze(-1) * s.unsqueeze(-2))
    return SparseOperator(op.indices, op.values * (r[op.row] * s[op.col]), op.shape,
                          op.batch_size)


def scale_problem(prob, sc: Scaling) -> LPProblem:
    """The equilibrated LP (differentiable in the caller's data; factors constant)."""
    return LPProblem(prob.c * sc.s, _scaled_op(prob.A, sc.r, sc.s), prob.b * sc.r,
                     None if prob.A_eq is None else _scaled_op(prob.A_eq, sc.re, sc.s),
                     None if prob.b_eq is None else prob.b_eq * sc.re, prob.batch_shape)
