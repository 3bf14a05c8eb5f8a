r"""The eps rule: Newton on the exterior penalty, recovery, KKT check, smaller eps, repeat.

Mangasarian 2004 ("A Newton method for linear programming", JOTA 121, Thm. 2.1 and Algorithm 3.1)
and Meng et al. 2021 (sec. 4.1-4.2): for every :math:`\varepsilon \le \bar\varepsilon` the
minimiser of the exterior penalty :math:`g_\varepsilon` (:mod:`solver.problem`) gives, by
thresholding its residuals, the exact least 2-norm dual solution of the LP, so the vertex that
the active set recovers (:mod:`solver.recover`) stops changing once eps is small enough and the
KKT check passes.  :func:`run_eps_loop` runs that rule for a whole batch:

1. minimise :math:`g_\varepsilon` by generalized Newton (:mod:`solver.newton`), warm-started
   across eps, after Newton-only warm-up stages at larger eps (``eps_warmup``, see
   :class:`solver.options.SolverOptions`: they let the first steps see the rows);
2. threshold the residuals into multipliers, recover the primal vertex from the active set by
   one linear solve and check the KKT conditions (:func:`solver.recover.recover`);
3. where the check fails, ``eps *= eps_decay`` and back to 1; LPs that pass keep their vertex.

The returned ``run`` dict (``rec``, ``zp``, ``eps``, ``done``, ``diverged``, ``iterations``,
``eps_steps``, ``cg_iterations``, ...) is what every forward hands to
:func:`solver.output.assemble`: the HiGHS backend and the capture-safe path fill the same keys.
"""
from __future__ import annotations

import math
import time
from dataclasses import fields

import torch

from lpmetrics.solver.errors import LPInputError
from lpmetrics.solver.linsolve import NewtonSystem, diag_scale
from lpmetrics.solver.newton import newton_penalty
from lpmetrics.solver.recover import Recovery, recover
from lpmetrics.solver.sketch import make_sketch
from lpmetrics.solver.solution import LPSolution


def merge_recovery(old: Recovery | None, new: Recovery, ok: torch.Tensor) -> Recovery:
    """``new`` where ``ok`` (per LP of the batch), ``old`` elsewhere: the accepted recoveries
    of LPs that finished at earlier eps stages are kept."""
    if old is None:
        return new
    vals = {}
    for name in _RECOVERY_FIELDS:
        a, b = getattr(old, name), getattr(new, name)
        if isinstance(b, torch.Tensor):
            mask = ok.view(-1, *([1] * (b.dim() - 1)))
            vals[name] = torch.where(mask, b, a)
        else:
            vals[name] = b
    return Recovery(**vals)


# (a constant, not dataclasses.fields() per call: torch.compile cannot trace that)
_RECOVERY_FIELDS = tuple(f.name for f in fields(Recovery))


def initial_point(prob, opts, s=None):
    """Start ``(z0, eps)``: zero and ``opts.eps``, or the ``warm_start``'s penalty iterate
    (divided by the column factors ``s`` of an equilibrated LP: warm starts are stored
    unscaled) and eps."""
    eps = torch.full((prob.B,), opts.eps, dtype=prob.dtype, device=prob.device)
    z = torch.zeros(prob.B, prob.n, dtype=prob.dtype, device=prob.device)
    ws = opts.warm_start
    if ws is None:
        return z, eps
    if isinstance(ws, LPSolution):
        z0 = ws.penalty_z
        if ws.eps is not None and bool((ws.eps > 0).all()):   # 0: certified from a guess
            e = ws.eps.detach().to(prob.dtype).reshape(-1)
            eps = e.expand(prob.B).clone() if e.numel() in (1, prob.B) else eps
    elif isinstance(ws, torch.Tensor):
        z0 = ws
    else:
        raise LPInputError("warm_start must be a previous LPSolution or a [..., n] tensor.")
    if z0 is None or z0.shape[-1] != prob.n:
        raise LPInputError(f"warm_start has the wrong size; expected [..., {prob.n}].")
    z0 = z0.detach().to(prob.dtype).reshape(-1, prob.n)
    if z0.shape[0] not in (1, prob.B):
        raise LPInputError(f"warm_start holds {z0.shape[0]} LPs, the batch has {prob.B}.")
    z0 = z0.expand(prob.B, prob.n)
    return (z0.clone() if s is None else z0 / s), eps


def _warmup(prob, z, eps, opts, method, delta, sketch, deadline=None):
    """Newton from ``eps * decay^-k`` down to ``eps / decay`` (the first ``k`` with
    ``eps * decay^-k >= eps_warmup * max(h_scale)``), no recovery (see
    :class:`solver.options.SolverOptions`).  An LP whose iterate diverges at a large eps
    (an infeasible or unbounded one) keeps its start: the eps loop diagnoses it."""
    iters = torch.zeros(prob.B, dtype=torch.long, device=prob.device)
    if not opts.eps_warmup:
        return z, iters
    top = opts.eps_warmup * float(prob.h_scale.max())
    k = math.ceil(math.log(top / opts.eps) / -math.log(opts.eps_decay)) if top > opts.eps else 0
    ok = torch.ones(prob.B, dtype=torch.bool, device=prob.device)
    for j in range(min(k, 12), 0, -1):
        z_new, info = newton_penalty(prob, z, eps * opts.eps_decay ** -j, method=method,
                                     delta=delta, tol=0.1 * opts.tol, max_iter=opts.max_iter,
                                     step=opts.step, step_size=opts.step_size,
                                     max_norm=opts.max_norm, update=ok, cg_tol=opts.cg_tol,
                                     cg_max_iter=opts.cg_max_iter, sketch=sketch,
                                     stall_steps=opts.stall_steps, deadline=deadline)
        ok = ok & ~info["diverged"]
        z = torch.where(ok.unsqueeze(-1), z_new, z)
        iters = iters + info["iterations"]
        if info.get("timed_out"):
            break
    return z, iters


def run_eps_loop(prob, z, eps, opts, method, extra_steps=0, deadline=None, handoff=False):
    """Steps 1-3 for the whole batch; returns a dict describing the final state.

    ``extra_steps`` (unrolled backward): after acceptance keep decreasing eps a few times and
    iterate on (the vertex does not change for eps <= eps-bar, but the unrolled iterate
    ``z_eps = z* + O(eps)`` and its Jacobian get closer to the vertex's).
    ``deadline`` (a ``time.perf_counter()`` value): past it the loop stops where it is and
    the run says ``timed_out``.  ``handoff`` (``forward="auto"``): an LP the stall detector
    stopped leaves the loop at once, unsolved (the caller hands it to HiGHS); without it the
    stall only ends that eps stage early and the next, smaller eps tries again."""
    delta = opts.delta * diag_scale(prob)
    sketch = make_sketch(prob, opts)
    B = prob.B
    done = torch.zeros(B, dtype=torch.bool, device=prob.device)
    diverged = torch.zeros_like(done)
    iters = torch.zeros(B, dtype=torch.long, device=prob.device)
    steps = torch.zeros_like(iters)
    acc, cg_total = None, 0
    stalled = torch.zeros_like(done)
    timed_out = False
    z, warm_iters = _warmup(prob, z, eps, opts, method, delta, sketch, deadline)
    iters = iters + warm_iters
    zp_acc = z
    for stage in range(opts.max_eps_steps + 1):
        todo = ~done & ~diverged & ~(stalled if handoff else torch.zeros_like(stalled))
        # Newton's own stopping tolerance is tighter than the KKT check it feeds
        z, info = newton_penalty(prob, z, eps, method=method, delta=delta,
                                 tol=0.1 * opts.tol, max_iter=opts.max_iter, step=opts.step,
                                 step_size=opts.step_size, max_norm=opts.max_norm,
                                 update=todo, cg_tol=opts.cg_tol,
                                 cg_max_iter=opts.cg_max_iter, sketch=sketch,
                                 stall_steps=opts.stall_steps, deadline=deadline)
        iters = iters + info["iterations"]
        cg_total += info["cg_iterations"]
        diverged = diverged | info["diverged"]
        if "stalled" in info:
            stalled = stalled | info["stalled"]
        timed_out = timed_out or info.get("timed_out", False) or (
            deadline is not None and time.perf_counter() > deadline)
        rec = recover(prob, z, eps, method=method, active_tol=opts.active_tol,
                      cg_tol=opts.cg_tol, cg_max_iter=4 * opts.cg_max_iter,
                      accept_tol=opts.tol)
        ok = todo & (rec.kkt <= opts.tol) & ~info["diverged"]
        acc = merge_recovery(acc, rec, todo)
        # (every LP is still to do at the first stage)
        zp_acc = z if stage == 0 else torch.where(todo.unsqueeze(-1), z, zp_acc)
        done = done | ok
        last_todo = todo
        finished = done | diverged | (stalled if handoff else torch.zeros_like(stalled))
        if timed_out or bool(finished.all()) or stage == opts.max_eps_steps:
            break
        eps = torch.where(done | diverged, eps, eps * opts.eps_decay)
        steps = steps + (~done & ~diverged).long()
    for _ in range(0 if timed_out else extra_steps):
        eps = torch.where(done, eps * opts.eps_decay, eps)
        z, info = newton_penalty(prob, zp_acc, eps, method=method, delta=delta, tol=opts.tol,
                                 max_iter=opts.max_iter, step=opts.step,
                                 step_size=opts.step_size, max_norm=opts.max_norm,
                                 update=done, cg_tol=opts.cg_tol,
                                 cg_max_iter=opts.cg_max_iter, sketch=sketch)
        iters = iters + info["iterations"]
        zp_acc = z
    # the backward needs K_T of the accepted active sets: reuse the last factorisation when
    # every LP was updated at the last stage, else rebuild (factorised lazily)
    if stage > 0 and not bool(last_todo.all()):
        acc.system = NewtonSystem(prob, acc.wA, acc.wz, torch.zeros_like(eps), method,
                                  pinv=True, cg_tol=opts.cg_tol,
                                  cg_max_iter=4 * opts.cg_max_iter)
    return {"rec": acc, "zp": zp_acc, "eps": eps, "done": done, "diverged": diverged,
            "iterations": iters, "eps_steps": steps, "cg_iterations": cg_total,
            "stalled": stalled & ~done, "timed_out": timed_out}
