"""Solver options (``solve_lp(..., **options)`` / ``LPLayer(**options)``), with why each default."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from solver.errors import LPInputError


@dataclass
class SolverOptions:
    # first penalty parameter, relative to |c|_inf; None: 0.1 for coupled problems, 1e-4 for
    # separable ones (diagonal-gram A).  The eps rule multiplies it by eps_decay until the
    # recovered vertex passes the KKT check.  Coupled: starting large and warm-starting each
    # smaller eps (a continuation) needs ~3x fewer Newton steps than starting at the paper's
    # 0.01 from z = 0 (200 x 50 random LPs).  But every rejected stage also pays a full
    # recovery (active-set solve, KKT certificate, repair rounds), which on small dense LPs
    # costs more than a few Newton steps: starting at 0.1 instead of 1.0 cut recoveries by
    # 36% for +12% Newton steps and ~28% less time over 120 random LPs (5-60 rows, 3-40
    # variables, float32/64, test_solver_oracle's generators) and ~30% on the F1 LP at
    # n = 32-256 (one stage fewer), with the same certified vertices.  Separable: Newton
    # needs <= 3 steps from any start, so start small and skip the stages.
    eps: float | None = None
    eps_decay: float = 0.1
    max_eps_steps: int = 10         # 1 -> 1e-10: far below any well-scaled LP's eps-bar
    max_iter: int = 100             # Newton iterations per eps (typically 2-30)
    tol: float | None = None        # KKT tolerance; None: 1e-8 (float64), 1e-4 (float32)
    delta: float | None = None      # Hessian + delta*I, relative to mean diag(G^T G);
                                    # None: 1e-10 (float64), 1e-6 (float32)
    # "exact": exact line search on the 1-D piecewise quadratic (cheap: one product A d, then
    # elementwise work); "armijo": backtracking (Mangasarian 2004's globally convergent rule);
    # "fixed": the paper's constant step lambda = step_size (seed 002 sec. 4.1); "auto":
    # fixed full steps for separable problems (one line-search step for millions of
    # independent coordinates would slow them all down), exact otherwise
    step: str = "auto"
    step_size: float = 1.0          # lambda of step="fixed"
    linear_solver: str = "auto"     # auto | diagonal | cholesky | cg | sparse (solver/linsolve.py)
    cg_tol: float | None = None     # relative residual of CG; None: 1e-12 (f64) / 1e-6 (f32)
    cg_max_iter: int = 500
    active_tol: float = 1.0         # kappa = active_tol * eps * max(1, |u|_inf): tight rows
    max_norm: float = 1e8           # |z|_inf beyond this = divergence (unbounded/infeasible)
    warm_start: Any = None          # previous LPSolution (z and eps reused) or a [..., n] z0
    sketch: str | None = None       # None | "gaussian" | "sampling" (seed 002 eq. 6-7)
    sketch_size: int | None = None  # k rows of the sketch; None: 4 n
    sketch_seed: int = 0
    on_fail: str = "raise"          # not converged: "raise" | "warn" (infeasible/unbounded
                                    # always raise)
    diagnose: bool = True           # on failure, tell infeasible / unbounded / not converged
    compute_dtype: torch.dtype | None = None  # e.g. torch.float64 for float32 data
    # backward="unrolled": eps reductions (x eps_decay) unrolled past the accepted eps; the
    # unrolled iterate is z* + O(eps), so each step brings its Jacobian ~10x closer to the
    # vertex's (active-set) Jacobian at a cost of ~2 warm Newton steps
    unrolled_eps_steps: int = 2
    # "newton": the penalty Newton method above (batched, CPU or GPU); "highs": scipy's HiGHS
    # solves each LP on the CPU and the same active-set backward differentiates it -- the
    # faster exact forward for one large general LP (solver/highs.py)
    forward: str = "newton"

    def resolved(self, dtype: torch.dtype, separable: bool = False) -> "SolverOptions":
        f64 = dtype == torch.float64
        out = replace(self)
        if out.eps is None:
            out.eps = 1e-4 if separable else 0.1
        if out.step == "auto":
            out.step = "fixed" if separable else "exact"
        if out.tol is None:
            out.tol = 1e-8 if f64 else 1e-4
        if out.delta is None:
            out.delta = 1e-10 if f64 else 1e-6
        if out.cg_tol is None:
            out.cg_tol = 1e-12 if f64 else 1e-6
        return out

    @classmethod
    def from_kwargs(cls, options: dict) -> "SolverOptions":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise LPInputError(f"unknown solver option(s) {unknown}; valid: {sorted(names)}.")
        opts = cls(**options)
        checks = [
            (opts.step in ("auto", "exact", "armijo", "fixed"),
             "step must be auto, exact, armijo or fixed"),
            (opts.on_fail in ("raise", "warn"), "on_fail must be 'raise' or 'warn'"),
            (opts.forward in ("newton", "highs"), "forward must be 'newton' or 'highs'"),
            (opts.sketch in (None, "gaussian", "sampling"),
             "sketch must be None, 'gaussian' or 'sampling'"),
            (opts.eps is None or opts.eps > 0, "eps must be > 0"),
            (0 < opts.eps_decay < 1, "eps_decay must be in (0, 1)"),
            (opts.max_iter >= 1 and opts.max_eps_steps >= 0, "max_iter >= 1, max_eps_steps >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise LPInputError(f"bad solver option: {msg}.")
        return opts
