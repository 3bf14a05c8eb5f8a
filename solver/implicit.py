r"""The two backward modes.

``active_set`` (default; Meng et al. 2021, sec. 4.2): on the final active set ``T`` (active rows of
``A z <= b``, all equality rows, active bounds ``z_j = 0``) the solution solves the normal
equations :math:`F(z,\theta) = G_T^\top(G_T z - h_T) = 0`, i.e. :math:`z^* = \tilde A^{-1}\tilde b`
for a square nonsingular active system, the least-squares solution for an over-determined
(primal degenerate) one.  The implicit function theorem gives
:math:`\partial z^* = -K_T^{+}\,\partial_\theta F`, :math:`K_T = G_T^\top G_T`.  We realise it
with autograd: ``y = -solve_K(F(z*, theta))`` where ``solve_K`` is a custom
:class:`torch.autograd.Function` whose backward is again a solve with the (symmetric, constant)
``K_T``; the output is ``z* + (y - y.detach())``: value ``z*``, Jacobian of ``y``.  Gradients
reach ``A`` (any operator), ``b``, ``A_eq``, ``b_eq`` through the operator's differentiable
products; ``dz*/dc = 0`` (a vertex is locally constant in ``c``); the objective value
``c^T z*`` still has gradient ``z*`` w.r.t. ``c``.  Cost: one solve with ``K_T`` and one
product with ``A``/``A^T``, independent of the number of Newton iterations.

``unrolled``: the Newton iterations ran with autograd on (pattern held constant, Meng et al. 2021,
remark 3); the output keeps the exact value ``z*`` and takes the Jacobian of the final penalty
iterate ``z_eps`` (straight-through), as in the paper's appendix A.4 comparison.
"""
from __future__ import annotations

import torch

from lpmetrics.solver.backends.square_active import SquareActiveLU, square_output
from lpmetrics.solver.operators import DiagonalOperator


class _SolveK(torch.autograd.Function):
    """``x = K^+ r`` with ``K`` symmetric and treated as a constant."""

    @staticmethod
    def forward(ctx, r, system):
        ctx.system = system
        return system.solve(r)

    @staticmethod
    def backward(ctx, grad):
        return ctx.system.solve(grad), None


def active_set_output(prob, z_star, system):
    """``z*`` carrying the implicit (active-set) Jacobian w.r.t. ``A, b, A_eq, b_eq``."""
    z_star = z_star.detach()
    if isinstance(system, SquareActiveLU):     # a square active system factorised on the host
        out = square_output(prob, z_star, system)
        if out is not None:
            return out
    if (system.method == "diagonal" and system.pinv and type(prob.A) is DiagonalOperator
            and prob.A_eq is None and not prob.A.d.requires_grad):
        # A = diag(a) constant: F = a w_A (a z - b) + w_z z, so -K_T^+ dF/db = a w_A K_T^+
        # is a constant diagonal and the implicit Jacobian is dz*/db = diag(a w_A K_T^+):
        # one product node instead of the graph of F and the solve
        if not prob.b.requires_grad:
            return z_star
        with torch.no_grad():
            if system._factor is None:
                system.solve(torch.zeros_like(z_star))
            g = prob.A.d * system.wA * system._factor
        return z_star + g * (prob.b - prob.b.detach())
    F = prob.normal_residual(z_star, system.wA, system.wz)
    if not F.requires_grad:
        return z_star
    if system.method == "diagonal" and system.pinv:
        # diagonal K_T^+: the solve is an elementwise product with a constant, which autograd
        # differentiates natively (same Jacobian as _SolveK, without a Python Function node)
        with torch.no_grad():
            if system._factor is None:
                system.solve(F.detach())
        y = -(F * system._factor)
    else:
        y = -_SolveK.apply(F, system)
    return z_star + (y - y.detach())


def unrolled_output(z_star, z_penalty):
    """``z*`` carrying the Jacobian of the unrolled Newton iterate."""
    z_star = z_star.detach()
    if not z_penalty.requires_grad:
        return z_star
    return z_star + (z_penalty - z_penalty.detach())
