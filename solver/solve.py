r"""``solve_lp``: Mangasarian's exterior-penalty Newton method with the eps rule, differentiable.

Algorithm (Meng et al. 2021, sec. 4; Mangasarian 2004, "A Newton method for linear programming",
JOTA 121; Mangasarian 2006, "Exact 1-norm SVMs via unconstrained convex differentiable
minimization", JMLR 7):

0. with ``vertex_guess`` (a caller's closed-form vertex): certify it by one active-set solve and
   the KKT check of step 2 (on the host for a float64 CPU LP with a square active system:
   :mod:`solver.square_active`); when every LP passes, steps 1-3 are skipped;
1. minimise the exterior penalty :math:`g_\varepsilon` by generalized Newton
   (:mod:`solver.newton`), warm-started across eps, after Newton-only warm-up stages at larger
   eps (``eps_warmup``: they let the first steps see the rows, see :mod:`solver.options`);
2. threshold the residuals into multipliers, take the active set, recover the primal vertex by
   one linear solve and check the KKT conditions (:mod:`solver.recover`);
3. if the check fails, ``eps *= eps_decay`` and repeat (Mangasarian's eps rule: for every
   :math:`\varepsilon \le \bar\varepsilon` the thresholded multipliers are the exact least-norm
   dual solution, so the recovered vertex stops changing and the KKT check passes);
4. attach the backward (:mod:`solver.implicit`).
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import fields

import torch

from lpmetrics.solver.auto import AUTO_NEWTON_SHARE, route, time_limit_error
from lpmetrics.solver.errors import LPInputError, LPNotConvergedWarning, LPSolverError
from lpmetrics.solver.highs import check_call, highs_forward
from lpmetrics.solver.implicit import active_set_output, unrolled_output
from lpmetrics.solver.linsolve import NewtonSystem, choose_method, diag_scale
from lpmetrics.solver.newton import newton_penalty
from lpmetrics.solver.options import SolverOptions
from lpmetrics.solver.problem import build_problem
from lpmetrics.solver.recover import GUESS_TIGHT, Recovery, recover, recover_guess
from lpmetrics.solver.presolve import presolve, restore, restore_masks
from lpmetrics.solver.scaling import ruiz_factors, scale_problem
from lpmetrics.solver.sketch import make_sketch
from lpmetrics.solver.solution import LPSolution
from lpmetrics.solver import diagnose, host_guess, host_highs, square_active

BACKWARDS = ("active_set", "unrolled")


def _merge(old: Recovery | None, new: Recovery, ok: torch.Tensor) -> Recovery:
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


def _initial_point(prob, opts, s=None):
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


def _guess(prob, opts):
    x = opts.vertex_guess
    if not isinstance(x, torch.Tensor) or x.shape[-1] != prob.n:
        raise LPInputError(f"vertex_guess must be a [..., {prob.n}] tensor (one point per LP "
                           f"of the batch, or one for all); got {x!r:.60}.")
    x = x.detach() if x.requires_grad else x
    x = (x if x.dtype == prob.dtype else x.to(prob.dtype)).reshape(-1, prob.n)
    if x.shape[0] not in (1, prob.B):
        raise LPInputError(f"vertex_guess holds {x.shape[0]} points, the batch has {prob.B}.")
    return x.expand(prob.B, prob.n)


def run_from_guess(prob, opts, method):
    """Certify ``opts.vertex_guess`` (:func:`solver.recover.recover_guess`); the ``run`` dict
    of :func:`run_eps_loop` when every LP passes the KKT check, else ``None`` (the eps loop
    then solves the whole batch, so results never depend on the guess)."""
    x = _guess(prob, opts)
    if not bool(torch.isfinite(x).all()):    # no point to certify: the eps loop solves it
        return None
    # a square active system: certified on the host (one LU per LP)
    rec = square_active.recover(prob, x, opts.tol, GUESS_TIGHT)
    if rec is None:
        rec = recover_guess(prob, x, method=method, cg_tol=opts.cg_tol,
                            cg_max_iter=4 * opts.cg_max_iter, accept_tol=opts.tol)
    done = rec.kkt <= opts.tol
    if not bool(done.all()):
        return None
    zeros = torch.zeros(prob.B, dtype=torch.long, device=prob.device)
    return {"rec": rec, "zp": x, "eps": torch.zeros_like(rec.gap), "done": done,
            "diverged": torch.zeros_like(done), "iterations": zeros, "eps_steps": zeros, "cg_iterations": 0}


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
        acc = _merge(acc, rec, todo)
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


def _stats(prob, run, method, seconds, forward="newton"):
    rec = run["rec"]
    active = rec.wA.sum(-1) + rec.wz.sum(-1)
    per = {"iterations": run["iterations"], "converged": run["done"],
           "kkt_residual": rec.kkt, "primal_infeasibility": rec.primal_inf,
           "dual_residual": rec.dual_res, "duality_gap": rec.gap, "active_count": active,
           "eps": run["eps"], "eps_steps": run["eps_steps"]}
    per = {k: prob.unflatten(v.detach() if v.requires_grad else v) for k, v in per.items()}
    # one host transfer for all the scalars (float64 holds every value exactly)
    with torch.no_grad():
        f64 = torch.float64
        if prob.B == 1:   # worst case over one LP = its value
            one = [run["iterations"], run["done"], rec.kkt.reshape(1), rec.primal_inf,
                   rec.dual_res, rec.gap, active.float(), run["eps"], run["eps_steps"]]
            # .item() syncs nothing on the CPU; elsewhere cat (promoting to a common dtype)
            # makes it one transfer
            vals = ([t.item() for t in one] if prob.device.type == "cpu"
                    else torch.cat(one).tolist())
        else:
            vals = torch.stack([run["iterations"].max().to(f64), run["done"].all().to(f64),
                                per["kkt_residual"].max().to(f64),
                                rec.primal_inf.max().to(f64), rec.dual_res.max().to(f64),
                                rec.gap.max().to(f64), active.float().mean().to(f64),
                                run["eps"].min().to(f64),
                                run["eps_steps"].max().to(f64)]).tolist()
    stats = {"iterations": int(vals[0]),
             "converged": bool(vals[1]),
             "kkt_residual": vals[2],
             "primal_infeasibility": vals[3],
             "dual_residual": vals[4],
             "duality_gap": vals[5],
             "active_count": vals[6],
             "eps": vals[7],
             "eps_steps": int(vals[8]),
             "linear_solver": method,
             # the recovery's / backward's K_T solver: "dense_lu" / "sparse_lu" (the square
             # active system factorised on the host, solver.square_active), "active_lu" (its
             # sparse LU inside the torch recovery, solver.active_lu) or the linear_solver's
             # least-squares path
             "active_factor": getattr(rec.system, "factor_kind", method),
             "forward": forward,
             "cg_iterations": int(run["cg_iterations"]),
             "batch_size": prob.B,
             "seconds": seconds}
    return stats, per


def empty_solution(prob, c, b, seconds: float, forward: str = "newton") -> LPSolution:
    """The solution of an empty batch (a leading dimension of size 0): every field has the batch
    shape with zero LPs; ``z`` and ``value`` stay connected to ``c`` and ``b`` (zero gradient)."""
    shape = tuple(prob.batch_shape)
    link = 0.0 * (c.sum() + b.sum())    # empty sums are 0: connects the outputs to the graph

    def zeros(*tail, dtype=c.dtype):
        return torch.zeros(shape + tail, dtype=dtype, device=c.device)

    stats = {"iterations": 0, "converged": True, "kkt_residual": 0.0, "primal_infeasibility": 0.0,
             "dual_residual": 0.0, "duality_gap": 0.0, "active_count": 0.0, "eps": 0.0,
             "eps_steps": 0, "linear_solver": "none", "cg_iterations": 0, "batch_size": 0,
             "seconds": seconds, "forward": forward}
    return LPSolution(z=zeros(prob.n) + link, value=zeros() + link, dual=zeros(prob.m),
                      active=zeros(prob.m, dtype=torch.bool), stats=stats, instance_stats={},
                      dual_eq=zeros(prob.p) if prob.p else None, dual_bounds=zeros(prob.n),
                      active_bounds=zeros(prob.n, dtype=torch.bool), eps=zeros(),
                      penalty_z=zeros(prob.n))


def solve_lp(c, A, b, A_eq=None, b_eq=None, *, backward: str = "active_set",
             **options) -> LPSolution:
    r"""Solve ``min c^T z  s.t.  A z <= b,  A_eq z = b_eq,  z >= 0`` differentiably.

    Args:
        c: ``[..., n]`` cost.
        A: ``[..., m, n]`` dense tensor, a ``torch.sparse`` COO/CSR tensor (``[m, n]`` or
            ``[B, m, n]``) or a :class:`solver.LinearOperator` (``DenseOperator``,
            ``DiagonalOperator``, ``SparseOperator``, ``VStackOperator``, ``HStackOperator``).
        b: ``[..., m]``.
        A_eq, b_eq: optional equality rows ``[..., p, n]`` (same kinds as ``A``), ``[..., p]``.
        backward: ``"active_set"`` (implicit differentiation on the final active set; default)
            or ``"unrolled"`` (autograd through the Newton iterations).
        **options: see :class:`solver.options.SolverOptions` (``eps``, ``eps_decay``,
            ``max_eps_steps``, ``max_iter``, ``tol``, ``delta``, ``step``, ``step_size``,
            ``linear_solver``, ``cg_tol``, ``cg_max_iter``, ``active_tol``, ``max_norm``,
            ``warm_start``, ``vertex_guess``, ``sketch``, ``sketch_size``, ``sketch_seed``, ``on_fail``,
            ``diagnose``, ``compute_dtype``, ``forward``, ``max_seconds``, ``stall_steps``,
            ``equilibrate``, ``presolve``, ``capture_safe``, ``fixed_iters``,
            ``fixed_eps_stages``).  ``forward="highs"`` solves each
            LP with scipy's HiGHS on the CPU and keeps the active-set backward
            (:mod:`solver.highs`); ``"newton"`` batches and runs on the GPU; the default
            ``"auto"`` runs Newton and hands a general CPU LP that stalls, fails or runs out
            of time to HiGHS (a large one at once; :mod:`solver.auto`).  General LPs are
            presolved and equilibrated before Newton (:mod:`solver.presolve`,
            :mod:`solver.scaling`), mapped back exactly.
            ``capture_safe=True`` (separable LPs: ``DiagonalOperator`` A, no equalities; and a
            dense LP with a ``vertex_guess``, certified on the device: :mod:`solver.capture_guess`)
            runs fixed counts with device-side flags and no host sync (:mod:`solver.capture`);
            its ``stats`` are device tensors and failures are flagged there, not raised.

    Leading batch dimensions broadcast (an unbatched ``A`` is shared by the batch).

    Returns:
        :class:`solver.LPSolution` (``z``, ``value``, ``dual``, ``active``, ``stats``, ...).
        An empty batch (a leading dimension of size 0, e.g. ``c`` of shape ``[0, n]``) is not an
        error: it returns an empty solution (``z`` of shape ``[0, n]``, ``stats["batch_size"]``
        0) without running the solver.

    Raises:
        LPInputError (a ``ValueError``): bad shapes/dtypes/options, NaN/Inf, empty problem
            (no variables or no constraints). Options are checked before any work
            (:class:`solver.options.SolverOptions`: e.g. ``tol`` must be finite and > 0).
        LPSolverError: infeasible or unbounded LP (``err.kind``), or not converged with
            ``on_fail="raise"``; ``err.stats`` holds the diagnostics.
        LPTimeLimitError (an ``LPSolverError``, ``kind="time_limit"``): the solve ran past
            ``max_seconds`` (default 60 s); the message names the KKT residual, Newton steps
            and eps reached and the options to try.
    """
    if backward not in BACKWARDS:
        raise LPInputError(f"backward={backward!r}; choose 'active_set' or 'unrolled'.")
    opts = SolverOptions.from_kwargs(options)
    if opts.capture_safe:   # fixed counts, device flags, no host sync (separable LPs, certified guesses)
        from lpmetrics.solver.capture import solve_capture_safe   # it imports this module
        return solve_capture_safe(c, A, b, A_eq, b_eq, backward, opts)
    t0 = time.perf_counter()
    if opts.vertex_guess is not None:   # one small dense CPU LP: certified on the host alone
        sol = host_guess.solve(c, A, b, A_eq, b_eq, opts, backward, t0)
        if sol is not None:
            return sol
    # one sparse CPU LP for HiGHS: solved and certified on the host alone (or HiGHS's result
    # for the general route's recovery, where its vertex does not certify there)
    sol, solved = host_highs.solve(c, A, b, A_eq, b_eq, opts, backward, t0)
    if sol is not None:
        return sol
    deadline = None if opts.max_seconds is None else t0 + opts.max_seconds
    path = route(c, A, A_eq, opts, backward)
    highs = path == "highs"
    # HiGHS computes in float64: so does its recovery unless compute_dtype says otherwise
    prob = build_problem(c, A, b, A_eq, b_eq,
                         compute_dtype=opts.compute_dtype or (torch.float64 if highs else None))
    if prob.B == 0:
        return empty_solution(prob, c, b, time.perf_counter() - t0, opts.forward)
    method = choose_method(prob, opts.linear_solver, unrolled=backward == "unrolled")
    if opts.forward == "auto" and method == "diagonal":
        # separable (e.g. A = -I as torch.sparse): Newton needs <= a few steps, no hand-off
        if highs:               # it was routed to HiGHS by size: back to Newton's dtype
            prob = build_problem(c, A, b, A_eq, b_eq, compute_dtype=opts.compute_dtype)
            highs = False
        path = "newton"
    opts = opts.resolved(prob.dtype, separable=method == "diagonal")
    if highs:   # failures raise (or warn) inside, with the same typed errors
        check_call(prob, backward)
        work, sc, forward = prob, None, "highs"
        run = highs_forward(prob, opts, method, deadline, solved=solved)
    else:
        work, sc, run, forward = _newton_forward(prob, opts, method, backward, path, t0,
                                                 deadline)
        highs = forward != "newton"
    if not highs and not bool(run["done"].all()):
        _raise_or_warn(work, opts, method, run, t0, deadline)
    return _solution(prob, work, sc, run, method, backward, c.dtype, forward, t0)


def _newton_forward(prob, opts, method, backward, path, t0, deadline):
    """Newton (after a ``vertex_guess``, if any), on the presolved and equilibrated LP where
    :mod:`solver.presolve` / :mod:`solver.scaling` apply, with ``forward="auto"``'s hand-off
    to HiGHS (``path == "auto"``).  Returns ``(work, scaling, run, forward)``: the LP the run
    describes (reduced / scaled or not; ``run["reduction"]`` says what presolve removed)."""
    if opts.vertex_guess is not None and backward != "unrolled":
        run = run_from_guess(prob, opts, method)
        if run is not None:
            return prob, None, run, "newton"
    # presolve and scaling: exact substitutions with constant factors, so the active-set
    # backward of the reduced, scaled LP is that of the LP as given.  Not for unrolled: its
    # Jacobian is that of the penalty iterate, which scaling changes by O(eps) (cosine 0.9976
    # against the active-set one on test_solver_grad's seed 5, 0.999+ unscaled)
    general = method != "diagonal" and backward != "unrolled"
    red_prob, red = presolve(prob) if general and opts.presolve and opts.warm_start is None \
        else (prob, None)
    sc = ruiz_factors(red_prob, opts.equilibrate) if general else None
    work = red_prob if sc is None else scale_problem(red_prob, sc)
    z0, eps0 = _initial_point(work, opts, None if sc is None else sc.s)
    unrolled = backward == "unrolled" and torch.is_grad_enabled()
    handoff = path == "auto"
    # auto: Newton gets a share of the time, HiGHS keeps the rest for a hand-off
    newton_deadline = deadline if not handoff or deadline is None else \
        t0 + AUTO_NEWTON_SHARE * opts.max_seconds
    with torch.set_grad_enabled(unrolled):
        run = run_eps_loop(work, z0, eps0, opts, method,
                           opts.unrolled_eps_steps if backward == "unrolled" else 0,
                           deadline=newton_deadline, handoff=handoff)
    run["reduction"] = red
    if not handoff or bool(run["done"].all()):
        return work, sc, run, "newton"
    # stalled, not converged, out of Newton's time, or diverged (HiGHS then names the LP
    # infeasible or unbounded): HiGHS solves those, the rest keep Newton's vertices
    only = (~run["done"]).nonzero().flatten().tolist()
    run = {**highs_forward(work, opts, method, deadline, only=only, start=run),
           "reduction": red}
    return work, sc, run, "highs" if len(only) == prob.B else "newton+highs"


def _raise_or_warn(work, opts, method, run, t0, deadline):
    """A Newton run that left LPs unsolved: time limit, or diagnose (infeasible, unbounded,
    not converged) and raise, or warn with ``on_fail="warn"``."""
    stats, _ = _stats(work, run, method, time.perf_counter() - t0)
    if run.get("timed_out"):
        raise time_limit_error(opts, run, stats)
    kind, msg, bad = diagnose.explain(work, opts, method, run, deadline) if opts.diagnose \
        else ("not_converged", diagnose.not_converged_message(opts, run), [])
    if kind == "not_converged" and deadline is not None and time.perf_counter() > deadline:
        raise time_limit_error(opts, run, stats)
    if kind != "not_converged" or opts.on_fail == "raise":
        raise LPSolverError(msg, kind=kind, stats=stats, instances=bad)
    warnings.warn(msg, LPNotConvergedWarning, stacklevel=4)


def _solution(prob, work, sc, run, method, backward, out_dtype, forward, t0):
    """The :class:`LPSolution`: the forward's vertex with its backward attached, mapped back
    from the equilibrated (:mod:`solver.scaling`) and presolved (:mod:`solver.presolve`) LP
    ``work`` where there was one."""
    rec, red = run["rec"], run.get("reduction")
    if backward == "unrolled":
        z = unrolled_output(rec.z, run["zp"])
    elif red is None:
        z = active_set_output(work, rec.z, rec.system)
    else:                   # presolved: the backward is attached below, on the LP as given
        z = rec.z
    uA, uz, uE, zp = rec.uA, rec.uz, rec.uE, run["zp"].detach()
    if sc is not None:      # z = D_s z_hat, u_A = D_r u_A_hat, u_z = u_z_hat / D_s, ...
        z, zp, uA, uz = z * sc.s, zp * sc.s, uA * sc.r, uz / sc.s
        uE = None if uE is None else uE * sc.re
    active, active_bounds = rec.wA > 0, rec.wz > 0
    if red is not None:     # presolved: removed rows and variables back in
        z, uA, uz, uE = restore(prob, red, z.detach(), uA, uz, uE)
        zp = red.fixed.detach().to(zp.dtype).index_copy(1, red.cols.nonzero().flatten(), zp)
        active, active_bounds = restore_masks(prob, red, active, active_bounds, z)
        # the backward on the LP as given, with its full active set: the reduced LP has no
        # entries for the zeros of a removed row or column, whose derivatives are not zero
        # (a zero of a singleton row still moves the vertex when it becomes nonzero)
        system = NewtonSystem(prob, active.to(prob.dtype), active_bounds.to(prob.dtype),
                              torch.zeros_like(prob.c_scale), method, pinv=True,
                              cg_tol=rec.system.cg_tol, cg_max_iter=rec.system.cg_max_iter)
        z = active_set_output(prob, z.to(prob.dtype), system)
    def out(t, size):                 # the caller's batch shape and dtype
        t = prob.unflatten(t, (size,))
        return t if t.dtype == out_dtype else t.to(out_dtype)

    z_out = out(z, prob.n)
    value = (out(prob.c, prob.n) * z_out).sum(-1)
    stats, per = _stats(work, run, method, time.perf_counter() - t0, forward)
    stats["equilibrated"] = sc is not None
    stats["presolve"] = None if red is None else {
        "rows_removed": int((~red.rows).sum()) + int((~red.eq_rows).sum()),
        "cols_removed": int((~red.cols).sum())}
    return LPSolution(
        z=z_out, value=value,
        dual=out(uA, prob.m),
        active=prob.unflatten(active, (prob.m,)),
        stats=stats, instance_stats=per,
        dual_eq=None if uE is None else out(uE, prob.p),
        dual_bounds=out(uz, prob.n),
        active_bounds=prob.unflatten(active_bounds, (prob.n,)),
        eps=None if forward != "newton" else prob.unflatten(run["eps"].detach()),
        penalty_z=prob.unflatten(zp, (prob.n,)))
