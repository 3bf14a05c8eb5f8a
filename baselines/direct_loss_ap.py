r"""Direct loss minimization for average precision (Song, Schwing, Zemel, Urtasun, ICML 2016).

Seed: ``../shared/seeds/003_*.txt`` (Theorem 1, eq. (2)-(3); AP loss eq. (4); the dynamic program
of Fig. 2 / Lemma 1).  With scores :math:`\phi_i = \phi(x_i, w)`, positives :math:`\mathcal P`,
negatives :math:`\mathcal N`, and a ranking written as pairwise signs :math:`y_{mn} \in \{\pm1\}`
(:math:`+1`: positive :math:`m` above negative :math:`n`),

.. math::

    F(x, y, w) = \frac{1}{|\mathcal P||\mathcal N|}\sum_{m\in\mathcal P, n\in\mathcal N}
        y_{mn}\,(\phi_m - \phi_n), \qquad
    \Delta_{AP}(y^*, y) = 1 - \frac{1}{|\mathcal P|}\sum_{j:\,\hat p_j = 1}\mathrm{Prec}@j,

.. math::

    y_w = \arg\max_y F(x, y, w), \quad
    y_{direct} = \arg\max_y F(x, y, w) + s\,\epsilon\,\Delta_{AP}(y^*, y), \quad
    \nabla_w \mathbb E[\Delta_{AP}] \approx \frac{s}{\epsilon}\big(\nabla_w F(x, y_{direct}, w)
        - \nabla_w F(x, y_w, w)\big),

with :math:`s = +1` (positive update: step away from a worse ranking) or :math:`s = -1`
(negative update: step toward a better one).  Loss-augmented inference is the
:math:`O(|\mathcal P||\mathcal N|)` dynamic program over interleavings of the score-sorted
positives and negatives (Yue et al.'s Observation 1):
:math:`h(i, j) = \max\{h(i-1, j) - s\epsilon\frac{1}{|\mathcal P|}\frac{i}{i+j} + B(i, j),\;
h(i, j-1) + G(i, j)\}` with :math:`B(i, j) = -\frac{1}{|\mathcal P||\mathcal N|}
\sum_{k\le j}(\phi_i - \phi_k)` and :math:`G(i, j) = \frac{1}{|\mathcal P||\mathcal N|}
\sum_{k\le i}(\phi_k - \phi_j)`; back-tracking gives the ranking.  Each row is one max-plus scan
(``np.maximum.accumulate``), so the Python loop runs over positives only.

The returned loss has value :math:`\Delta_{AP}(y^*, y_w)` (1 - AP of the batch, what the training
bar should show) and autograd gradient exactly :math:`\frac{s}{\epsilon}(\nabla F(y_{direct}) -
\nabla F(y_w))`: ``ap_loss + (L - L.detach())`` with :math:`L = \frac{s}{\epsilon}(F(y_{direct})
- F(y_w))` and both rankings held constant (F is linear in the scores given a ranking).

Deliberate deviations / choices:

* Score: :math:`\phi` = the logit margin :math:`l_1 - l_0` (Song et al. train a network with one
  unbounded output; a probability would squash :math:`F`'s differences).
* AP is per minibatch, as in their detection experiments (batch 512 there; ours is the trainer's).
* A batch without positives or without negatives has no AP: the loss is 0 with zero gradient.
* Ties in the scores are broken by sort order (stable), so :math:`1 - AP` may differ from
  scikit-learn's tie-averaged value when scores tie exactly.

Example::

    >>> obj = DirectAP(epsilon=0.1, sign=1)
    >>> logits = torch.tensor([[0., 2.], [0., -1.], [0., 1.], [0., 0.]], requires_grad=True)
    >>> loss = obj(logits, torch.tensor([1, 1, 0, 0]))  # ranking: + - - +  -> AP = (1 + 2/4) / 2
    >>> round(loss.item(), 4)
    0.25
"""
from __future__ import annotations

import numpy as np
import torch

from objectives.base import Objective
from objectives.common import binary_scores, check_labels, zero_loss


def ap_loss_of_ranking(neg_above: np.ndarray) -> float:
    """:math:`\\Delta_{AP}` of a ranking given, for each score-sorted positive, how many negatives
    are ranked above it (a non-decreasing integer vector)."""
    i = np.arange(1, len(neg_above) + 1)
    return float(1.0 - np.mean(i / (i + neg_above)))


def loss_augmented_ranking(pos: np.ndarray, neg: np.ndarray, epsilon: float, sign: int
                           ) -> tuple[np.ndarray, float]:
    """Solve :math:`\\max_y F(x, y, w) + s\\epsilon\\Delta_{AP}(y^*, y)` by the DP of Fig. 2.

    Args:
        pos, neg: scores of the positives / negatives, each sorted in descending order.
        epsilon, sign: :math:`\\epsilon > 0` and :math:`s \\in \\{+1, -1\\}`.

    Returns:
        ``neg_above`` (``[|P|]`` ints: negatives ranked above each positive) and the optimal value
        :math:`F(y) + s\\epsilon\\Delta_{AP}(y)`.
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
        a = h_prev - sign * epsilon / P * i / (i + jj) - scale * (jj * pos[i - 1] - cneg)
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
    # the recursion drops Delta's constant "1": add s * eps back for the true optimum
    return neg_above, float(h_prev[N] + sign * epsilon)


def ranking_signs(neg_above: np.ndarray, num_neg: int) -> np.ndarray:
    """Pairwise :math:`y_{mn}` (sorted positives x sorted negatives) of an interleaving."""
    return np.where(np.arange(num_neg)[None, :] >= neg_above[:, None], 1.0, -1.0)


def pairwise_F(y: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """:math:`F(x, y, w)` for pairwise signs ``y [P, N]`` and sorted scores (differentiable)."""
    return (y * (pos[:, None] - neg[None, :])).mean()


class DirectAP(Objective):
    """Direct loss minimization of 1 - AP on each minibatch (see the module docstring).

    Args:
        epsilon: :math:`\\epsilon` of eq. (2); small = closer to the true gradient but sparser and
            noisier, large = smoother. The gradient scales like :math:`1/\\epsilon`.
        sign: ``+1`` positive update (the paper's recommended one), ``-1`` negative update.
    """

    def __init__(self, epsilon: float = 0.1, sign: int = 1) -> None:
        super().__init__()
        if epsilon <= 0:
            raise ValueError(f"epsilon must be > 0; got {epsilon}")
        if sign not in (1, -1):
            raise ValueError(f"sign must be +1 (positive update) or -1 (negative); got {sign}")
        self.epsilon, self.sign = float(epsilon), int(sign)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        labels = check_labels(logits, labels)
        phi = binary_scores(logits, "margin")
        pos = torch.sort(phi[labels == 1], descending=True, stable=True).values
        neg = torch.sort(phi[labels != 1], descending=True, stable=True).values
        if len(pos) == 0 or len(neg) == 0:
            self.record(direct_ap_skipped=1.0)
            return zero_loss(logits)
        p_np = pos.detach().double().cpu().numpy()
        n_np = neg.detach().double().cpu().numpy()
        above_w = np.searchsorted(-n_np, -p_np, side="left")   # negatives strictly above
        above_d, _ = loss_augmented_ranking(p_np, n_np, self.epsilon, self.sign)
        y_w = torch.as_tensor(np.sign(p_np[:, None] - n_np[None, :]), dtype=phi.dtype,
                              device=phi.device)
        y_d = torch.as_tensor(ranking_signs(above_d, len(n_np)), dtype=phi.dtype, device=phi.device)
        gap = pairwise_F(y_d, pos, neg) - pairwise_F(y_w, pos, neg)
        surrogate = self.sign / self.epsilon * gap
        ap_loss = ap_loss_of_ranking(above_w)
        self.record(direct_ap_loss=ap_loss, direct_ap_changed=float((above_d != above_w).mean()),
                    direct_ap_skipped=0.0)
        return surrogate - surrogate.detach() + ap_loss
