r"""``solve_lp``: which forward serves a call, and the general (batched) route.

:func:`solve_lp` dispatches; the paper's method (Meng et al. 2021, sec. 4; Mangasarian 2004,
"A Newton method for linear programming", JOTA 121; Mangasarian 2006, "Exact 1-norm SVMs via
unconstrained convex differentiable minimization", JMLR 7) is the general route's Newton
forward:

0. with ``vertex_guess`` (a caller's closed-form vertex): certify it by one active-set solve and
   the KKT check of step 2 (on the host for a float64 CPU LP with a square active system:
   :mod:`solver.backends.square_active`); when every LP passes, steps 1-3 are skipped;
1.-3. the eps rule (:mod:`solver.eps_loop`): generalized Newton on the exterior penalty
   (:mod:`solver.newton`), vertex recovery and KKT check (:mod:`solver.recover`), smaller eps
   until the check passes;
4. the backward attached (:mod:`solver.implicit`) and the solution assembled
   (:mod:`solver.output`).

Around it, for engineering reasons (each module says why): the capture-safe forms
(:mod:`solver.capture`), the host shortcuts for one small CPU LP (:mod:`solver.backends.host_guess`,
:mod:`solver.backends.host_highs`), HiGHS as the forward of a general CPU LP (:mod:`solver.backends.highs`,
chosen by :mod:`solver.backends.auto`), presolve and equilibration (:mod:`solver.preprocess.presolve`,
:mod:`solver.preprocess.scaling`) and the diagnosis of a failed solve (:mod:`solver.diagnose`).
"""
from __future__ import annotations

import time

import torch

from lpmetrics.solver.backends import host_guess, host_highs, square_active
from lpmetrics.solver.backends.auto import AUTO_NEWTON_SHARE, route
from lpmetrics.solver.backends.highs import check_call, highs_forward
from lpmetrics.solver.capture.separable import solve_capture_safe
from lpmetrics.solver.diagnose import raise_or_warn
from lpmetrics.solver.eps_loop import initial_point, run_eps_loop
from lpmetrics.solver.errors import LPInputError
from lpmetrics.solver.linsolve import choose_method
from lpmetrics.solver.options import SolverOptions
from lpmetrics.solver.output import assemble, empty_solution
from lpmetrics.solver.preprocess.presolve import presolve
from lpmetrics.solver.preprocess.scaling import ruiz_factors, scale_problem
from lpmetrics.solver.problem import build_problem
from lpmetrics.solver.recover import GUESS_TIGHT, recover_guess
from lpmetrics.solver.solution import LPSolution

BACKWARDS = ("active_set", "unrolled")


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
        **options: the fields of :class:`solver.options.SolverOptions`, each with its default's
            reason.  ``forward``: ``"newton"`` (batched, any device), ``"highs"`` (scipy's HiGHS
            per LP on the CPU, active-set backward; :mod:`solver.backends.highs`) or ``"auto"`` (Newton,
            handing a general CPU LP that stalls, fails or runs out of time to HiGHS;
            :mod:`solver.backends.auto`).  ``capture_safe=True`` (separable LPs, or a dense LP with a
            ``vertex_guess``) runs fixed counts with no host sync (:mod:`solver.capture`): its
            ``stats`` are device tensors and failures are flagged there, not raised.

    Leading batch dimensions broadcast (an unbatched ``A`` is shared by the batch).

    Returns:
        :class:`solver.LPSolution` (``z``, ``value``, ``dual``, ``active``, ``stats``, ...).
        An empty batch (e.g. ``c`` of shape ``[0, n]``) returns an empty solution
        (``stats["batch_size"]`` 0) without running the solver.

    Raises:
        LPInputError (a ``ValueError``): bad shapes/dtypes/options, NaN/Inf, empty problem
            (no variables or no constraints); options are checked before any work.
        LPSolverError: infeasible or unbounded LP (``err.kind``), or not converged with
            ``on_fail="raise"``; ``err.stats`` holds the diagnostics.
        LPTimeLimitError (an ``LPSolverError``, ``kind="time_limit"``): the solve ran past
            ``max_seconds`` (default 60 s); the message names the residuals reached and what to try.
    """
    if backward not in BACKWARDS:
        raise LPInputError(f"backward={backward!r}; choose 'active_set' or 'unrolled'.")
    opts = SolverOptions.from_kwargs(options)
    if opts.capture_safe:   # fixed counts, device flags, no host sync (separable LPs, certified guesses)
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
    return _solve_general(c, A, b, A_eq, b_eq, opts, backward, t0, solved)


def _solve_general(c, A, b, A_eq, b_eq, opts, backward, t0, solved):
    """The batched route: build the problem, run its forward (Newton with or without a
    hand-off, or HiGHS), raise or warn where LPs are left unsolved, assemble the solution.
    ``solved``: HiGHS's results that :mod:`solver.backends.host_highs` computed and could not certify."""
    deadline = None if opts.max_seconds is None else t0 + opts.max_seconds
    prob, method, path = _problem(c, A, b, A_eq, b_eq, opts, backward)
    if prob.B == 0:
        return empty_solution(prob, c, b, time.perf_counter() - t0, opts.forward)
    opts = opts.resolved(prob.dtype, separable=method == "diagonal")
    if path == "highs":     # failures raise (or warn) inside, with the same typed errors
        check_call(prob, backward)
        work, sc, forward = prob, None, "highs"
        run = highs_forward(prob, opts, method, deadline, solved=solved)
    else:
        work, sc, run, forward = _newton_forward(prob, opts, method, backward, path, t0,
                                                 deadline)
        if forward == "newton" and not bool(run["done"].all()):
            raise_or_warn(work, opts, method, run, t0, deadline)
    return assemble(prob, work, sc, run, method, backward, c.dtype, forward, t0)


def _problem(c, A, b, A_eq, b_eq, opts, backward):
    """``(prob, method, path)``: the batched problem (:func:`solver.problem.build_problem`), its
    linear solver (:func:`solver.linsolve.choose_method`; None for an empty batch) and its
    forward (:func:`solver.backends.auto.route`: ``"newton"``, ``"highs"`` or ``"auto"``)."""
    path = route(c, A, A_eq, opts, backward)
    # HiGHS computes in float64: so does its recovery unless compute_dtype says otherwise
    prob = build_problem(c, A, b, A_eq, b_eq,
                         compute_dtype=opts.compute_dtype or (
                             torch.float64 if path == "highs" else None))
    if prob.B == 0:
        return prob, None, path
    method = choose_method(prob, opts.linear_solver, unrolled=backward == "unrolled")
    if opts.forward == "auto" and method == "diagonal":
        # separable (e.g. A = -I as torch.sparse): Newton needs <= a few steps, no hand-off
        if path == "highs":     # it was routed to HiGHS by size: back to Newton's dtype
            prob = build_problem(c, A, b, A_eq, b_eq, compute_dtype=opts.compute_dtype)
        path = "newton"
    return prob, method, path


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



def _newton_forward(prob, opts, method, backward, path, t0, deadline):
    """Newton (after a ``vertex_guess``, if any), on the presolved and equilibrated LP where
    :mod:`solver.preprocess.presolve` / :mod:`solver.preprocess.scaling` apply, with ``forward="auto"``'s hand-off
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
    z0, eps0 = initial_point(work, opts, None if sc is None else sc.s)
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

