"""Solver options (``solve_lp(..., **options)`` / ``LPLayer(**options)``), with why each default."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields
from typing import Any

import torch

from lpmetrics.solver.errors import LPInputError
from lpmetrics.solver.linsolve import METHODS as LINEAR_SOLVERS


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
    # Newton-only stages before the first eps (no recovery, warm-started, x eps_decay down to
    # eps), from eps_warmup * (1 + |b|_inf) relative to |c|_inf; None: 1 for coupled
    # problems, 0 (off) for separable ones or with a warm_start.  Why: the penalty is
    # eps^2 g(z / eps) with b / eps in place of b, so at a large eps the rows pass near
    # z = 0 and the first Newton steps see many of them; at eps = 0.1 the start z = 0 lies
    # deep inside the rows, the generalized Hessian is ~delta I and the exact line search
    # activates a few rows per step.  Random sparse LP (n = 500, scripts/solver/time_sparse_lp.py):
    # 168 Newton steps (100 at the first eps) -> 94 (warm-up 1), 79 (10), 73 (1e3), same
    # vertex; test_solver_oracle's 120 random LPs: 3835 steps -> 3835, 4116, 4583 (a small
    # LP pays for the extra stages), so 1
    eps_warmup: float | None = None
    max_eps_steps: int = 10         # 1 -> 1e-10: far below any well-scaled LP's eps-bar
    max_iter: int = 100             # Newton iterations per eps (typically 2-30)
    tol: float | None = None        # KKT tolerance; None: 1e-8 (float64), 1e-4 (float32)
    delta: float | None = None      # Hessian + delta*I, relative to mean diag(G^T G);
                                    # None: 1e-10 (float64), 1e-6 (float32)
    # "exact": exact line search on the 1-D piecewise quadratic (cheap: one product A d, then
    # elementwise work); "armijo": backtracking (Mangasarian 2004's globally convergent rule);
    # "fixed": the paper's constant step lambda = step_size (Meng et al. 2021, sec. 4.1); "auto":
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
    # a [..., n] guess of the optimal vertex (e.g. a closed form the caller knows): its tight
    # rows are certified by one active-set solve and the KKT check; LPs that pass skip the
    # eps loop (no Newton step), the others run it as usual.  A wrong guess costs one
    # recovery, never a wrong answer; a guess with a NaN or infinite entry is skipped.
    # Ignored by backward="unrolled" and forward="highs".
    vertex_guess: Any = None
    sketch: str | None = None       # None | "gaussian" | "sampling" (Meng et al. 2021, eq. 6-7)
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
    # faster exact forward for one large general LP (solver/backends/highs.py); "auto": Newton, except
    # that a general LP (dense or torch.sparse A) on the CPU that is large (n >= 256: there
    # Newton took 17-564x HiGHS's time on the random sparse LPs of results/solver/) goes to
    # HiGHS directly, and one that stalls, does not converge or runs past half of max_seconds
    # is handed to HiGHS; structured operators, separable LPs, GPU data and
    # backward="unrolled" keep Newton (HiGHS cannot batch them on the device)
    forward: str = "auto"
    # wall-clock bound of one solve_lp call (seconds; None: no bound).  Past it the solve
    # raises LPTimeLimitError naming the residuals and steps reached.  60 s: 30x the slowest
    # training LP measured (AUC batch 4,096: 1.8 s) and 1,000x HiGHS on the netlib LPs of
    # results/solver/public_lps.md, so it only fires on a solve that would not finish
    max_seconds: float | None = 60.0
    # stall detector: an LP whose penalty value has not dropped by a relative 1e-9 and whose
    # gradient norm has not reached a new low (x 0.5) within stall_steps Newton steps stops
    # that eps stage (it would spend the rest of max_iter there); forward="auto" hands it to
    # HiGHS.  Converging stages on the test LPs take 2-30 steps and improve every few steps
    stall_steps: int = 25
    # Ruiz equilibration rounds before Newton (solver/preprocess/scaling.py; 0: off) for dense and
    # torch.sparse A; mapped back exactly (primal, duals, backward).  Each round halves the
    # log-spread of the row and column norms; 10 leave them within 2% of 1 (8
    # decades of spread, tests/test_solver_scaling.py).  Not applied where a vertex_guess
    # certifies (no Newton step runs), to separable LPs, or with backward="unrolled" (whose
    # Jacobian is the penalty iterate's, which the scaling changes)
    equilibrate: int = 10
    # simple presolve before Newton (solver/preprocess/presolve.py): empty rows and columns, singleton
    # equality rows (fixed variables); exact substitutions, mapped back with the duals and the
    # backward.  Same scope as equilibrate, and off with a warm_start (its z has the full n)
    presolve: bool = True
    # capture-safe path (solver/capture/separable.py) for separable LPs (A a DiagonalOperator, no
    # equalities: the AUC-family LPs), and for a dense LP with a vertex_guess (the F-score family:
    # the guess certified with device masks, solver/capture/guess.py): fixed shapes, fixed_iters Newton steps in each of
    # fixed_eps_stages eps stages, finished LPs masked (never changed again), no host sync in
    # forward or backward, so the solve runs under torch.compile(fullgraph=True) and inside a
    # CUDA graph.  Stats stay device tensors; a non-converged LP is flagged, never raised.
    capture_safe: bool = False
    # the standard path needs <= 4 Newton steps and 0 eps reductions on 1,800 AUC LPs
    # (200 batches of 8-256 scores x eps 0.1/0.01/0.001, float32 and float64): 6 and 2 give
    # a margin of 2 steps and one spare stage; the results equal the standard path's whenever
    # these counts cover what it needed (tests/test_solver_capture.py)
    fixed_iters: int = 6
    fixed_eps_stages: int = 2

    def resolved(self, dtype: torch.dtype, separable: bool = False) -> "SolverOptions":
        f64 = dtype == torch.float64
        out = copy.copy(self)       # self was validated; replace() would check every field again
        if out.eps is None:
            out.eps = 1e-4 if separable else 0.1
        if out.eps_warmup is None:
            out.eps_warmup = 0.0 if separable or out.warm_start is not None else 1.0
        if out.step == "auto":
            out.step = "fixed" if separable else "exact"
        if out.tol is None:
            out.tol = 1e-8 if f64 else 1e-4
        if out.delta is None:
            out.delta = 1e-10 if f64 else 1e-6
        if out.cg_tol is None:
            out.cg_tol = 1e-12 if f64 else 1e-6
        return out

    def __post_init__(self) -> None:
        """Validate every option at construction (``SolverOptions(tol=-1)`` fails here, not after
        every eps stage of a solve); each message names the option, its value and the fix."""
        problems = [msg for ok, msg in self._checks() if not ok]
        if problems:
            raise LPInputError("bad solver option(s): " + "; ".join(problems) + ".")

    def _checks(self):
        def pos(name, allow_none=True):
            v = getattr(self, name)
            ok = (v is None and allow_none) or (_is_real(v) and math.isfinite(v) and v > 0)
            return ok, f"{name}={v!r} must be a finite number > 0" + (" or None" if allow_none else "")

        def count(name, low):
            v = getattr(self, name)
            return (isinstance(v, int) and not isinstance(v, bool) and v >= low,
                    f"{name}={v!r} must be an integer >= {low}")

        yield (self.step in ("auto", "exact", "armijo", "fixed"),
               f"step={self.step!r} must be auto, exact, armijo or fixed")
        yield self.on_fail in ("raise", "warn"), f"on_fail={self.on_fail!r} must be 'raise' or 'warn'"
        yield (self.sketch in (None, "gaussian", "sampling"),
               f"sketch={self.sketch!r} must be None, 'gaussian' or 'sampling'")
        yield (self.forward in ("auto", "newton", "highs"),
               f"forward={self.forward!r} must be 'auto', 'newton' or 'highs'")
        yield (self.max_seconds is None or (_is_real(self.max_seconds)
                                            and not math.isnan(self.max_seconds)
                                            and self.max_seconds > 0),
               f"max_seconds={self.max_seconds!r} must be a number > 0 (seconds; None: no "
               f"bound)")
        yield count("stall_steps", 2)
        yield count("equilibrate", 0)
        yield isinstance(self.presolve, bool), f"presolve={self.presolve!r} must be True or False"
        yield (self.linear_solver in ("auto",) + LINEAR_SOLVERS,   # linsolve owns the list
               f"linear_solver={self.linear_solver!r} must be auto, " + ", ".join(LINEAR_SOLVERS))
        for name in ("eps", "tol", "cg_tol"):
            yield pos(name)
        yield (self.eps_warmup is None or (_is_real(self.eps_warmup)
                                           and math.isfinite(self.eps_warmup)
                                           and self.eps_warmup >= 0),
               f"eps_warmup={self.eps_warmup!r} must be a finite number >= 0 (0: off) or None")
        for name in ("step_size", "active_tol"):
            yield pos(name, allow_none=False)
        yield (_is_real(self.max_norm) and self.max_norm > 0,   # inf: never call it divergence
               f"max_norm={self.max_norm!r} must be a number > 0 (inf disables the check)")
        yield (self.delta is None or (_is_real(self.delta) and math.isfinite(self.delta)
                                      and self.delta >= 0),
               f"delta={self.delta!r} must be a finite number >= 0 or None")
        yield (_is_real(self.eps_decay) and 0 < self.eps_decay < 1,
               f"eps_decay={self.eps_decay!r} must be in (0, 1)")
        yield count("max_iter", 1)
        yield count("max_eps_steps", 0)
        yield count("cg_max_iter", 1)
        yield count("unrolled_eps_steps", 0)
        yield count("fixed_iters", 1)
        yield count("fixed_eps_stages", 1)
        yield (isinstance(self.capture_safe, bool),
               f"capture_safe={self.capture_safe!r} must be True or False")
        yield count("sketch_seed", 0)
        yield (self.sketch_size is None or count("sketch_size", 1)[0],
               f"sketch_size={self.sketch_size!r} must be an integer >= 1 or None")
        yield (self.compute_dtype in (None, torch.float32, torch.float64),
               f"compute_dtype={self.compute_dtype!r} must be None, torch.float32 or torch.float64")

    @classmethod
    def from_kwargs(cls, options: dict) -> "SolverOptions":
        names = _FIELD_NAMES      # (not dataclasses.fields(cls): torch.compile cannot trace it)
        unknown = sorted(set(options) - names)
        if unknown:
            raise LPInputError(f"unknown solver option(s) {unknown}; valid: {sorted(names)}.")
        # a training loop passes the same options every step (plus a fresh vertex_guess /
        # warm_start, which __post_init__ does not check): validate each set once (the ~30
        # checks cost ~0.05 ms, a tenth of a small LP's solve)
        try:
            key = tuple(sorted((k, type(v), v) for k, v in options.items()
                               if k not in _PER_CALL))
            base = _VALIDATED.get(key)
        except TypeError:         # an unhashable value: validate every time
            key = base = None
        if base is None:
            out = cls(**options)
            if key is not None and len(_VALIDATED) < 256:
                _VALIDATED[key] = copy.copy(out)
                for name in _PER_CALL:
                    setattr(_VALIDATED[key], name, None)
            return out
        out = copy.copy(base)
        for name in _PER_CALL:
            setattr(out, name, options.get(name))
        return out


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_FIELD_NAMES = frozenset(f.name for f in fields(SolverOptions))
# options that vary per call and that __post_init__ does not check (their users do)
_PER_CALL = ("vertex_guess", "warm_start")
_VALIDATED: dict[tuple, SolverOptions] = {}
