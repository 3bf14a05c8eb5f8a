r"""Separable NMF as an LP layer (Meng et al., ICLR 2021 version, appendix A.3; Recht, Re, Tropp &
Bittorf 2012).

For a nonnegative :math:`V \in \mathbb R^{s\times w}` whose rows sum to one, a rank-:math:`r`
separable factorisation :math:`V = FW` takes the rows of :math:`W` among the rows of :math:`V`
("anchor" rows).  Recht et al. find them with the LP (Meng et al., ICLR 2021 version, eq. 17)

.. math::

    \min_{C \ge 0}\ p^\top \mathrm{diag}(C)
    \quad\text{s.t.}\quad CV = V,\ \ \mathrm{tr}(C) = r,\ \ C_{jj} \le 1,\ \ C_{ij} \le C_{jj},

with distinct costs :math:`p`; the anchors are the :math:`j` with :math:`C_{jj} = 1`,
:math:`W = V_{\text{anchors},-}` and :math:`F = C_{-,\text{anchors}}`.  Real activations are not
exactly separable, so (as Recht et al.'s robust variant, which bounds :math:`\|CV - V\|`) the
equality is made elastic with one slack per row, priced by ``penalty``:

.. math::

    -\tau_i \le (CV - V)_{ij} \le \tau_i \ \ \forall i, j, \qquad
    \text{objective } p^\top\mathrm{diag}(C) + \lambda\,\mathbb 1^\top \tau .

Solver form: :math:`x = [\mathrm{vec}(C)\ (s^2, \text{row-major}),\ \tau\ (s)]`,
:math:`(CV)_{ij} = (I_s \otimes V^\top)_{(i,j),-}\,\mathrm{vec}(C)`: :math:`2sw + s + s(s-1)`
inequality rows, one equality, :math:`s^2 + s` variables (so keep :math:`s` small: the paper
used :math:`s = 20` channels).  Gradients reach :math:`V` through the LP (:math:`F`) and through
the selected rows (:math:`W`).

Example::

    >>> layer = NMFLayer(rank=2)
    >>> out = layer(V)                      # V: [s, w] nonnegative
    >>> out.W.reshape(2, h, w)              # two heat maps
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from lpmetrics.objectives.common import solve, solver_stats

METHODS = ("lp", "highs")


@dataclass
class NMFResult:
    C: torch.Tensor        # [s, s] the LP's self-expression matrix
    anchors: torch.Tensor  # [r] indices of the anchor rows (largest diag(C))
    F: torch.Tensor        # [s, r] = C[:, anchors]
    W: torch.Tensor        # [r, w] = normalised V[anchors]
    residual: torch.Tensor  # [s] the row slacks tau


def nmf_lp(V: torch.Tensor, rank: int, costs: torch.Tensor, penalty: float):
    """``(c, A, b, A_eq, b_eq)`` of the elastic Hottopixx LP for row-normalised ``V [s, w]``."""
    s, w = V.shape
    dt, dev = V.dtype, V.device
    eye = torch.eye(s, dtype=dt, device=dev)
    fit = torch.kron(eye, V.T.contiguous())                        # [(s*w), s*s]: vec(CV)
    tau = torch.kron(eye, torch.ones(w, 1, dtype=dt, device=dev))  # row i's slack on its w entries
    diag_idx = torch.arange(s, device=dev) * (s + 1)
    unit = torch.eye(s * s, dtype=dt, device=dev)
    off = [(i, j) for i in range(s) for j in range(s) if i != j]
    rows_i = torch.tensor([i * s + j for i, j in off], device=dev)
    rows_j = torch.tensor([j * (s + 1) for _, j in off], device=dev)
    dominance = unit[rows_i] - unit[rows_j]                     # C_ij - C_jj <= 0
    zeros = lambda k: torch.zeros(k, s, dtype=dt, device=dev)  # noqa: E731
    A = torch.cat([torch.cat([fit, -tau], 1),
                   torch.cat([-fit, -tau], 1),
                   torch.cat([unit[diag_idx], zeros(s)], 1),   # C_jj <= 1
                   torch.cat([dominance, zeros(len(off))], 1)], 0)
    v = V.reshape(-1)
    b = torch.cat([v, -v, torch.ones(s, dtype=dt, device=dev),
                   torch.zeros(len(off), dtype=dt, device=dev)])
    c = torch.zeros(s * s + s, dtype=dt, device=dev)
    c[diag_idx] = costs.to(dt)
    c[s * s:] = penalty
    A_eq = torch.zeros(1, s * s + s, dtype=dt, device=dev)
    A_eq[0, diag_idx] = 1.0
    return c, A, b, A_eq, torch.tensor([float(rank)], dtype=dt, device=dev)


def _highs(c, A, b, A_eq, b_eq) -> torch.Tensor:
    from scipy.optimize import linprog
    to = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
    res = linprog(to(c), A_ub=to(A), b_ub=to(b), A_eq=to(A_eq), b_eq=to(b_eq), bounds=(0, None),
                  method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the NMF LP: {res.message}")
    return torch.as_tensor(np.asarray(res.x), dtype=c.dtype, device=c.device)


class NMFLayer(nn.Module):
    """Rank-``rank`` separable NMF of ``V [s, w]`` by the LP above (an ``nn.Module`` on solve_lp).

    Args:
        rank: number of anchors r (heat maps).
        penalty: price lambda of the per-row misfit tau (large = closer to the exact CV = V).
        costs: the distinct costs p; default ``1 + 1e-2 * j / s`` (small spread so the fit dominates).
        method: ``lp`` (solver.solve_lp, differentiable) or ``highs`` (scipy reference, no grad).
        backward, solver: the solver's backward mode and extra options.
    """

    def __init__(self, rank: int, penalty: float = 10.0, costs: list[float] | None = None,
                 method: str = "lp", backward: str = "active_set",
                 solver: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank must be >= 1; got {rank}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}; got {method!r}")
        self.rank, self.penalty, self.method, self.backward = int(rank), float(penalty), method, backward
        self.costs = None if costs is None else torch.as_tensor(costs, dtype=torch.float64)
        self.solver_options = dict(solver or {})
        self.last_stats: dict[str, float] = {}

    def forward(self, V: torch.Tensor) -> NMFResult:
        if V.dim() != 2 or V.shape[0] <= self.rank:
            raise ValueError(f"V must be [s, w] with s > rank={self.rank}; got {tuple(V.shape)}")
        if (V < 0).any():
            raise ValueError("V must be nonnegative (e.g. post-ReLU activations)")
        s = V.shape[0]
        Vn = V / V.sum(1, keepdim=True).clamp_min(1e-12)
        costs = self.costs if self.costs is not None else 1 + 1e-2 * torch.arange(s) / s
        lp = nmf_lp(Vn, self.rank, costs, self.penalty)
        if self.method == "highs":
            x = _highs(*lp)
        else:
            sol = solve(*lp, backward=self.backward, options=self.solver_options)
            x, self.last_stats = sol.z, solver_stats(sol)
        C = x[: s * s].reshape(s, s)
        anchors = torch.topk(torch.diagonal(C).detach(), self.rank).indices
        return NMFResult(C=C, anchors=anchors, F=C[:, anchors], W=Vn[anchors], residual=x[s * s:])
