r"""AUC_mu (Kleiman & Page 2019) as an LP: Meng et al. 2021 §3.3 eq. (2) (0/1 costs) and
ICLR-2021 appendix A.1 eq. (9) (arbitrary cost / partition matrix :math:`P`).

For classes :math:`a < b`, :math:`v = P_{a,-} - P_{b,-} \in \mathbb R^K` (row :math:`k` of
:math:`P` holds the costs of predicting :math:`k`), and samples :math:`x_i` of class :math:`a`,
:math:`x_j` of class :math:`b`, the orientation is

.. math::

    O_{ij} = (v_a - v_b)\,\big(\langle v, f(x_i,-)\rangle - \langle v, f(x_j,-)\rangle\big)
           = (v_a - v_b) \sum_{k=1}^K v_k \big(f(x_i,k) - f(x_j,k)\big),

and the LP (eq. 9) is

.. math::

    \min_{z\ge0} \sum_{i}\sum_{j:\,x_i^* < x_j^*} z_{ij}
    \quad\text{s.t.}\quad O_{ij} \ge \epsilon - z_{ij}.

With 0/1 costs :math:`O_{ij} = 2\tilde f(i,j)`, :math:`\tilde f(i,j) = f(x_i,a) - f(x_j,a) +
f(x_j,b) - f(x_i,b)`: eq. (2) of the paper, whose printed factor :math:`\tilde d_{ij} = -2` would
flip the orientation, so the constraint is built from the definition of :math:`O` instead.  The
loss is the pairwise ramp of :mod:`objectives.pairwise`:

.. math::

    \mathcal L = 1 - \sum_{ij} w_{ij}\,\epsilon^{-1}\mathrm{relu}(\epsilon - z^*_{ij}),\qquad
    w_{ij} = \frac{1}{|\mathcal C|\,|D_a||D_b|}\ (\texttt{reduction="class\_pairs"}),

averaging over the set :math:`\mathcal C` of class pairs present, so that
:math:`1-\mathcal L \to \mathrm{AUC}_\mu` as :math:`\epsilon \to 0` on tie-free scores;
``reduction="pairs"`` pools all pairs (eq. 2 read literally).  Missing classes: only the class
pairs present enter; the batch counts in ``degenerate_batches``; no pair at all gives a zero loss.

Example::

    >>> loss_fn = AUCMuLoss(num_classes=3, epsilon=0.01)            # 0/1 costs
    >>> loss_fn = AUCMuLoss(num_classes=3, cost_matrix=[[0, 1, 2], [1, 0, 1], [2, 1, 0]])
    >>> loss = loss_fn(torch.randn(64, 3, requires_grad=True), torch.randint(0, 3, (64,)))
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lpmetrics.objectives.common import check_labels, class_scores
from lpmetrics.objectives.pairwise import PairwiseRampLP

REDUCTIONS = ("class_pairs", "pairs")


def orientation_pairs(f: torch.Tensor, labels: torch.Tensor, cost: torch.Tensor):
    """Orientations ``O_ij`` for all ``(i in class a, j in class b)``, ``a < b``: a list of
    ``(a, b, O_ab [|D_a| * |D_b|])`` for the class pairs present in the batch."""
    K = cost.shape[0]
    out = []
    for a in range(K):
        fa = f[labels == a]
        if fa.shape[0] == 0:
            continue
        for b in range(a + 1, K):
            fb = f[labels == b]
            if fb.shape[0] == 0:
                continue
            v = cost[a] - cost[b]
            o = (v[a] - v[b]) * ((fa @ v)[:, None] - (fb @ v)[None, :])
            out.append((a, b, o.reshape(-1)))
    return out


class AUCMuLoss(PairwiseRampLP):
    """AUC_mu ramp LP loss (eq. 2 / eq. 9).

    Args:
        num_classes: K (filled from the data at instantiation).
        cost_matrix: ``K x K`` partition matrix ``P`` (``P[k, k']`` = cost of predicting ``k``
            when the truth is ``k'``); ``None`` = 0 on the diagonal, 1 elsewhere (the paper).
        epsilon: ramp width, in units of ``O_ij`` (which is ``2 x`` the score margin for 0/1 costs).
        score: ``softmax`` (class probabilities, as Kleiman & Page) or ``logits``.
        reduction: ``class_pairs`` (-> AUC_mu) or ``pairs`` (pooled).
        method, backward, solver: see :class:`objectives.pairwise.PairwiseRampLP`.
    """

    def __init__(self, num_classes: int, cost_matrix: Sequence[Sequence[float]] | None = None,
                 epsilon: float = 0.01, score: str = "softmax", reduction: str = "class_pairs",
                 method: str = "lp", backward: str = "active_set",
                 solver: Mapping[str, Any] | None = None) -> None:
        super().__init__(epsilon=epsilon, method=method, backward=backward, solver=solver)
        K = int(num_classes)
        if cost_matrix is None:
            cost = 1.0 - torch.eye(K)
        else:
            cost = torch.as_tensor([list(map(float, row)) for row in cost_matrix])
            if cost.shape != (K, K):
                raise ValueError(f"cost_matrix must be {K}x{K} (num_classes); got {tuple(cost.shape)}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}")
        class_scores(torch.zeros(1, 2), score)
        self.register_buffer("cost", cost.double(), persistent=False)
        self.num_classes, self.score, self.reduction = K, score, reduction

    def pairs(self, logits: torch.Tensor, labels: torch.Tensor):
        if logits.dim() != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(f"logits must be [B, {self.num_classes}] (num_classes); got "
                             f"{tuple(logits.shape)}")
        labels = check_labels(logits, labels, self.num_classes)
        f = class_scores(logits, self.score)
        blocks = orientation_pairs(f, labels, self.cost.to(f.dtype))
        if not blocks:
            return None
        d = torch.cat([o for _, _, o in blocks])
        if self.reduction == "pairs":
            w = torch.full_like(d, 1.0 / d.numel())
        else:
            w = torch.cat([torch.full_like(o, 1.0 / (len(blocks) * o.numel())) for _, _, o in blocks])
        degenerate = len(blocks) < self.num_classes * (self.num_classes - 1) // 2
        return d, w, degenerate
