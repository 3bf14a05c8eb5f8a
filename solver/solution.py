"""The result of :func:`solver.solve_lp`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class LPSolution:
    """Solution of a (batch of) LP(s) ``min c^T z s.t. A z <= b, A_eq z = b_eq, z >= 0``.

    Attributes:
        z: ``[..., n]`` primal solution, differentiable w.r.t. ``c, A, b, A_eq, b_eq``.
        value: ``[...]`` objective ``c^T z``.
        dual: ``[..., m]`` multipliers (>= 0) of ``A z <= b`` (least 2-norm dual solution).
        active: ``[..., m]`` bool, rows of ``A z <= b`` in the final active set.
        stats: plain-Python diagnostics, worst case over the batch: ``iterations`` (Newton,
            all eps stages), ``converged``, ``kkt_residual``, ``primal_infeasibility``,
            ``dual_residual``, ``duality_gap``, ``active_count`` (mean active rows + bounds),
            ``eps``, ``eps_steps``, ``linear_solver`` (``cholesky`` | ``diagonal`` | ``cg`` | ``sparse``),
            ``cg_iterations``, ``seconds``, ``forward`` (``newton`` | ``highs`` |
            ``newton+highs``: ``forward="auto"`` handed some LPs of the batch to HiGHS; with
            ``highs``, ``iterations`` counts HiGHS's simplex iterations and ``eps`` is 0),
            ``equilibrated`` (Ruiz scaling ran) and ``presolve`` (``None`` or the rows and
            columns removed); after scaling the KKT measures are those of the scaled LP.
        instance_stats: the same per LP, tensors of the batch shape.
        dual_eq: ``[..., p]`` multipliers of the equalities (or ``None``).
        dual_bounds: ``[..., n]`` multipliers of ``z >= 0``.
        active_bounds: ``[..., n]`` bool, bounds ``z_j = 0`` in the active set.
        eps: ``[...]`` penalty parameter that passed the KKT check (for warm starts).
        penalty_z: ``[..., n]`` final penalty iterate (detached; for warm starts).
    """

    z: torch.Tensor
    value: torch.Tensor
    dual: torch.Tensor
    active: torch.Tensor
    stats: dict[str, Any]
    instance_stats: dict[str, torch.Tensor] = field(default_factory=dict)
    dual_eq: torch.Tensor | None = None
    dual_bounds: torch.Tensor | None = None
    active_bounds: torch.Tensor | None = None
    eps: torch.Tensor | None = None
    penalty_z: torch.Tensor | None = None
