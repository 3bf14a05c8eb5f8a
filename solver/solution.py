"""The result of :func:`solver.solve_lp`."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


class LazyStats(Mapping):
    """A read-only mapping built on first access by ``make()`` (the per-LP statistics of a
    small solve cost more to build as tensors than the rest of its bookkeeping, and a training
    loop rarely reads them)."""

    def __init__(self, make: Callable[[], dict[str, torch.Tensor]]) -> None:
        self._make, self._items = make, None

    def _get(self) -> dict[str, torch.Tensor]:
        items = self._items
        if items is None:
            items = self._items = self._make()
        return items

    def __reduce__(self):             # pickle, torch.save, copy: as the plain dict
        return dict, (self._get(),)

    def copy(self) -> dict[str, torch.Tensor]:
        return dict(self._get())

    def __or__(self, other):
        return self._get() | dict(other)

    def __ror__(self, other):
        return dict(other) | self._get()

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())


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
        instance_stats: the same per LP, tensors of the batch shape (a mapping; a
            :class:`LazyStats` where they are built on first access).
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
    instance_stats: Mapping[str, torch.Tensor] = field(default_factory=dict)
    dual_eq: torch.Tensor | None = None
    dual_bounds: torch.Tensor | None = None
    active_bounds: torch.Tensor | None = None
    eps: torch.Tensor | None = None
    penalty_z: torch.Tensor | None = None
