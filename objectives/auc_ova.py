r"""One-vs-all multi-class AUC LP: Meng et al. ICLR-2021 appendix A.1 eq. (8) (seed 001).

The loss the paper's multi-class table trains.  With :math:`x_i^*` the label of :math:`x_i` and
:math:`f(x, k)` the softmax probability of class :math:`k`,

.. math::

    \min_{z \ge 0} \sum_{i} \sum_{j:\, x_j^* \ne x_i^*} z_{ij}
    \quad \text{s.t.} \quad f(x_i, x_i^*) - f(x_j, x_i^*) \ge \epsilon - z_{ij},

i.e. for every class :math:`k`, each sample of class :math:`k` should out-score each other sample
on class :math:`k`'s probability.  The LP is the pairwise ramp LP of
:mod:`objectives.pairwise` (:math:`A=-I`), and "the loss function is calculated the same way as
binary AUC":

.. math::

    \mathcal L = 1 - \sum_{ij} w_{ij}\, \epsilon^{-1}\mathrm{relu}(\epsilon - z^*_{ij}),

with :math:`w_{ij} = 1/\#\text{pairs}` (``reduction="pairs"``, the paper: the pooled count) or
:math:`w_{ij} = 1/(K'|D_k||\bar D_k|)` (``reduction="classes"``: the mean of the per-class
one-vs-all AUCs over the :math:`K'` classes present, i.e. sklearn's macro OvA AUC as
:math:`\epsilon\to0`).

Missing classes: a class absent from the batch contributes no pairs; the batch counts in
``degenerate_batches``; a batch with a single class returns a zero loss (zero gradient).

Example::

    >>> loss_fn = AUCOneVsAllLoss(num_classes=3, epsilon=0.01)
    >>> loss = loss_fn(torch.randn(64, 3, requires_grad=True), torch.randint(0, 3, (64,)))
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from objectives.common import check_labels, class_scores
from objectives.pairwise import PairwiseRampLP

REDUCTIONS = ("pairs", "classes")


class AUCOneVsAllLoss(PairwiseRampLP):
    """One-vs-all ramp-AUC LP loss (eq. 8).

    Args:
        num_classes: K (filled from the data at instantiation).
        epsilon: ramp width (default 0.01, as binary AUC).
        score: ``softmax`` (class probabilities, the paper) or ``logits``.
        reduction: ``pairs`` (pooled pair count, the paper) or ``classes`` (macro mean).
        method, backward, solver: see :class:`objectives.pairwise.PairwiseRampLP`.
    """

    def __init__(self, num_classes: int, epsilon: float = 0.01, score: str = "softmax",
                 reduction: str = "pairs", method: str = "lp", backward: str = "active_set",
                 solver: Mapping[str, Any] | None = None) -> None:
        super().__init__(epsilon=epsilon, method=method, backward=backward, solver=solver)
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}")
        class_scores(torch.zeros(1, 2), score)
        self.num_classes = int(num_classes)
        self.score = score
        self.reduction = reduction

    def pairs(self, logits: torch.Tensor, labels: torch.Tensor):
        if logits.dim() != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(f"logits must be [B, {self.num_classes}] (num_classes); got "
                             f"{tuple(logits.shape)}")
        labels = check_labels(logits, labels, self.num_classes)
        f = class_scores(logits, self.score)
        margins, sizes = [], []
        for k in range(self.num_classes):
            mine = labels == k
            s_in, s_out = f[mine, k], f[~mine, k]
            if s_in.numel() == 0 or s_out.numel() == 0:
                continue
            margins.append((s_in[:, None] - s_out[None, :]).reshape(-1))
            sizes.append(margins[-1].numel())
        if not margins:
            return None
        d = torch.cat(margins)
        if self.reduction == "pairs":
            w = torch.full_like(d, 1.0 / d.numel())
        else:
            w = torch.cat([torch.full((m,), 1.0 / (len(sizes) * m), dtype=d.dtype, device=d.device)
                           for m in sizes])
        degenerate = len(sizes) < self.num_classes
        return d, w, degenerate
