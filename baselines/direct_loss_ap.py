r"""Average precision as the task loss of direct loss minimization (Song, Schwing, Zemel, Urtasun
2016, "Direct loss minimization for training deep neural nets"; §3: eq. (4), Observation 1,
Fig. 2 / Lemma 1).

The output is a ranking of the batch, written as pairwise signs :math:`y_{mn} \in \{\pm1\}`
(:math:`+1`: positive :math:`m` above negative :math:`n`), with scores :math:`\phi_i` and
positives :math:`\mathcal P`, negatives :math:`\mathcal N`:

.. math::

    F(x, y, w) = \frac{1}{|\mathcal P||\mathcal N|}\sum_{m\in\mathcal P, n\in\mathcal N}
        y_{mn}\,(\phi_m - \phi_n), \qquad
    \Delta_{AP}(y^*, y) = 1 - \frac{1}{|\mathcal P|}\sum_{j:\,\hat p_j = 1}\mathrm{Prec}@j.

By Observation 1 every output that matters is an interleaving of the score-sorted positives and
negatives, so an output is stored as ``neg_above [|P|]``: how many negatives are ranked above each
sorted positive (non-decreasing). Prediction :math:`y_w` sorts the scores; the ground truth
:math:`y^*` puts every positive first (``neg_above = 0``); loss-augmented inference
:math:`\arg\max_y F(x, y, w) + c\,\Delta_{AP}(y^*, y)` (any real :math:`c`: :math:`\pm\epsilon` for
the direct updates, the margin for the hinge) is the :math:`O(|\mathcal P||\mathcal N|)` dynamic
program of Fig. 2,
:math:`h(i, j) = \max\{h(i-1, j) - c\frac{1}{|\mathcal P|}\frac{i}{i+j} + B(i, j),\;
h(i, j-1) + G(i, j)\}` with :math:`B(i, j) = -\frac{1}{|\mathcal P||\mathcal N|}
\sum_{k\le j}(\phi_i - \phi_k)` and :math:`G(i, j) = \frac{1}{|\mathcal P||\mathcal N|}
\sum_{k\le i}(\phi_k - \phi_j)`; back-tracking gives the ranking. Each row is one max-plus scan
(``np.maximum.accumulate``), so the Python loop runs over positives only.

Ties in the scores are broken by sort order (stable), so :math:`1 - AP` may differ from
scikit-learn's tie-averaged value when scores tie exactly.
"""
from __future__ import annotations

import numpy as np
import torch


def ap_loss_of_ranking(neg_above: np.ndarray) -> float:
    """:math:`\\Delta_{AP}` of a ranking given, for each score-sorted positive, how many negatives
    are ranked above it (a non-decreasing integer vector)."""
    i = np.arange(1, len(neg_above) + 1)
    return float(1.0 - np.mean(i / (i + neg_above)))


def loss_augmented_ranking(pos: np.ndarray, neg: np.ndarray, coef: float) -> tuple[np.ndarray, float]:
    """Solve :math:`\\max_y F(x, y, w) + c\\,\\Delta_{AP}(y^*, y)` by the DP of Fig. 2.

    Args:
        pos, neg: scores of the positives / negatives, each sorted in descending order.
        coef: :math:`c` (the paper's :math:`\\pm\\epsilon`); any real number.

    Returns:
        ``neg_above`` (``[|P|]`` ints: negatives ranked above each positive) and the optimal value
        :math:`F(y) + c\\,\\Delta_{AP}(y)`.
    """
    P, N = len(pos), len(neg)
    scale = 1.0 / (P * N)
    cneg = np.concatenate([[0.0], np.cumsum(neg)])           # C^-_j, j = 0..N
    jj = np.arange(N + 1)
    h_prev = np.zeros(N + 1)                                   # row i = 0: only negatives so far
    up = np.zeros((P + 1, N + 1), dtype=bool)
    cpos = 0.0
    for i in range(1, P + 1):
        cpos += pos[i - 1]
        # a_j: reach (i, j) by adding positive i after j negatives (it sits at rank i + j)
        a = h_prev - coef / P * i / (i + jj) - scale * (jj * pos[i - 1] - cneg)
        # h(i, j) = max(a_j, h(i, j-1) + G(i, j)) = cG_j + max_{k<=j} (a_k - cG_k)
        cG = np.concatenate([[0.0], np.cumsum(scale * (cpos - i * neg))])
        run = np.maximum.accumulate(a - cG)
        h_prev = cG + run
        up[i, 0] = True
        up[i, 1:] = (a - cG)[1:] >= run[:-1]
    neg_above = np.empty(P, dtype=np.int64)
    i, j = P, N
    while i > 0:
        if up[i, j]:
            neg_above[i - 1] = j
            i -= 1
        else:
            j -= 1
    # the recursion drops Delta's constant "1": add c back for the true optimum
    return neg_above, float(h_prev[N] + coef)


def ranking_signs(neg_above: np.ndarray, num_neg: int) -> np.ndarray:
    """Pairwise :math:`y_{mn}` (sorted positives x sorted negatives) of an interleaving."""
    return np.where(np.arange(num_neg)[None, :] >= neg_above[:, None], 1.0, -1.0)


class APTask:
    """One batch seen by the AP task loss: the outputs, :math:`\\Delta_{AP}` and a differentiable
    :math:`F` (the interface :class:`baselines.direct_loss.DirectLoss` drives).

    Args:
        phi: scores ``[B]`` (differentiable); labels: ``[B]`` with 1 = positive.
    """

    name = "ap"

    def __init__(self, phi: torch.Tensor, labels: torch.Tensor) -> None:
        self.pos = torch.sort(phi[labels == 1], descending=True, stable=True).values
        self.neg = torch.sort(phi[labels != 1], descending=True, stable=True).values
        # AP needs both classes: no positive, no precision; no negative, nothing to rank against
        self.empty = len(self.pos) == 0 or len(self.neg) == 0
        self.degenerate = self.empty
        self._pos = self.pos.detach().double().cpu().numpy()
        self._neg = self.neg.detach().double().cpu().numpy()

    def predict(self) -> np.ndarray:
        """:math:`y_w`: the ranking by score (negatives strictly above each positive)."""
        return np.searchsorted(-self._neg, -self._pos, side="left")

    def truth(self) -> np.ndarray:
        """:math:`y^*`: every positive above every negative."""
        return np.zeros(len(self._pos), dtype=np.int64)

    def augmented(self, coef: float) -> np.ndarray:
        return loss_augmented_ranking(self._pos, self._neg, coef)[0]

    def loss(self, y: np.ndarray) -> float:
        return ap_loss_of_ranking(y)

    def score(self, y: np.ndarray) -> torch.Tensor:
        """:math:`F(x, y, w)`, differentiable in the scores (linear given the ranking)."""
        signs = torch.as_tensor(ranking_signs(y, len(self._neg)), dtype=self.pos.dtype,
                                device=self.pos.device)
        return (signs * (self.pos[:, None] - self.neg[None, :])).mean()

    def changed(self, a: np.ndarray, b: np.ndarray) -> float:
        """Fraction of positives whose place differs between two rankings."""
        return float((a != b).mean())
