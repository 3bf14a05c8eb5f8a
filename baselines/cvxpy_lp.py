r"""The project's LPs through cvxpylayers: the "CVXPY-SCS" baseline of Meng et al. 2021 (§5,
"Optimizing F1-score"; Table 3).

:class:`CvxpyLP` is a generic differentiable layer for

.. math::

    z^*(c, A, b, A_{eq}, b_{eq}) = \arg\min_z c^\top z
    \quad\text{s.t.}\quad A z \le b,\ A_{eq} z = b_{eq},\ z \ge 0,

written as a DPP-compliant cvxpy problem whose data are ``cp.Parameter`` s, solved and
differentiated by cvxpylayers (Agrawal et al. 2019, "Differentiable convex optimization layers",
NeurIPS): the LP becomes a cone program, diffcp solves it with SCS (the paper's choice) or
Clarabel, and the backward pass differentiates the homogeneous self-dual embedding's residual map
(implicit function theorem; solved by LSQR by default).  The objectives below solve *literally*
the LPs that :class:`objectives.auc.AUCLoss` and :class:`objectives.ratio.F1LPLoss` build, with
the same loss read off :math:`z^*`; only the solve step differs.

Deviations and practical notes:

* Compiling a cvxpy problem costs 0.1-4 s and fixes the shapes, while minibatch class counts make
  ``(m, n, m_eq)`` vary from batch to batch; compiled layers are kept in an LRU dict keyed by the
  shapes (``cache_size`` entries).
* ``A = -I`` of the AUC LP is passed as the solver's ``DiagonalOperator`` and becomes a diagonal
  parameter (``multiply(a, z) <= b``): the same LP with the sparsity the cone solver would see
  anyway.  ``structure="dense"`` makes it an ``m x m`` dense parameter instead (3.8 s to compile
  and 0.3 s per solve at 1024 pairs, recompiled for nearly every batch).
* The layer computes in float64 and returns the input dtype; it runs on the CPU (inputs on a GPU
  are moved and the result moved back: cvxpylayers' diffcp path has no GPU support, Table 3).
* SCS's default tolerances (``eps_abs = eps_rel = 1e-4``) are kept unless ``solver_args`` says
  otherwise; a loss is accurate to about ``tolerance / epsilon`` for the ramp-AUC.

Example::

    >>> layer = CvxpyLP(solver="SCS")
    >>> c = torch.tensor([-1.0, -1.0]); A = torch.tensor([[1.0, 2.0], [3.0, 1.0]])
    >>> b = torch.tensor([4.0, 6.0], requires_grad=True)
    >>> z = layer(c, A, b)          # ~[1.6, 1.2]
    >>> z.sum().backward()          # db through cvxpylayers
"""
from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from diffcp.cone_program import SolverError
from torch import nn

from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.pairwise import neg_identity
from lpmetrics.objectives.ratio import F1LPLoss

# our name -> diffcp's ``solve_method`` (cvxpylayers 1.2 hands the cone program to diffcp)
SOLVERS = {"SCS": "SCS", "CLARABEL": "Clarabel", "ECOS": "ECOS"}
STRUCTURES = ("diagonal", "dense")
# diffcp keys of the derivative path only (the solve-only path would hand them to SCS)
_DERIVATIVE_ONLY = ("n_jobs_backward", "mode", "derivative_kwargs")


@dataclass
class CvxpySolution:
    """What :meth:`CvxpyLP.solve` returns: ``z`` and the diagnostics every LP objective logs.

    diffcp returns neither iteration counts nor duals here: ``iterations`` is NaN and
    ``kkt_residual`` is the primal part only (max violation of ``Az <= b``, ``A_eq z = b_eq``,
    ``z >= 0``); ``converged`` is 1 (a failed solve raises); ``solve_time`` in seconds."""

    z: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


def _diagonal_of(A) -> torch.Tensor | None:
    """The diagonal of a solver ``DiagonalOperator`` (``None`` for anything else)."""
    from lpmetrics.solver import DiagonalOperator
    return A.d if isinstance(A, DiagonalOperator) else None


class CvxpyLP(nn.Module):
    """``z* = argmin c^T z s.t. A z <= b, A_eq z = b_eq, z >= 0`` through cvxpylayers.

    Args:
        solver: ``"SCS"`` (the paper's CVXPY-SCS), ``"CLARABEL"`` (interior point) or ``"ECOS"``
            (needs the ``ecos`` package, not pinned here).
        solver_args: keyword options for the cone solver and diffcp (e.g. ``{"eps_abs": 1e-8,
            "eps_rel": 1e-8, "max_iters": 100000}`` for SCS, ``{"mode": "dense"}`` for diffcp's
            backward).
        n_jobs: diffcp's thread pool size over a batch of LPs (1 = serial, the fair CPU count).
        cache_size: compiled problems kept (LRU, keyed by ``(m, n, m_eq, structure)``).

    ``forward(c, A, b, A_eq=None, b_eq=None)``: ``c [..., n]``, ``A [..., m, n]`` dense or a
    solver ``DiagonalOperator`` (``m = n``), ``b [..., m]``, ``A_eq [..., p, n]``, ``b_eq [..., p]``;
    at most one leading batch dimension (cvxpylayers broadcasts unbatched data).  Gradients flow
    to every tensor that requires them.
    """

    def __init__(self, solver: str = "SCS", solver_args: Mapping[str, Any] | None = None,
                 n_jobs: int = 1, cache_size: int = 16) -> None:
        super().__init__()
        key = str(solver).upper()
        if key not in SOLVERS:
            raise ValueError(f"solver={solver!r} is not a diffcp cone solver; choose one of "
                             f"{tuple(SOLVERS)} (SCS reproduces the paper's CVXPY-SCS)")
        if key == "ECOS":
            try:
                import ecos  # noqa: F401
            except ImportError as err:
                raise ImportError("solver='ECOS' needs the ecos package (pip install ecos); "
                                  "or use solver='SCS' / 'CLARABEL'") from err
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1; got {cache_size}")
        self.solver = key
        self.solver_args = {"solve_method": SOLVERS[key], "n_jobs_forward": int(n_jobs),
                            "n_jobs_backward": int(n_jobs), **dict(solver_args or {})}
        self.cache_size = int(cache_size)
        self._layers: OrderedDict[tuple, Any] = OrderedDict()
        self.compiles = 0

    def _layer(self, m: int, n: int, p: int, structure: str):
        key = (m, n, p, structure)
        if key in self._layers:
            self._layers.move_to_end(key)
            return self._layers[key]
        import cvxpy as cp
        from cvxpylayers.torch import CvxpyLayer
        z = cp.Variable(n)
        c, b = cp.Parameter(n), cp.Parameter(m)
        A = cp.Parameter(n) if structure == "diagonal" else cp.Parameter((m, n))
        Az = cp.multiply(A, z) if structure == "diagonal" else A @ z
        cons, params = [Az <= b, z >= 0], [c, A, b]
        if p:
            A_eq, b_eq = cp.Parameter((p, n)), cp.Parameter(p)
            cons.append(A_eq @ z == b_eq)
            params += [A_eq, b_eq]
        problem = cp.Problem(cp.Minimize(c @ z), cons)
        layer = CvxpyLayer(problem, parameters=params, variables=[z])
        self._layers[key] = layer
        self.compiles += 1
        if len(self._layers) > self.cache_size:
            self._layers.popitem(last=False)
        return layer

    def solve(self, c, A, b, A_eq=None, b_eq=None) -> CvxpySolution:
        """:meth:`forward` plus diagnostics (max constraint violation, active rows, time)."""
        diag = _diagonal_of(A)
        structure = "diagonal" if diag is not None else "dense"
        if diag is None and not isinstance(A, torch.Tensor):
            if hasattr(A, "dense"):  # another solver LinearOperator: cvxpy needs its matrix
                A = A.dense()
            else:
                raise TypeError(f"A must be a dense tensor or a solver DiagonalOperator; got {type(A)}")
        if (A_eq is None) != (b_eq is None):
            raise ValueError("pass A_eq and b_eq together (or neither)")
        n = c.shape[-1]
        m = b.shape[-1]
        if diag is not None and not diag.shape[-1] == m == n or \
                diag is None and A.shape[-2:] != (m, n):
            raise ValueError(f"A must be [m, n] = [{m}, {n}] (from b and c); got "
                             f"{tuple((diag if diag is not None else A).shape)}")
        p = 0 if A_eq is None else A_eq.shape[-2]
        out_dtype, device = c.dtype, c.device
        data = [c, diag if diag is not None else A, b] + ([A_eq, b_eq] if p else [])
        data = [t.to(device="cpu", dtype=torch.float64) for t in data]
        layer = self._layer(m, n, p, structure)
        args = dict(self.solver_args)
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in data)):
            # cvxpylayers then calls diffcp.solve_only_batch, which passes unknown keys to SCS
            for key in _DERIVATIVE_ONLY:
                args.pop(key, None)
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():   # numpy-2 copy-keyword noise from cvxpylayers 1.2
                warnings.filterwarnings("ignore", category=DeprecationWarning, module="cvxpylayers")
                (z,) = layer(*data, solver_args=args)
        except SolverError as err:
            from lpmetrics.solver.errors import LPSolverError
            status = str(err).lower()
            kind = next((k for k in ("infeasible", "unbounded") if k in status), "not_converged")
            raise LPSolverError(f"cvxpylayers/{self.solver}: {err} (LP with m={m}, n={n}, "
                                f"m_eq={p}); check feasibility and boundedness, or loosen/raise "
                                "solver_args (eps_abs, max_iters)", kind=kind) from err
        elapsed = time.perf_counter() - t0
        z = z.to(device=device, dtype=out_dtype)
        return CvxpySolution(z=z, stats=self._stats(z.detach(), data, diag is not None, elapsed))

    @staticmethod
    def _stats(z, data, diagonal: bool, elapsed: float) -> dict[str, float]:
        z = z.double().cpu()
        c, A, b = (t.detach() for t in data[:3])
        Az = A * z if diagonal else (A @ z[..., None])[..., 0]
        slack = b - Az
        viol = [torch.relu(-slack).max(), torch.relu(-z).max()]
        if len(data) == 5:
            A_eq, b_eq = data[3].detach(), data[4].detach()
            viol.append(((A_eq @ z[..., None])[..., 0] - b_eq).abs().max())
        return {"iterations": float("nan"), "kkt_residual": float(max(viol)),
                "active_count": float((slack.abs() < 1e-6).sum(-1).double().mean()),
                "converged": 1.0, "solve_time": elapsed}

    def forward(self, c, A, b, A_eq=None, b_eq=None) -> torch.Tensor:
        return self.solve(c, A, b, A_eq, b_eq).z

    def extra_repr(self) -> str:
        return f"solver={self.solver!r}, cache_size={self.cache_size}"


def _cvxpy_stats(sol: CvxpySolution) -> dict[str, float]:
    return {"lp_kkt_residual": sol.stats["kkt_residual"], "lp_active": sol.stats["active_count"],
            "lp_solve_time": sol.stats["solve_time"]}


class AUCCvxpyLoss(AUCLoss):
    r"""Ramp-AUC loss of :class:`objectives.auc.AUCLoss` with the pairwise LP
    :math:`\min \mathbb 1^\top z` s.t. :math:`-z \le d - \epsilon`, :math:`z \ge 0` solved by
    cvxpylayers (CVXPY-SCS) instead of the Newton solver; the loss is the same
    :math:`1 - \sum w_{ij}\epsilon^{-1}\mathrm{relu}(\epsilon - z^*_{ij})`.

    Args:
        epsilon, score, positive_class: as :class:`objectives.auc.AUCLoss`.
        solver, solver_args, n_jobs, cache_size: as :class:`CvxpyLP`.
        structure: ``"diagonal"`` (``A = -I`` as a diagonal parameter, default) or ``"dense"``.

    Example::

        >>> loss = AUCCvxpyLoss(epsilon=0.01)(torch.randn(16, 2, requires_grad=True),
        ...                                   torch.arange(16) % 2)
    """

    def __init__(self, epsilon: float = 0.01, score: str = "softmax", positive_class: int = 1,
                 solver: str = "SCS", solver_args: Mapping[str, Any] | None = None,
                 structure: str = "diagonal", n_jobs: int = 1, cache_size: int = 16) -> None:
        super().__init__(epsilon=epsilon, score=score, positive_class=positive_class)
        if structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}; got {structure!r}")
        self.structure = structure
        self.layer = CvxpyLP(solver=solver, solver_args=solver_args, n_jobs=n_jobs,
                             cache_size=cache_size)

    def solve_pairs(self, d: torch.Tensor) -> torch.Tensor:
        m = d.numel()
        A = neg_identity(m, d) if self.structure == "diagonal" else \
            -torch.eye(m, dtype=d.dtype, device=d.device)
        sol = self.layer.solve(torch.ones_like(d), A, d - self.epsilon)
        self.record(**_cvxpy_stats(sol))
        return sol.z

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}, structure={self.structure!r}, {self.layer.extra_repr()}"


class F1CvxpyLoss(F1LPLoss):
    r"""F1 loss of :class:`objectives.ratio.F1LPLoss` (:math:`-\mathrm{OPT}` of the
    Charnes-Cooper LP built by :func:`objectives.fractional.charnes_cooper_lp`) with the LP solved
    by cvxpylayers; the paper's CVXPY-SCS baseline of the F1 experiment (Meng et al. 2021 §5).

    Args:
        phi, safeguard, positive_class, bound, margin: as :class:`objectives.ratio.F1LPLoss`
            (the config keeps the paper's relaxation: ``phi=softmax``, ``bound=upper``, margin 0).
        solver, solver_args, n_jobs, cache_size: as :class:`CvxpyLP`.

    Example::

        >>> loss = F1CvxpyLoss()(torch.randn(16, 2, requires_grad=True), torch.arange(16) % 2)
    """

    def __init__(self, phi: str = "softmax", safeguard: str = "drop_redundant",
                 positive_class: int = 1, solver: str = "SCS",
                 solver_args: Mapping[str, Any] | None = None, n_jobs: int = 1,
                 cache_size: int = 16, bound: str = "upper", margin: float = 0.0) -> None:
        super().__init__(phi=phi, safeguard=safeguard, positive_class=positive_class,
                         bound=bound, margin=margin)
        self.layer = CvxpyLP(solver=solver, solver_args=solver_args, n_jobs=n_jobs,
                             cache_size=cache_size)

    def lp_value(self, phi: torch.Tensor, y: torch.Tensor, backward: str | None = None):
        """The hook of :class:`objectives.ratio.RatioLPLoss`: same LP, solved by cvxpylayers."""
        lp = self.build_lp(phi, y)
        zs, solve_time = [], 0.0
        for c in lp.c.reshape(-1, lp.c.shape[-1]):      # bound="mid" stacks two costs: two solves
            sol = self.layer.solve(c, lp.A, lp.b, lp.A_eq, lp.b_eq)
            zs.append(sol.z)
            solve_time += sol.stats["solve_time"]
        self.record(lp_solve_time=solve_time)           # per step (both LPs for bound="mid")
        z = torch.stack(zs).reshape(lp.c.shape)
        return lp.value(z).mean(), sol                  # stats of the last LP

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.layer.extra_repr()}"
