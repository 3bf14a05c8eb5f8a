r"""Why did a solve fail?  Infeasible, unbounded, or just not converged.

* Infeasible: phase 1 -- the penalty with :math:`\varepsilon = 0`,
  :math:`\min_z \tfrac12\|(Az-b)_+\|^2 + \tfrac12\|(-z)_+\|^2 + \tfrac12\|A_{eq}z-b_{eq}\|^2`,
  whose minimum is zero exactly when the LP is feasible (same Newton solver).
* Unbounded: a feasible LP is unbounded iff adding a large box :math:`z \le R` changes it, i.e.
  iff every optimal dual of the boxed LP puts a positive multiplier on a box row.
* Otherwise: not converged (tolerance, iterations, or conditioning).

:func:`raise_or_warn` turns the diagnosis into the typed error (or, with ``on_fail="warn"``, a
warning) that :func:`solver.solve_lp` gives its caller.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import replace

import torch

from lpmetrics.solver.backends.auto import time_limit_error
from lpmetrics.solver.eps_loop import run_eps_loop
from lpmetrics.solver.errors import LPNotConvergedWarning, LPSolverError
from lpmetrics.solver.linsolve import choose_method, diag_scale
from lpmetrics.solver.newton import newton_penalty
from lpmetrics.solver.operators import DiagonalOperator
from lpmetrics.solver.output import run_stats
from lpmetrics.solver.problem import LPProblem
from lpmetrics.solver.stacked import VStackOperator


def not_converged_message(opts, run, bad=None) -> str:
    rec = run["rec"]
    idx = "" if bad is None else f" (batch instances {bad[:10]}{'...' if len(bad) > 10 else ''})"
    return (f"LP solver did not converge{idx}: KKT residual {float(rec.kkt.max()):.2e} > "
            f"tol={opts.tol:.1e} after max_eps_steps={opts.max_eps_steps} eps reductions "
            f"(eps down to {float(run['eps'].min()):.1e}) with max_iter={opts.max_iter} Newton "
            f"steps each. Try: a larger max_iter or max_eps_steps, a looser tol, "
            f"compute_dtype=torch.float64 for float32 data, rescaling the rows of A, or "
            f"on_fail='warn' to continue with the best point found.")


def _phase1(prob, opts, method, deadline=None):
    z = torch.zeros(prob.B, prob.n, dtype=prob.dtype, device=prob.device)
    delta = opts.delta * diag_scale(prob)
    with torch.no_grad():
        z, info = newton_penalty(prob, z, torch.ones(prob.B, dtype=prob.dtype,
                                                     device=prob.device),
                                 method=method, delta=delta, tol=opts.tol,
                                 max_iter=max(500, 4 * opts.max_iter), max_norm=float("inf"),
                                 phase1=True, cg_tol=opts.cg_tol, cg_max_iter=opts.cg_max_iter,
                                 deadline=deadline)
        rA, rE = prob.residuals(z)
        viol = (-z).clamp_min(0).amax(-1)
        if prob.m:
            viol = torch.maximum(viol, rA.clamp_min(0).amax(-1))
        if rE is not None:
            viol = torch.maximum(viol, rE.abs().amax(-1))
    return z, viol / prob.h_scale, info["stopped"]


def _boxed_unbounded(prob, opts, method, z1, deadline=None):
    R = 1e3 * (1.0 + z1.abs().amax(-1, keepdim=True)) * prob.h_scale.unsqueeze(-1)
    ones = torch.ones(prob.n, dtype=prob.dtype, device=prob.device)
    boxed = LPProblem(prob.c.detach(), VStackOperator([prob.A, DiagonalOperator(ones)]),
                      torch.cat([prob.b.detach(), R.expand(prob.B, prob.n)], -1),
                      prob.A_eq, None if prob.b_eq is None else prob.b_eq.detach(),
                      prob.batch_shape)
    z0 = torch.zeros(prob.B, prob.n, dtype=prob.dtype, device=prob.device)
    eps = torch.full((prob.B,), opts.eps, dtype=prob.dtype, device=prob.device)
    generous = replace(opts, max_iter=max(100, opts.max_iter),
                       max_eps_steps=max(10, opts.max_eps_steps))
    with torch.no_grad():
        run = run_eps_loop(boxed, z0, eps, generous, choose_method(boxed, "auto"),
                           deadline=deadline)
    u_box = run["rec"].uA[:, prob.m:].amax(-1) / prob.c_scale
    return run["done"] & (u_box > 1e3 * opts.tol)


def explain(prob, opts, method, run, deadline=None):
    """(kind, message, bad instance indices) for the LPs that did not converge; ``deadline``
    (``time.perf_counter()``) bounds the Newton runs of the diagnosis (the caller turns a
    diagnosis cut short into a time-limit error)."""
    bad = ~run["done"]
    z1, viol, settled = _phase1(prob, opts, method, deadline)
    feas_tol = max(opts.tol, 1e-12) ** 0.5
    infeasible = bad & settled & (viol > feas_tol)
    if bool(infeasible.any()):
        idx = infeasible.nonzero().flatten().tolist()
        return "infeasible", (
            f"LP infeasible (batch instances {idx[:10]}{'...' if len(idx) > 10 else ''}): no "
            f"z >= 0 satisfies A z <= b, A_eq z = b_eq -- the least-violation point still "
            f"violates a constraint by {float(viol[infeasible].max()):.2e} (relative to "
            f"1 + |b|_inf). Check how the constraints are built (signs of b, contradictory "
            f"equalities) or relax them, e.g. with slack variables."), idx
    unbounded = bad & _boxed_unbounded(prob, opts, method, z1, deadline)
    if bool(unbounded.any()):
        idx = unbounded.nonzero().flatten().tolist()
        return "unbounded", (
            f"LP unbounded (batch instances {idx[:10]}{'...' if len(idx) > 10 else ''}): "
            f"c^T z decreases without limit over the feasible set. Add bounds on z (e.g. "
            f"box rows z <= u in A), or check the sign of c (the solver minimises)."), idx
    idx = bad.nonzero().flatten().tolist()
    return "not_converged", not_converged_message(opts, run, idx), idx


def raise_or_warn(work, opts, method, run, t0, deadline):
    """A Newton run that left LPs unsolved: time limit, or diagnose (infeasible, unbounded,
    not converged) and raise, or warn with ``on_fail="warn"``."""
    stats, _ = run_stats(work, run, method, time.perf_counter() - t0)
    if run.get("timed_out"):
        raise time_limit_error(opts, run, stats)
    kind, msg, bad = explain(work, opts, method, run, deadline) if opts.diagnose \
        else ("not_converged", not_converged_message(opts, run), [])
    if kind == "not_converged" and deadline is not None and time.perf_counter() > deadline:
        raise time_limit_error(opts, run, stats)
    if kind != "not_converged" or opts.on_fail == "raise":
        raise LPSolverError(msg, kind=kind, stats=stats, instances=bad)
    # (here, _solve_general, solve_lp, its caller: the warning names that caller's caller)
    warnings.warn(msg, LPNotConvergedWarning, stacklevel=5)
