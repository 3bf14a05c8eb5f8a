r"""The batched LP, validated and flattened, with its exterior-penalty pieces.

LP (our form; Meng et al. 2021, section 3.1):

.. math::  \min_z c^\top z \quad\text{s.t.}\quad Az \le b,\; A_{eq} z = b_{eq},\; z \ge 0 .

Write every constraint as a row of :math:`G z \le h` with :math:`G = [A; -I]` and
:math:`h = [b; 0]` (equalities kept apart).  The exterior penalty (Meng et al. 2021, eq. 3;
Mangasarian 2004, JOTA 121, eq. (4)) is

.. math::  g_\varepsilon(z) = \varepsilon\,\hat c^\top z + \tfrac12\|(Az-b)_+\|^2
           + \tfrac12\|(-z)_+\|^2 + \tfrac12\|A_{eq}z-b_{eq}\|^2 ,

with :math:`\hat c = c/\|c\|_\infty`.  Its stationarity condition reads
:math:`\hat c + A^\top u_A - u_z + A_{eq}^\top u_{eq} = 0` with
:math:`u = (\text{residual})_+/\varepsilon`, i.e. the scaled residuals are exactly dual feasible
and, for :math:`\varepsilon \le \bar\varepsilon`, the least 2-norm dual optimum (Mangasarian
2004, Thm. 2.1; 2006, JMLR 7, Prop. 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lpmetrics.solver.errors import LPInputError
from lpmetrics.solver.operators import DenseOperator, LinearOperator, as_operator


@dataclass
class LPProblem:
    c: torch.Tensor                  # [B, n]
    A: LinearOperator                # (m, n), unbatched or batch B
    b: torch.Tensor                  # [B, m]
    A_eq: LinearOperator | None      # (p, n)
    b_eq: torch.Tensor | None        # [B, p]
    batch_shape: torch.Size          # the caller's leading shape (flattened to B)

    def __post_init__(self):
        self.B, self.n = self.c.shape
        self.m = self.b.shape[1]
        self.p = 0 if self.b_eq is None else self.b_eq.shape[1]
        # (few ops: on a small LP each op's dispatch is the cost)
        cmax = self.c.detach().abs().amax(-1)
        self.c_norm = cmax               # |c|_inf (detached; the KKT measures' scale)
        self.c_scale = torch.where(cmax > 0, cmax, 1.0)
        self.c_hat = self.c / self.c_scale.unsqueeze(-1)
        h = [t.detach() for t, rows in ((self.b, self.m), (self.b_eq, self.p)) if rows]
        hmax = (h[0] if len(h) == 1 else torch.cat(h, -1)).abs().amax(-1) if h else \
            torch.zeros_like(cmax)
        self.h_scale = 1.0 + hmax

    @property
    def dtype(self):
        return self.c.dtype

    @property
    def device(self):
        return self.c.device

    # ---- residuals, penalty ---------------------------------------------------------------
    def residuals(self, z):
        rA = self.A.matvec(z) - self.b
        rE = None if self.A_eq is None else self.A_eq.matvec(z) - self.b_eq
        return rA, rE

    def penalty_grad(self, z, eps, rA, rE):
        g = eps.unsqueeze(-1) * self.c_hat + self.A.rmatvec(rA.clamp_min(0)) - (-z).clamp_min(0)
        if rE is not None:
            g = g + self.A_eq.rmatvec(rE)
        return g

    def penalty_value(self, z, eps, rA, rE):
        v = eps * (self.c_hat * z).sum(-1) + 0.5 * rA.clamp_min(0).square().sum(-1) \
            + 0.5 * (-z).clamp_min(0).square().sum(-1)
        if rE is not None:
            v = v + 0.5 * rE.square().sum(-1)
        return v

    def normal_residual(self, z, wA, wz):
        """``F(z) = G_T^T (G_T z - h_T)`` on the row set ``T`` marked by the 0/1 weights."""
        rA, rE = self.residuals(z)
        F = self.A.rmatvec(wA * rA) + wz * z
        if rE is not None:
            F = F + self.A_eq.rmatvec(rE)
        return F

    def unflatten(self, t, tail=()):
        return t.reshape(tuple(self.batch_shape) + tuple(tail))


def _check_finite(name, t):
    if not torch.isfinite(t).all():
        raise LPInputError(f"{name} contains NaN or Inf; clean the inputs (e.g. torch.nan_to_num "
                           f"or check the upstream scores) before calling solve_lp.")


def _batch_of(op_or_tensor, is_op):
    if is_op:
        return torch.Size(()) if op_or_tensor.batch_size is None else \
            torch.Size((op_or_tensor.batch_size,))
    return op_or_tensor.shape[:-2]


def _as_matrix(name, M, n):
    """(operator, leading batch shape, rows)."""
    if M is None:
        return None, torch.Size(()), 0
    is_dense = isinstance(M, torch.Tensor) and M.layout == torch.strided
    if is_dense and M.dim() < 2:
        raise LPInputError(f"{name} must be [..., rows, n]; got shape {tuple(M.shape)}.")
    op = M if is_dense else as_operator(M)
    cols = op.shape[-1]
    if cols != n:
        raise LPInputError(f"{name} has {cols} columns but c has n = {n} entries; {name} must "
                           f"be [..., rows, {n}].")
    return op, _batch_of(op, not is_dense), op.shape[-2]


def build_problem(c, A, b, A_eq=None, b_eq=None, *, compute_dtype=None,
                  check_finite=True) -> LPProblem:
    """Validate shapes/dtypes/finiteness, broadcast the batch and flatten it to ``B``.
    ``check_finite=False`` skips the NaN/Inf check, the one host sync here (the capture-safe
    path, :mod:`solver.capture`, reports finiteness as a device flag instead)."""
    if not isinstance(c, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise LPInputError("c and b must be torch tensors.")
    if (A_eq is None) != (b_eq is None):
        raise LPInputError("pass both A_eq and b_eq, or neither.")
    if c.dim() < 1 or b.dim() < 1:
        raise LPInputError(f"c must be [..., n] and b [..., m]; got {tuple(c.shape)}, "
                           f"{tuple(b.shape)}.")
    if not c.is_floating_point() or c.dtype not in (torch.float32, torch.float64):
        raise LPInputError(f"c has dtype {c.dtype}; use float32 or float64.")
    n = c.shape[-1]
    if n == 0:
        raise LPInputError("empty problem: c has n = 0 variables.")
    Aop, batA, m = _as_matrix("A", A, n)
    Eop, batE, p = _as_matrix("A_eq", A_eq, n)
    if b.shape[-1] != m:
        raise LPInputError(f"b has {b.shape[-1]} entries but A has m = {m} rows.")
    if p and b_eq.shape[-1] != p:
        raise LPInputError(f"b_eq has {b_eq.shape[-1]} entries but A_eq has {p} rows.")
    if m + p == 0:
        raise LPInputError("empty problem: no constraints (m = 0 and no equalities); "
                           "min c^T z over z >= 0 alone is 0 or unbounded, no LP layer needed.")
    try:
        shapes = [c.shape[:-1], b.shape[:-1], batA, batE]
        if b_eq is not None:
            shapes.append(b_eq.shape[:-1])
        batch_shape = shapes[0] if all(sh == shapes[0] for sh in shapes) else \
            torch.broadcast_shapes(*shapes)
    except RuntimeError as err:
        raise LPInputError(f"batch dimensions do not broadcast: c {tuple(c.shape)}, "
                           f"b {tuple(b.shape)}, A batch {tuple(batA)}, A_eq batch "
                           f"{tuple(batE)} ({err}).") from None
    B = math.prod(batch_shape) if len(batch_shape) else 1
    dtype = compute_dtype or c.dtype
    tensors = [c, b] + ([b_eq] if b_eq is not None else [])
    for M in (Aop, Eop):
        if M is not None:
            tensors += [M] if isinstance(M, torch.Tensor) else M.tensors()
    for t in tensors:
        if t.dtype != c.dtype:
            raise LPInputError(f"mixed dtypes ({c.dtype} and {t.dtype}); cast all LP data to "
                               f"one of float32/float64.")
        if t.device != c.device:
            raise LPInputError(f"mixed devices ({c.device} and {t.device}); move all LP data "
                               f"to one device.")
    named = [(name, t) for name, t in (("c", c), ("b", b), ("b_eq", b_eq)) if t is not None]
    for name, M in (("A", Aop), ("A_eq", Eop)):
        for t in ([M] if isinstance(M, torch.Tensor) else (M.tensors() if M else [])):
            named.append((name, t))
    # one host sync for all the data: a sum is finite iff no entry is NaN/Inf (barring
    # overflow, which only sends us to the exact per-tensor check that names the culprit)
    if check_finite:
        with torch.no_grad():
            sums = [t.sum(dtype=torch.float64) for _, t in named]
            # (.item() syncs nothing on the CPU; on a GPU one transfer for all)
            sums = [v.item() for v in sums] if c.device.type == "cpu" else \
                torch.stack(sums).tolist()
    if check_finite and not all(math.isfinite(v) for v in sums):
        for name, t in named:
            _check_finite(name, t)

    def vec(t):
        if t.dtype == dtype and t.shape[:-1] == batch_shape and t.dim() <= 2:
            return t if t.dim() == 2 else t.unsqueeze(0)      # already [B, k] (or unbatched)
        return t.to(dtype).expand(*batch_shape, t.shape[-1]).reshape(B, t.shape[-1])

    def mat(M, bat):
        if isinstance(M, torch.Tensor):
            M = M.to(dtype)
            if len(bat) == 0:
                return DenseOperator(M)
            return DenseOperator(M.expand(*batch_shape, *M.shape[-2:]).reshape(B, *M.shape[-2:]))
        if M.batch_size is not None and M.batch_size != B:
            raise LPInputError(f"operator {M!r} has batch size {M.batch_size} but the batch "
                               f"is {tuple(batch_shape)} (= {B} LPs).")
        return M if dtype == M.dtype else M.to(dtype)

    return LPProblem(vec(c), mat(Aop, batA), vec(b),
                     None if Eop is None else mat(Eop, batE),
                     None if b_eq is None else vec(b_eq), torch.Size(batch_shape))
