"""``LPLayer``: the ``nn.Module`` form of :func:`solver.solve_lp`."""
from __future__ import annotations

import torch

from lpmetrics.solver.options import SolverOptions
from lpmetrics.solver.solve import solve_lp


class LPLayer(torch.nn.Module):
    r"""Differentiable LP layer ``z*(c, A, b) = argmin c^T z s.t. A z <= b, A_eq z = b_eq, z >= 0``.

    Solved by Mangasarian's generalized Newton method on the exterior penalty (Mangasarian
    2004, JOTA 121; 2006, JMLR 7; Meng et al. 2021, sec. 4); gradients by implicit differentiation
    on the final active set (``backward="active_set"``) or through the Newton iterations
    (``backward="unrolled"``).  Options are those of :func:`solver.solve_lp`; ``forward``
    returns the :class:`solver.LPSolution` and keeps its ``stats`` in ``last_stats``.

    Example (a vertex of the box ``0 <= z <= 1`` cut by ``z1 + z2 <= 1.5``):

    >>> import torch
    >>> from lpmetrics.solver import LPLayer
    >>> layer = LPLayer(backward="active_set", tol=1e-10)
    >>> c = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    >>> A = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    >>> b = torch.tensor([1.0, 1.0, 1.5], dtype=torch.float64, requires_grad=True)
    >>> sol = layer(c, A, b)
    >>> sol.z.detach().numpy().round(6).tolist()
    [0.5, 1.0]
    >>> sol.active.tolist()
    [False, True, True]
    >>> sol.value.backward()            # d(c^T z*)/db = -dual
    >>> (b.grad + 0.0).numpy().round(6).tolist()
    [0.0, -1.0, -1.0]
    >>> sol.stats["converged"]
    True
    """

    def __init__(self, backward: str = "active_set", **options):
        super().__init__()
        SolverOptions.from_kwargs(options)  # fail early on a typo
        self.backward = backward
        self.options = options
        self.last_stats: dict = {}

    def forward(self, c, A, b, A_eq=None, b_eq=None, **overrides):
        sol = solve_lp(c, A, b, A_eq, b_eq, backward=self.backward,
                       **{**self.options, **overrides})
        self.last_stats = sol.stats
        return sol

    def extra_repr(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"backward={self.backward!r}" + (f", {opts}" if opts else "")
