r"""The two backward modes.

``active_set`` (default; seed 002 sec. 4.2): on the final active set ``T`` (active rows of
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

``unrolled``: the Newton iterations ran with autograd on (pattern held constant, seed 002
remark 3); the output keeps the exact value ``z*`` and takes the Jacobian of the final penalty
iterate ``z_eps`` (straight-through), as in the paper's appendix A.4 comparison.
"""
from __future__ import annotations

import torch


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
    F = prob.normal_residual(z_star, system.wA, system.wz)
    if not F.requires_grad:
        return z_star
    y = -_SolveK.apply(F, system)
    return z_star + (y - y.detach())


def unrolled_output(z_star, z_penalty):
    """``z*`` carrying the Jacobian of the unrolled Newton iterate."""
    z_star = z_star.detach()
    if not z_penalty.requires_grad:
        return z_star
    return z_star + (z_penalty - z_penalty.detach())
