r"""Generalized Newton method on the exterior penalty :math:`g_\varepsilon` (Meng et al. 2021,
eq. 3-5).

Iteration (Mangasarian 2004, "A Newton method for linear programming", JOTA 121, Algorithm 3.1;
Mangasarian 2006, "Exact 1-norm SVMs via unconstrained convex differentiable minimization",
JMLR 7, Algorithm 3.1):

.. math::  d = -(\partial^2 g(z) + \delta I)^{-1} \nabla g(z), \qquad z \leftarrow z + \lambda d,

with the generalized Hessian :math:`\partial^2 g = A^\top W_A A + W_z + A_{eq}^\top A_{eq}`
(0-1 diagonals of the violated rows).  ``step="armijo"`` backtracks :math:`\lambda = 1, 1/2,
\dots` until :math:`g(z+\lambda d) \le g(z) + \sigma\lambda\nabla g^\top d` (the globally
convergent choice of Mangasarian 2004, Thm. 3.2); ``step="fixed"`` uses the paper's constant
:math:`\lambda` (Meng et al. 2021, sec. 4.1).  The line search is cheap: along ``d`` the penalty is
a 1-D piecewise quadratic that needs only ``A d`` (one product) and elementwise work per trial.

Stopping rule: the dual residual :math:`\|\nabla g\|_\infty / \varepsilon` -- the KKT
stationarity residual of the recovered multipliers -- below ``tol`` (not a fixed iteration
count); an instance also stops when the active pattern repeats and the line search can no longer
decrease ``g`` (numerical convergence), or when ``|z|`` exceeds ``max_norm`` (divergence: the
penalty is unbounded below, i.e. the LP is unbounded or infeasible).

The 0-1 pattern is always detached: for ``backward="unrolled"`` autograd runs through the
iterations with the step function held constant (Meng et al. 2021, remark 3).
"""
from __future__ import annotations

import math
import time

import torch

from lpmetrics.solver.linsolve import NewtonSystem
from lpmetrics.solver.operators import DiagonalOperator


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
    safeguarded Newton on its piecewise-linear derivative (elementwise work only).

    The inequality rows and the bounds are handled as one stacked residual
    ``r(lam) = r0 + lam a`` with ``r0 = [rA; -z]``, ``a = [A d; -d]``; the linear-term and
    equality contributions to the derivative are constant (or linear) in ``lam`` and computed
    once, so each trial costs a handful of elementwise ops."""
    with torch.no_grad():
        z, d, rA = z.detach(), d.detach(), rA.detach()
        Ad = prob.A.matvec(d)
        r0 = torch.cat([rA, -z], -1)
        a = torch.cat([Ad, -d], -1)
        a2 = a.square()
        # phi'(lam) = c1 + lam * e2 + sum_i a_i (r0_i + lam a_i)_+ ;
        # phi''(lam) = e2 + sum_i [r0_i + lam a_i > 0] a_i^2
        c1 = eps * (prob.c_hat * d).sum(-1)
        e2 = None
        if rE is not None:
            Ed = prob.A_eq.matvec(d)
            c1 = c1 + (rE.detach() * Ed).sum(-1)
            e2 = Ed.square().sum(-1)

        def dphi(lam):
            r = torch.addcmul(r0, lam.unsqueeze(-1), a)
            g1 = c1 + (r.clamp_min(0) * a).sum(-1)
            g2 = ((r > 0) * a2).sum(-1)
            if e2 is not None:
                g1 = g1 + lam * e2
                g2 = g2 + e2
            return g1, g2

        zero = torch.zeros(z.shape[0], dtype=z.dtype, device=z.device)
        slope = c1 + (r0.clamp_min(0) * a).sum(-1)
        stalled = active & ~(slope < 0)
        skip = stalled | ~active
        rel = max(1e-10, 1e3 * torch.finfo(z.dtype).eps)
        if z.shape[0] == 1 and z.device.type == "cpu":
            # one LP: the same safeguarded Newton on Python scalars (per trial: one axpy and
            # two reductions instead of ~35 tensor dispatches on 1-element tensors)
            lam = _exact_scalar(r0[0], a[0], a2[0], float(c1[0]),
                                0.0 if e2 is None else float(e2[0]), float(slope[0]),
                                bool(skip[0]), rel, iters)
            return torch.full_like(zero, lam), stalled
        lo, hi = zero.clone(), torch.full_like(zero, float("inf"))
        lam = torch.ones_like(zero)
        thr = rel * slope.abs()
        for _ in range(iters):
            g1, g2 = dphi(lam)
            lo = torch.where(g1 < 0, lam, lo)
            hi = torch.where(g1 > 0, lam, hi)
            pos = g2 > 0
            newton = lam - g1 / torch.where(pos, g2, 1.0)
            bisect = torch.where(torch.isinf(hi), 2 * lam, 0.5 * (lo + hi))
            new = torch.where(pos & (newton > lo) & (newton < hi), newton, bisect)
            conv = (g1.abs() <= thr) | (new == lam) | skip
            lam = torch.where(conv, lam, new)
            if bool(conv.all()):
                break
        lam = torch.where(skip, zero, lam)
    return lam, stalled


def _exact_scalar(r0, a, a2, c1, e2, slope, skip, rel, iters):
    """:func:`_exact` for a single LP, bracket logic on Python floats (same iteration)."""
    if skip:
        return 0.0
    lo, hi, lam = 0.0, math.inf, 1.0
    thr = rel * abs(slope)
    for _ in range(iters):
        r = torch.add(r0, a, alpha=lam)
        g1 = c1 + lam * e2 + float((r.clamp_min(0) * a).sum())
        g2 = e2 + float(torch.where(r > 0, a2, 0.0).sum())
        if g1 < 0:
            lo = lam
        if g1 > 0:
            hi = lam
        newton = lam - g1 / (g2 if g2 > 0 else 1.0)
        if g2 > 0 and lo < newton < hi:
            new = newton
        else:
            new = 2 * lam if math.isinf(hi) else 0.5 * (lo + hi)
        if abs(g1) <= thr or new == lam:
            break
        lam = new
    return lam


def _newton_diagonal(prob, z, eps, *, delta, tol, max_iter, step_size, max_norm, update):
    """:func:`newton_penalty` for ``A = diag(a)`` (no equalities), fixed steps, no autograd:
    the same iteration written elementwise with the loop invariants (``eps c_hat``, ``a^2``,
    ``delta``) hoisted -- about half the dispatches per step of the generic loop, which on
    a few thousand coordinates is most of the cost."""
    B = prob.B
    a, b = prob.A.d, prob.b
    a2 = prob.A.gram_diag(torch.ones_like(a))          # d^2 (cached on the operator)
    if B == 1 and z.device.type == "cpu":
        return _newton_diagonal_one(prob, z, eps, a, a2, b, delta=delta, tol=tol,
                                    max_iter=max_iter, step_size=step_size,
                                    max_norm=max_norm, update=update)
    active = torch.ones(B, dtype=torch.bool, device=z.device) if update is None else update.clone()
    iters = torch.zeros(B, dtype=torch.long, device=z.device)
    diverged = torch.zeros_like(active)
    gnorm = torch.zeros_like(eps)
    eps_c = eps.unsqueeze(-1) * prob.c_hat
    delta_c = delta.unsqueeze(-1)
    for k in range(max_iter + 1):
        rA, grad, gnorm = diagonal_gradient(z, a, b, eps, eps_c)
        active = active & ~(gnorm <= tol)
        if k >= max_iter or not bool(active.any()):
            break
        d = diagonal_direction(z, rA, grad, a2, delta_c)
        all_active = bool(active.all())
        if not all_active:
            d = d * active.unsqueeze(-1).to(d.dtype)
        if all_active and step_size == 1.0:
            step_vec = d
        else:
            lam = torch.where(active, torch.full_like(eps, step_size), torch.zeros_like(eps))
            step_vec = lam.unsqueeze(-1) * d
        z = z + step_vec
        active, iters, diverged = after_step(z, step_vec, active, iters, diverged,
                                             step_size=step_size, max_norm=max_norm)
    return z, {"iterations": iters, "grad_norm": gnorm, "diverged": diverged,
               "stopped": ~active & ~diverged, "cg_iterations": 0}


def diagonal_gradient(z, a, b, eps, eps_c):
    """``A = diag(a)``: residual ``rA = a z - b``, penalty gradient and its stopping measure
    ``|grad|_inf / eps`` (shared with the fixed-iteration path, :mod:`solver.capture`)."""
    rA = a * z - b
    grad = eps_c + a * rA.clamp_min(0) - (-z).clamp_min(0)
    return rA, grad, grad.abs().amax(-1) / eps


def diagonal_direction(z, rA, grad, a2, delta_c):
    """The generalized Newton direction ``-grad / (w_A a^2 + w_z + delta)`` of a diagonal A."""
    diag = (rA > 0).to(z.dtype) * a2 + (z < 0).to(z.dtype) + delta_c
    return -(grad / diag)


def after_step(z, step_vec, active, iters, diverged, *, step_size, max_norm):
    """Per-LP bookkeeping after ``z += step_vec``: a step that no longer changes ``z`` stops
    the LP (numerically converged), an active LP is counted, ``|z|_inf > max_norm`` marks it
    diverged; all on the device.  Returns ``(active, iters, diverged)``."""
    z_abs = z.abs().amax(-1)
    if step_size > 0:   # lam > 0 exactly on the active LPs
        tiny = step_vec.abs().amax(-1) <= 100 * torch.finfo(z.dtype).eps * (1 + z_abs)
        active = active & ~tiny
    iters = iters + active.long()
    big = z_abs > max_norm
    diverged = diverged | (big & active)
    return active & ~big, iters, diverged


def _newton_diagonal_one(prob, z, eps, a, a2, b, *, delta, tol, max_iter, step_size,
                         max_norm, update):
    """:func:`_newton_diagonal` for a single LP: the bookkeeping (active / stopped /
    diverged / iteration count) on Python scalars instead of 1-element tensors."""
    active = True if update is None else bool(update[0])
    iters, diverged = 0, False
    eps_c = eps.unsqueeze(-1) * prob.c_hat
    delta_c = delta.unsqueeze(-1)
    tiny_c = 100 * torch.finfo(z.dtype).eps
    gnorm = torch.zeros_like(eps)
    for k in range(max_iter + 1):
        rA = a * z - b
        grad = eps_c + a * rA.clamp_min(0) + z.clamp_max(0)    # - (-z)_+ == + min(z, 0)
        gnorm = grad.abs().amax(-1) / eps
        active = active and not (float(gnorm) <= tol)
        if k >= max_iter or not active:
            break
        # = w_A d^2 + w_z + delta with 0/1 weights w_A = [rA > 0], w_z = [z < 0]
        diag = torch.where(rA > 0, a2, 0.0) + (z < 0) + delta_c
        if step_size == 1.0:     # z + (-q) == z - q exactly
            step_vec = grad / diag
            z = z - step_vec
        else:
            step_vec = step_size * -(grad / diag)
            z = z + step_vec
        z_abs, s_abs = torch.stack([z, step_vec]).abs().amax(-1).flatten().tolist()
        if step_size > 0 and s_abs <= tiny_c * (1 + z_abs):
            active = False
        iters += int(active)
        if z_abs > max_norm:
            diverged = diverged or active
            active = False
    dev = z.device
    return z, {"iterations": torch.tensor([iters], device=dev), "grad_norm": gnorm,
               "diverged": torch.tensor([diverged], device=dev),
               "stopped": torch.tensor([not active and not diverged], device=dev),
               "cg_iterations": 0}


class _StallWatch:
    """Per-LP progress tracker of the stall detector (``stall_steps``): progress is a penalty
    value below the best so far by a relative 1e-9, or a gradient norm below half the best so
    far; an LP without either for ``steps`` consecutive Newton steps is stalled.  (With the
    exact line search the penalty never increases, so "no decrease" really is no progress;
    the gradient test keeps a slow but converging tail alive.)"""

    def __init__(self, steps):
        self.steps, self.best_v, self.best_g, self.since = steps, None, None, None

    def __call__(self, prob, z, eps, rA, rE, gnorm):
        with torch.no_grad():
            v = prob.penalty_value(z.detach(), eps, rA.detach(),
                                   None if rE is None else rE.detach())
            if self.best_v is None:
                self.best_v, self.best_g = v, gnorm.clone()
                self.since = torch.zeros_like(v, dtype=torch.long)
                return torch.zeros_like(self.since, dtype=torch.bool)
            progress = (v < self.best_v - 1e-9 * self.best_v.abs()) | (gnorm < 0.5 * self.best_g)
            self.best_v = torch.minimum(self.best_v, v)
            self.best_g = torch.where(gnorm < 0.5 * self.best_g, gnorm, self.best_g)
            self.since = torch.where(progress, torch.zeros_like(self.since), self.since + 1)
            return self.since >= self.steps


def newton_penalty(prob, z, eps, *, method, delta, tol, max_iter, step="exact",
                   step_size=1.0, max_norm=1e10, update=None, phase1=False,
                   cg_tol=1e-10, cg_max_iter=500, sketch=None, stall_steps=None,
                   deadline=None):
    """Minimise ``g_eps`` from ``z`` for every LP of the batch.

    Args:
        z: ``[B, n]`` start; eps: ``[B]``; delta: ``[B]`` absolute regularisation.
        update: ``[B]`` bool, LPs to iterate (others are returned unchanged).
        phase1: minimise the infeasibility only (``eps = 0``; feasibility check).
        stall_steps: stop an LP that made no progress in that many steps (:class:`_StallWatch`).
        deadline: a ``time.perf_counter()`` value; past it every LP stops (checked per step).
    Returns:
        ``(z, info)`` with ``info = dict(iterations [B], grad_norm [B], diverged [B],
        stopped [B] (converged or numerically stalled), stalled [B] (the stall detector
        fired), timed_out bool, cg_iterations int)``.
    """
    if (method == "diagonal" and sketch is None and not phase1 and step == "fixed"
            and type(prob.A) is DiagonalOperator and prob.A_eq is None
            and not torch.is_grad_enabled()):
        return _newton_diagonal(prob, z, eps, delta=delta, tol=tol, max_iter=max_iter,
                                step_size=step_size, max_norm=max_norm, update=update)
    B = prob.B
    active = torch.ones(B, dtype=torch.bool, device=z.device) if update is None else update.clone()
    eps_eff = torch.zeros_like(eps) if phase1 else eps
    iters = torch.zeros(B, dtype=torch.long, device=z.device)
    diverged = torch.zeros_like(active)
    gnorm = torch.zeros_like(eps)
    prev = None
    cg_total = 0
    watch = _StallWatch(stall_steps) if stall_steps else None
    stalled_lp = torch.zeros_like(active)
    timed_out = False
    for k in range(max_iter + 1):
        rA, rE = prob.residuals(z)
        grad = prob.penalty_grad(z, eps_eff, rA, rE)
        g_abs = grad.detach().abs().amax(-1)
        gnorm = g_abs / (prob.h_scale if phase1 else eps)
        active = active & ~(gnorm <= tol)
        if watch is not None:
            stuck = active & watch(prob, z, eps_eff, rA, rE, gnorm)
            stalled_lp = stalled_lp | stuck
            active = active & ~stuck
        if deadline is not None and time.perf_counter() > deadline:
            timed_out = True
            break
        wA = (rA.detach() > 0).to(z.dtype)
        wz = (z.detach() < 0).to(z.dtype)
        # an LP still active at pass k has been active (and counted) at every earlier pass,
        # so ``iters.max() >= max_iter`` can first hold at k == max_iter: no host sync needed
        if k >= max_iter or not bool(active.any()):
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
               "stopped": ~active & ~diverged, "stalled": stalled_lp, "timed_out": timed_out,
               "cg_iterations": cg_total}
