r"""Binary AUC through the pairwise LP of Meng et al. 2021, §3.2 eq. (1) (after Ataman et al. 2006).

.. math::

    \min_{z \ge 0} \sum_{i \in X_+} \sum_{j \in X_-} z_{ij}
    \quad \text{s.t.} \quad f(x_i) - f(x_j) \ge \epsilon - z_{ij},

with :math:`f` the softmax probability of the positive class (not stated in Meng et al.; the
authors' public code, zihangm/nondecomposable-as-lp ``binary_auc.py``, scores
``softmax(logits)[:, 1]`` of a 2-way head).  In the
solver's form: :math:`c = \mathbb 1`, :math:`A = -I` (structured diagonal operator),
:math:`b = d - \epsilon` with :math:`d_{ij} = f(x_i) - f(x_j)`.  The optimum is
:math:`z^*_{ij} = \max(0, \epsilon - d_{ij})`, so the per-pair term

.. math::

    \epsilon^{-1}\mathrm{relu}(\epsilon - z^*_{ij}) = \mathrm{clip}(d_{ij}/\epsilon, 0, 1)

is a *soft indicator that the pair is ranked correctly* (1 when :math:`d_{ij} \ge \epsilon`,
i.e. :math:`z^*_{ij} = 0`; 0 when :math:`d_{ij} \le 0`; linear in between).  Its sum is the
(soft) count of correctly ranked pairs and its mean is the ramp-AUC.  The expression displayed
below eq. (1), :math:`(|X_+||X_-| - \sum_{ij} \epsilon^{-1}\mathrm{relu}(\epsilon - z^*_{ij}))
/ (|X_+||X_-|)`, subtracts that count from the number of pairs: it is the fraction of pairs *not*
ranked correctly by a margin :math:`\epsilon`, i.e. one minus the ramp-AUC, and it is itself the
loss minimised (as in the authors' code, which minimises exactly this expression):

.. math::

    \mathcal L = \frac{|X_+||X_-| - \sum_{ij} \epsilon^{-1}\mathrm{relu}(\epsilon - z^*_{ij})}{|X_+||X_-|}
               = 1 - \operatorname{mean}_{ij} \mathrm{clip}(d_{ij}/\epsilon, 0, 1)
               \xrightarrow{\epsilon\to 0} 1 - \mathrm{AUC}
    \quad\text{(on tie-free scores)}.

Meng et al. 2021 §3.2 (below eq. 1) reads "AUC = (n - \|z\|_0)/(|X_+||X_-|) =
(n - \sum \epsilon^{-1} relu(\epsilon - z))/(|X_+||X_-|)".  The first form is right:
:math:`z_{ij} = 0` exactly when :math:`d_{ij} \ge \epsilon` (a correctly ranked pair), so
:math:`n - \|z\|_0` counts the correctly ranked pairs.  The second equality is not: its own next
sentence says the relu term is 1 when :math:`z_{ij} = 0`, so the relu sum counts the *zero*
entries, :math:`\|z\|_0 = n - \sum_{ij} \epsilon^{-1}\mathrm{relu}(\epsilon - z_{ij})`, and the
relu form equals one minus the first (the loss above, not the AUC).  Also, :math:`n` there is
Definition 3.1's sample count :math:`|X_+| + |X_-|`; for either form to be a fraction of pairs it
must be the pair count :math:`|X_+||X_-|`, which is what the authors' code uses.

Knobs: ``epsilon`` (ramp width: only pairs with :math:`0 < d_{ij} < \epsilon` carry gradient, so
a small epsilon is a sharp but sparse signal), ``score`` (``softmax`` | ``sigmoid`` | ``margin``),
``method`` (``lp`` | ``closed_form``), ``backward`` and ``solver`` options.  Degenerate batches
(no positive or no negative) return a zero loss with zero gradient and count in
``degenerate_batches``.

Example::

    >>> loss_fn = AUCLoss(epsilon=0.01)
    >>> logits = torch.randn(64, 2, requires_grad=True)
    >>> labels = torch.randint(0, 2, (64,))
    >>> loss = loss_fn(logits, labels); loss.backward()
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lpmetrics.objectives.common import binary_scores, check_labels, check_positive_class
from lpmetrics.objectives.pairwise import PAIR_LAYOUTS, PairwiseRampLP, check_pair_layout  # noqa: F401 -- re-exported


def auc_pairs(scores: torch.Tensor, labels: torch.Tensor, positive: int = 1) -> torch.Tensor | None:
    """Margins ``d_ij = s_i - s_j`` of all (positive i, negative j) pairs, positive-major order;
    ``None`` when one side is empty."""
    pos = labels == positive
    s_pos, s_neg = scores[pos], scores[~pos]
    if s_pos.numel() == 0 or s_neg.numel() == 0:
        return None
    return (s_pos[:, None] - s_neg[None, :]).reshape(-1)


class AUCLoss(PairwiseRampLP):
    """Ramp-AUC loss from the LP of eq. (1); see the module docstring for the math.

    Args:
        epsilon: ramp width (default 0.01; the paper sweeps 0.1 / 0.01 / 0.001).
        score: ``softmax`` (probability of class 1, the authors' choice), ``sigmoid`` (same for
            two logits) or ``margin`` (raw logit difference).
        positive_class: the label treated as positive (1 in every binary split here).
        method, backward, solver: see :class:`objectives.pairwise.PairwiseRampLP`.
        pair_layout: ``masked`` (default) or ``dense`` (:data:`PAIR_LAYOUTS`): the same loss and
            gradient; ``dense`` solves a B² LP of fixed shape with no host sync.
    """

    tasks = ("binary",)

    def __init__(self, epsilon: float = 0.01, score: str = "softmax", positive_class: int = 1,
                 method: str = "lp", backward: str = "active_set",
                 solver: Mapping[str, Any] | None = None, pair_layout: str = "masked") -> None:
        super().__init__(epsilon=epsilon, method=method, backward=backward, solver=solver)
        binary_scores(torch.zeros(1, 2), score)  # validates the name at construction
        self.score = score
        self.positive_class = check_positive_class(positive_class)
        self.pair_layout = check_pair_layout(pair_layout)

    def dense_pairs(self, logits: torch.Tensor, labels: torch.Tensor):
        """All ``B x B`` ordered pairs (row-major, so the (positive, negative) pairs keep
        :meth:`pairs`' order), weight ``1/(|X+||X-|)`` on those and 0 elsewhere."""
        labels = check_labels(logits, labels)
        s = binary_scores(logits, self.score)
        pos = labels == self.positive_class
        mask = (pos[:, None] & ~pos[None, :]).reshape(-1)
        count = mask.sum()
        w = mask.to(s.dtype) / count.clamp_min(1).to(s.dtype)
        return (s[:, None] - s[None, :]).reshape(-1), w, count > 0

    def pairs(self, logits: torch.Tensor, labels: torch.Tensor):
        labels = check_labels(logits, labels)
        d = auc_pairs(binary_scores(logits, self.score), labels, self.positive_class)
        if d is None:
            return None
        return d, torch.full_like(d, 1.0 / d.numel())
