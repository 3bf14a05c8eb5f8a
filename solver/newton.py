r"""Generalized Newton method on the exterior penalty :math:`g_\varepsilon` (seed 002 eq. 3-5).

Iteration (Mangasarian 2004, "A Newton method for linear programming", JOTA 121, Algorithm 3.1;
Mangasarian 2006, "Exact 1-norm SVMs via unconstrained convex differentiable minimization",
JMLR 7, Algorithm 3.1):

.. math::  d = -(\partial^2 g(z) + \delta I)^{-1} \nabla g(z), \qquad z \leftarrow z + \lambda d,

with the generalized Hessian :math:`\partial^2 g = A^\top W_A A + W_z + A_{eq}^\top A_{eq}`
(0-1 diagonals of the violated rows).  ``step="armijo"`` backtracks :math:`\lambda = 1, 1/2,
\dots` until :math:`g(z+\lambda d) \le g(z) + \sigma\lambda\nabla g^\top d` (the globally
convergent choice of Mangasarian 2004, Thm. 3.2); ``step="fixed"`` uses the paper's constant
:math:`\lambda` (seed 002 sec. 4.1).  The line search is cheap: along ``d`` the penalty is a 1-D
piecewise quadratic that needs only ``A d`` (one product) and elementwise work per trial.

Stopping rule: the dual residual :math:`\|\nabla g\|_\infty / \varepsilon` -- the KKT
stationarity residual of the recovered multipliers -- below ``tol`` (not a fixed iteration
count); an instance also stops when the active pattern repeats and the line search can no longer
decrease ``g`` (numerical convergence), or when ``|z|`` exceeds ``max_norm`` (divergence: the
penalty is unbounded below, i.e. the LP is unbounded or infeasible).

The 0-1 pattern is always detached: for ``backward="unrolled"`` autograd runs through the
iterations with the step function held constant (seed 002 remark 3).
"""
from __future__ import annotations

import torch

from solver.linsolve import NewtonSystem


def _line_phi(prob, z, d, eps, rA, rE, Ad, Ed, lam):
    """Penalty value at ``z + lam d`` from cached products (no new matvec)."""
    L = lam.unsqueeze(-1)
    v = eps * (prob.c_hat * (z + L * d)).sum(-1) \
        + 0.5 * (rA + L * Ad).clamp_min(0).square().sum(-1) \
        + 0.5 * (-(z + L * d)).clamp_min(0).square().sum(-1)
    if rE is not None:
        v = v + 0.5 * (rE + L * Ed).square().sum(-1)
    return v


def _armijo(prob, z, d, grad, eps, rA, rE, active, sigma=1e-4, max_halvings=40):
    with torch.no_grad():
        z, d, rA = z.detach(), d.detach(), rA.detach()
        rE = None if rE is None else rE.detach()
        Ad = prob.A.matvec(d)
        Ed = None if prob.A_eq is None else prob.A_eq.matvec(d)
        slope = (grad.detach() * d).sum(-1)
        zero = torch.zeros_like(slope)
        phi0 = _line_phi(prob, z, d, eps, rA, rE, Ad, Ed, zero)
        lam = torch.ones_like(slope)
        ok = ~active | (slope >= 0)
        for _ in range(max_halvings):
            phi = _line_phi(prob, z, d, eps, rA, rE, Ad, Ed, lam)
            ok = ok | (phi <= phi0 + sigma * lam * slope)
            if bool(ok.all()):
                break
            lam = torch.where(ok, lam, 0.5 * lam)
        # no sufficient decrease (or no descent) anywhere on the line: numerically stalled
        stalled = active & ((slope >= 0) | ~(phi <= phi0 + sigma * lam * slope))
        lam = torch.where(stalled, zero, lam)
    return lam, stalled


def _dphi(prob, z, d, eps, rA, rE, Ad, Ed, lam):
    """First and second derivative of the penalty along ``d`` at ``z + lam d``."""
    L = lam.unsqueeze(-1)
    ra = rA + L * Ad
    rz = -(z + L * d)
    g1 = eps * (prob.c_hat * d).sum(-1) + (ra.clamp_min(0) * Ad).sum(-1) \
        - (rz.clamp_min(0) * d).sum(-1)
    g2 = ((ra > 0) * Ad.square()).sum(-1) + ((rz > 0) * d.square()).sum(-1)
    if rE is not None:
        g1 = g1 + ((rE + L * Ed) * Ed).sum(-1)
        g2 = g2 + Ed.square().sum(-1)
    return g1, g2


def _exact(prob, z, d, grad, eps, rA, rE, active, iters=30):
    """Exact minimiser of the convex piecewise quadratic ``lam -> g(z + lam d)``, lam >= 0:
    safeguarded Newton on its piecewise-linear derivative (elementwise work only)."""
    with torch.no_grad():
        z, d, rA = z.detach(), d.detach(), rA.detach()
        rE = None if rE is None else rE.detach()
        Ad = prob.A.matvec(d)
        Ed = None if prob.A_eq is None else prob.A_eq.matvec(d)
        zero = torch.zeros(z.shape[0], dtype=z.dtype, device=z.device)
        slope, _ = _dphi(prob, z, d, eps, rA, rE, Ad, Ed, zero)
        stalled = active & ~(slope < 0)
        lo, hi = zero.clone(), torch.full_like(zero, float("inf"))
        lam = torch.ones_like(zero)
        rel = max(1e-10, 1e3 * torch.finfo(z.dtype).eps)
        for _ in range(iters):
            g1, g2 = _dphi(prob, z, d, eps, rA, rE, Ad, Ed, lam)
            lo = torch.where(g1 < 0, lam, lo)
            hi = torch.where(g1 > 0, lam, hi)
            newton = lam - g1 / torch.where(g2 > 0, g2, torch.ones_like(g2))
            bisect = torch.where(torch.isinf(hi), 2 * lam, 0.5 * (lo + hi))
            ok = (g2 > 0) & (newton > lo) & (newton < hi)
            new = torch.where(ok, newton, bisect)
            conv = (g1.abs() <= rel * slope.abs()) | (new == lam) | stalled | ~active
            lam = torch.where(conv, lam, new)
            if bool(conv.all()):
                break
        lam = torch.where(stalled | ~active, zero, lam)
    return lam, stalled


def newton_penalty(prob, z, eps, *, method, delta, tol, max_iter, step="exact",
                   step_size=1.0, max_norm=1e10, update=None, phase1=False,
                   cg_tol=1e-10, cg_max_iter=500, sketch=None):
    """Minimise ``g_eps`` from ``z`` for every LP of the batch.

    Args:
        z: ``[B, n]`` start; eps: ``[B]``; delta: ``[B]`` absolute regularisation.
        update: ``[B]`` bool, LPs to iterate (others are returned unchanged).
        phase1: minimise the infeasibility only (``eps = 0``; feasibility check).
    Returns:
        ``(z, info)`` with ``info = dict(iterations [B], grad_norm [B], diverged [B],
        stopped [B] (converged or numerically stalled), cg_iterations int)``.
    """
    B = prob.B
    active = torch.ones(B, dtype=torch.bool, device=z.device) if update is None else update.clone()
    eps_eff = torch.zeros_like(eps) if phase1 else eps
    iters = torch.zeros(B, dtype=torch.long, device=z.device)
    diverged = torch.zeros_like(active)
    gnorm = torch.zeros_like(eps)
    prev = None
    cg_total = 0
    for _ in range(max_iter + 1):
        rA, rE = prob.residuals(z)
        grad = prob.penalty_grad(z, eps_eff, rA, rE)
        g_abs = grad.detach().abs().amax(-1)
        gnorm = g_abs / (prob.h_scale if phase1 else eps)
        active = active & ~(gnorm <= tol)
        wA = (rA.detach() > 0).to(z.dtype)
        wz = (z.detach() < 0).to(z.dtype)
        if not bool(active.any()) or int(iters.max()) >= max_iter:
            break
        system = NewtonSystem(prob, wA, wz, delta, method, cg_tol=cg_tol,
                              cg_max_iter=cg_max_iter)
        if sketch is not None:
            d = -sketch.solve(prob, wA, wz, delta, grad)
        else:
            d = -system.solve(grad)
            cg_total += system.cg_iterations
        all_active = bool(active.all())
        if not all_active:
            d = d * active.unsqueeze(-1).to(d.dtype)
        if step in ("armijo", "exact"):
            search = _armijo if step == "armijo" else _exact
            lam, stalled = search(prob, z, d, grad, eps_eff, rA, rE, active)
            pattern = torch.cat([wA, wz], -1)
            if prev is not None:
                # same pattern and no decrease possible: the piecewise quadratic is minimised
                same = (pattern == prev).all(-1)
                active = active & ~(stalled & same)
            prev = pattern
        else:
            lam = torch.where(active, torch.full_like(eps, step_size), torch.zeros_like(eps))
        step_vec = d if (all_active and step not in ("armijo", "exact") and step_size == 1.0) \
            else lam.unsqueeze(-1) * d
        z = z + step_vec
        # numerically converged: the step no longer changes z
        z_abs = z.detach().abs().amax(-1)
        tiny = step_vec.detach().abs().amax(-1) <= 100 * torch.finfo(z.dtype).eps * (1 + z_abs)
        active = active & ~(tiny & (lam > 0))
        iters = iters + active.long()
        big = z_abs > max_norm
        diverged = diverged | (big & active)
        active = active & ~big
    return z, {"iterations": iters, "grad_norm": gnorm, "diverged": diverged,
               "stopped": ~active & ~diverged, "cg_iterations": cg_total}
