r"""One-vs-all multi-class AUC LP: Meng et al., ICLR 2021 version, appendix A.1 eq. (8).

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

Capture-safe form (``pair_layout="dense"`` with ``solver.capture_safe``; what
:meth:`capture_safe_form` returns and the packed launcher trains on CUDA): every pair
:math:`(i, j)` of the class of :math:`i` is the ordered pair :math:`(i, j)` of the batch with
:math:`x_j^* \ne x_i^*` and margin :math:`f(x_i, x_i^*) - f(x_j, x_i^*)`, so the :math:`B^2`
ordered pairs of the batch, weight 0 where :math:`x_j^* = x_i^*`, hold each one-vs-all pair
exactly once: one LP of fixed size :math:`B^2` (not :math:`K B^2`), the same loss and gradient
(to roundoff: the sum runs in another order), no host sync.  Its fixed Newton counts cover what
the default path needed on the batches measured: over 300 random batches (B 2-96, K 3-5,
eps 0.1 / 0.01 / 0.001, float64 and float32 scores, ties, missing classes, one-class and
two-sample batches) the standard path took at most 4 Newton steps and 0 eps reductions, against
``fixed_iters`` 6 and ``fixed_eps_stages`` 2, and every capture-safe solve converged
(``lp_converged`` 1, recorded on the device: a batch the counts did not cover would show
there).  Measured by ``pytest tests/test_objectives_capture_ova.py -k coverage -s``.

Example::

    >>> loss_fn = AUCOneVsAllLoss(num_classes=3, epsilon=0.01)
    >>> loss = loss_fn(torch.randn(64, 3, requires_grad=True), torch.randint(0, 3, (64,)))
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lpmetrics.objectives.common import check_labels, class_scores
from lpmetrics.objectives.pairwise import PairwiseRampLP, check_pair_layout

REDUCTIONS = ("pairs", "classes")


class AUCOneVsAllLoss(PairwiseRampLP):
    """One-vs-all ramp-AUC LP loss (eq. 8).

    Args:
        num_classes: K (filled from the data at instantiation).
        epsilon: ramp width (default 0.01, as binary AUC).
        score: ``softmax`` (class probabilities, the paper) or ``logits``.
        reduction: ``pairs`` (pooled pair count, the paper) or ``classes`` (macro mean).
        method, backward, solver: see :class:`objectives.pairwise.PairwiseRampLP`.
        pair_layout: ``masked`` (default: the pairs of each class gathered by masks) or
            ``dense`` (all B x B ordered pairs, see the module docstring): the same loss and
            gradient; ``dense`` solves a B² LP of fixed shape with no host sync.
    """

    def __init__(self, num_classes: int, epsilon: float = 0.01, score: str = "softmax",
                 reduction: str = "pairs", method: str = "lp", backward: str = "active_set",
                 solver: Mapping[str, Any] | None = None, pair_layout: str = "masked") -> None:
        super().__init__(epsilon=epsilon, method=method, backward=backward, solver=solver)
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}")
        class_scores(torch.zeros(1, 2), score)
        self.num_classes = int(num_classes)
        self.score = score
        self.reduction = reduction
        self.pair_layout = check_pair_layout(pair_layout)

    def scores_and_labels(self, logits: torch.Tensor, labels: torch.Tensor):
        """``(f [B, K], labels [B])``: the checked labels and class scores of the batch."""
        if logits.dim() != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(f"logits must be [B, {self.num_classes}] (num_classes); got "
                             f"{tuple(logits.shape)}")
        labels = check_labels(logits, labels, self.num_classes)
        return class_scores(logits, self.score), labels

    def dense_pairs(self, logits: torch.Tensor, labels: torch.Tensor):
        """All ``B x B`` ordered pairs ``(i, j)``, row-major, margin ``f(x_i, y_i) - f(x_j, y_i)``,
        weight as in :meth:`pairs` where ``y_j != y_i`` and 0 elsewhere (the same pairs, in
        sample order instead of class order); ``degenerate``: a class has no pair."""
        f, labels = self.scores_and_labels(logits, labels)
        B, K = f.shape
        own = f.gather(1, labels[None, :].expand(B, B))   # own[j, i] = f(x_j, y_i)
        d = own.diagonal()[:, None] - own.T
        mask = labels[:, None] != labels[None, :]
        # per class: size n_k and pair count m_k = n_k (B - n_k) (no bincount: its size is read)
        n_k = (labels[:, None] == torch.arange(K, device=labels.device)).sum(0)
        m_k = n_k * (B - n_k)
        total = m_k.sum()
        present = (m_k > 0).sum()
        if self.reduction == "pairs":
            den = total.clamp_min(1)
        else:
            den = (present * m_k.gather(0, labels)).clamp_min(1)[:, None]
        w = mask.to(d.dtype) / den.to(d.dtype)
        return d.reshape(-1), w.reshape(-1), total > 0, present < K

    def pairs(self, logits: torch.Tensor, labels: torch.Tensor):
        f, labels = self.scores_and_labels(logits, labels)
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
