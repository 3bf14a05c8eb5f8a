r"""Capture-safe solve of separable LPs: no host synchronisation in forward or backward.

For ``A = diag(a)`` (a :class:`solver.DiagonalOperator`, no equality rows: the binary-AUC,
one-vs-all and AUC_mu LPs of :mod:`objectives.pairwise`) the standard path
(:func:`solver.eps_loop.run_eps_loop`) spends its time not in arithmetic but in the host: every
Newton step asks "is any LP still active?", the recovery asks "did every LP pass?", the eps loop
asks "is the batch done?", and the finiteness check and the stats read tensors back.  On a GPU
each question is a synchronisation and a launch gap, and a CUDA graph cannot contain one.

This path runs the same algorithm (Mangasarian 2004, JOTA 121; Meng et al. 2021, sec. 4) with every
question answered on the device:

* ``fixed_eps_stages`` eps stages of ``fixed_iters`` generalized-Newton steps each (options
  :class:`solver.options.SolverOptions`), the step and the per-LP stopping rules shared with the
  standard path by import (:func:`solver.newton.diagonal_gradient`,
  :func:`~solver.newton.diagonal_direction`, :func:`~solver.newton.after_step`);
* an LP that has stopped (gradient below tol, a step that no longer moves ``z``, divergence)
  or whose eps stage passed the KKT check is *masked*: later steps and stages leave its iterate,
  its recovery and its eps unchanged, so the result equals the standard path's whenever the
  fixed counts cover the steps and stages the standard path needed;
* the recovery is :func:`solver.recover.recover` with ``fixed=True`` (every candidate and repair
  round computed, the early exits replaced by device masks);
* the backward is the standard active-set one (:func:`solver.implicit.active_set_output`), which
  for a diagonal ``K_T`` is one elementwise product;
* ``stats`` and ``instance_stats`` hold device tensors (``converged``, ``kkt_residual``,
  ``iterations`` (Newton steps until each LP stopped), ``diverged``, ``finite_input``, ...):
  nothing is read unless someone reads it.  A non-converged, divergent or non-finite LP is
  flagged there, never raised (raising would need the host).

A general LP (dense ``A``, equality rows) has no fixed-count Newton here: with a
``vertex_guess`` (a caller's closed-form vertex) it is certified with device masks instead
(:mod:`solver.capture.guess`); without one it is refused.

Example::

    >>> import torch
    >>> from lpmetrics.solver import DiagonalOperator, solve_lp
    >>> d = torch.randn(4096, dtype=torch.float64, requires_grad=True)   # pair margins
    >>> sol = solve_lp(torch.ones_like(d), DiagonalOperator(-torch.ones_like(d)), d - 0.01,
    ...                capture_safe=True)
    >>> sol.z.sum().backward()                     # no .item(), no bool(tensor) anywhere
    >>> bool(sol.stats["converged"])               # one sync, when you ask
    True
"""
from __future__ import annotations

import torch

from lpmetrics.solver.capture.guess import solve_guess
from lpmetrics.solver.eps_loop import merge_recovery
from lpmetrics.solver.errors import LPInputError
from lpmetrics.solver.implicit import active_set_output
from lpmetrics.solver.linsolve import NewtonSystem, diag_scale
from lpmetrics.solver.newton import after_step, diagonal_direction, diagonal_gradient
from lpmetrics.solver.operators import DiagonalOperator
from lpmetrics.solver.output import empty_solution
from lpmetrics.solver.problem import build_problem
from lpmetrics.solver.recover import recover
from lpmetrics.solver.solution import LPSolution

METHOD = "diagonal"


def check_capture_call(prob, opts, backward: str) -> None:
    """Reject, before any work, what the capture-safe path cannot do without the host."""
    separable = type(prob.A) is DiagonalOperator and prob.A_eq is None
    if not separable and opts.vertex_guess is None:
        raise LPInputError(
            f"capture_safe=True solves separable LPs (A a solver.DiagonalOperator, no "
            f"equality rows: the AUC-family LPs) by fixed-count Newton, and certifies a "
            f"vertex_guess of a dense LP (solver.capture.guess); got A={prob.A!r}"
            f"{' with equalities' if prob.A_eq is not None else ''} and no vertex_guess. "
            f"Pass vertex_guess or use capture_safe=False.")
    bad = [name for name, off in (("backward='unrolled'", backward == "active_set"),
                                  ("warm_start", opts.warm_start is None),
                                  ("vertex_guess on a separable LP",
                                   opts.vertex_guess is None or not separable),
                                  ("sketch", opts.sketch is None),
                                  # auto on a separable LP is Newton (no hand-off)
                                  ("forward='highs'", opts.forward in ("newton", "auto")),
                                  ("eps_warmup > 0", not opts.eps_warmup or not separable),
                                  ("step='exact'/'armijo'",
                                   opts.step in ("auto", "fixed") or not separable),
                                  ("linear_solver other than diagonal",
                                   opts.linear_solver in ("auto", METHOD) or not separable))
           if not off]
    if bad:
        raise LPInputError(f"capture_safe=True does not support {', '.join(bad)} (each needs "
                           f"host decisions); drop them or use capture_safe=False.")


def newton_fixed(prob, z, eps, *, delta, tol, iters, step_size, max_norm, update):
    """``iters`` masked generalized-Newton steps on ``g_eps`` for ``A = diag(a)``: the step of
    :func:`solver.newton._newton_diagonal`, with LPs outside ``update`` or already stopped left
    exactly unchanged.  Returns ``(z, iterations [B], diverged [B])``."""
    a, b = prob.A.d, prob.b
    a2 = prob.A.gram_diag(torch.ones_like(a))
    eps_c = eps.unsqueeze(-1) * prob.c_hat
    delta_c = delta.unsqueeze(-1)
    lam_on = torch.full_like(eps, step_size)
    active = update
    count = torch.zeros(prob.B, dtype=torch.long, device=z.device)
    diverged = torch.zeros_like(active)
    for _ in range(iters):
        rA, grad, gnorm = diagonal_gradient(z, a, b, eps, eps_c)
        active = active & ~(gnorm <= tol)
        d = diagonal_direction(z, rA, grad, a2, delta_c)
        step_vec = torch.where(active, lam_on, 0.0).unsqueeze(-1) * d
        z = torch.where(active.unsqueeze(-1), z + step_vec, z)
        active, count, diverged = after_step(z, step_vec, active, count, diverged,
                                             step_size=step_size, max_norm=max_norm)
    return z, count, diverged


@torch.no_grad()
def run_fixed(prob, opts):
    """:func:`solver.eps_loop.run_eps_loop` with fixed counts and masks (same returned dict)."""
    B = prob.B
    delta = opts.delta * diag_scale(prob)
    eps = torch.full((B,), opts.eps, dtype=prob.dtype, device=prob.device)
    z = torch.zeros(B, prob.n, dtype=prob.dtype, device=prob.device)
    done = torch.zeros(B, dtype=torch.bool, device=prob.device)
    diverged = torch.zeros_like(done)
    iters = torch.zeros(B, dtype=torch.long, device=prob.device)
    steps = torch.zeros_like(iters)
    acc, zp_acc = None, z
    last = opts.fixed_eps_stages - 1
    for stage in range(opts.fixed_eps_stages):
        todo = ~done & ~diverged
        # Newton's own stopping tolerance is tighter than the KKT check it feeds (as run_eps_loop)
        z, count, div = newton_fixed(prob, z, eps, delta=delta, tol=0.1 * opts.tol,
                                     iters=opts.fixed_iters, step_size=opts.step_size,
                                     max_norm=opts.max_norm, update=todo)
        iters = iters + count
        diverged = diverged | div
        rec = recover(prob, z, eps, method=METHOD, active_tol=opts.active_tol,
                      cg_tol=opts.cg_tol, cg_max_iter=4 * opts.cg_max_iter,
                      accept_tol=opts.tol, fixed=True)
        acc = merge_recovery(acc, rec, todo)
        zp_acc = torch.where(todo.unsqueeze(-1), z, zp_acc)
        done = done | (todo & (rec.kkt <= opts.tol) & ~div)
        if stage < last:   # LPs that are done or diverged keep their eps
            go_on = ~done & ~diverged
            eps = torch.where(go_on, eps * opts.eps_decay, eps)
            steps = steps + go_on.long()
    # K_T of the accepted active sets for the backward (a function of (wA, wz) alone)
    acc.system = NewtonSystem(prob, acc.wA, acc.wz, torch.zeros_like(eps), METHOD, pinv=True,
                              cg_tol=opts.cg_tol, cg_max_iter=4 * opts.cg_max_iter)
    return {"rec": acc, "zp": zp_acc, "eps": eps, "done": done, "diverged": diverged,
            "iterations": iters, "eps_steps": steps, "cg_iterations": 0}


def device_stats(prob, run, finite, method=METHOD):
    """``(stats, instance_stats)`` as device tensors: the batch's worst case (0-dim) and the
    per-LP values, under the names of :func:`solver.output.run_stats` plus ``diverged`` and
    ``finite_input``; strings and sizes stay Python values (they are static)."""
    rec = run["rec"]
    per = {"iterations": run["iterations"], "converged": run["done"],
           "diverged": run["diverged"], "kkt_residual": rec.kkt,
           "primal_infeasibility": rec.primal_inf, "dual_residual": rec.dual_res,
           "duality_gap": rec.gap, "active_count": rec.wA.sum(-1) + rec.wz.sum(-1),
           "eps": run["eps"], "eps_steps": run["eps_steps"]}
    stats = {"iterations": per["iterations"].amax(), "converged": per["converged"].all(),
             "diverged": per["diverged"].any(), "finite_input": finite,
             "kkt_residual": per["kkt_residual"].amax(),
             "primal_infeasibility": per["primal_infeasibility"].amax(),
             "dual_residual": per["dual_residual"].amax(),
             "duality_gap": per["duality_gap"].amax(),
             "active_count": per["active_count"].mean(), "eps": per["eps"].amin(),
             "eps_steps": per["eps_steps"].amax(), "linear_solver": method,
             "forward": "newton", "capture_safe": True, "cg_iterations": 0,
             "batch_size": prob.B}
    return stats, {k: prob.unflatten(v) for k, v in per.items()}


def solve_capture_safe(c, A, b, A_eq, b_eq, backward, opts) -> LPSolution:
    """:func:`solver.solve_lp` with ``capture_safe=True`` (see the module docstring)."""
    prob = build_problem(c, A, b, A_eq, b_eq, compute_dtype=opts.compute_dtype,
                         check_finite=False)
    check_capture_call(prob, opts, backward)
    if prob.B == 0:      # a static shape: no sync
        return empty_solution(prob, c, b, 0.0)
    separable = type(prob.A) is DiagonalOperator and prob.A_eq is None
    opts = opts.resolved(prob.dtype, separable=separable)
    with torch.no_grad():
        finite = torch.isfinite(sum(t.sum() for t in [prob.c, prob.b] + prob.A.tensors() + (
            [] if prob.A_eq is None else [prob.b_eq] + prob.A_eq.tensors())))
    if not separable:   # a general LP: its vertex_guess certified (check_capture_call)
        return solve_guess(prob, c, opts, finite)
    run = run_fixed(prob, opts)
    rec = run["rec"]
    z = active_set_output(prob, rec.z, rec.system)
    z_out = prob.unflatten(z, (prob.n,)).to(c.dtype)
    value = (prob.unflatten(prob.c, (prob.n,)).to(c.dtype) * z_out).sum(-1)
    stats, per = device_stats(prob, run, finite)
    return LPSolution(
        z=z_out, value=value, dual=prob.unflatten(rec.uA, (prob.m,)).to(c.dtype),
        active=prob.unflatten(rec.wA > 0, (prob.m,)), stats=stats, instance_stats=per,
        dual_eq=None, dual_bounds=prob.unflatten(rec.uz, (prob.n,)).to(c.dtype),
        active_bounds=prob.unflatten(rec.wz > 0, (prob.n,)),
        eps=prob.unflatten(run["eps"]), penalty_z=prob.unflatten(run["zp"], (prob.n,)))
