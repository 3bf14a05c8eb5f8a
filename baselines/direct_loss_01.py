r"""The 0-1 loss as the task loss of direct loss minimization (Song et al. 2016,
§4.1: "For the latter we predict for each sample :math:`x_i` whether
it is a member of the set :math:`\mathcal P` or whether it is part of the set :math:`\mathcal N`").

The output labels each sample of the batch, :math:`y \in \{-1, +1\}^B`, with the scoring function
and task loss (the paper states neither formula; this is the binary case of its multi-class
:math:`F`, normalised by the batch like the AP :math:`F`)

.. math::

    F(x, y, w) = \frac1B \sum_i y_i\,\phi_i, \qquad
    \Delta_{01}(y^*, y) = \frac1B \sum_i \mathbf 1[y_i \ne y^*_i].

Both decompose over samples, so loss-augmented inference
:math:`\arg\max_y F(x, y, w) + c\,\Delta_{01}(y^*, y)` is closed form, sample by sample: keep
:math:`y^*_i` (value :math:`y^*_i\phi_i`) or flip it (value :math:`-y^*_i\phi_i + c`), i.e.

.. math::

    \hat y_i = -y^*_i \ \text{ if }\ 2\,y^*_i\phi_i < c, \quad \text{else } y^*_i .

With :math:`c = +\epsilon` a sample flips when it is wrong or right by less than :math:`\epsilon/2`
(the positive update moves only the right-but-close ones, away from the boundary); with
:math:`c = -\epsilon` only when it is wrong by more than :math:`\epsilon/2` (the negative update moves
the wrong-but-close ones across). Prediction is :math:`y_w = \mathrm{sign}(\phi)` (margin 0 is the
decision threshold, as in the accuracy the experiments report; :math:`\phi = 0` counts as positive).
"""
from __future__ import annotations

import torch


class ZeroOneTask:
    """One batch seen by the 0-1 task loss (interface of :class:`baselines.direct_loss.DirectLoss`).

    A batch with one class only is still a training signal (the loss is per sample), so it is
    ``degenerate`` (a class is missing, counted like the pairwise losses count it) but not empty.
    """

    name = "zero_one"

    def __init__(self, phi: torch.Tensor, labels: torch.Tensor) -> None:
        self.phi = phi
        self.y_true = torch.where(labels == 1, 1.0, -1.0).to(phi.dtype)
        n_pos = int((labels == 1).sum())
        self.empty = len(phi) == 0
        self.degenerate = n_pos == 0 or n_pos == len(phi)

    def predict(self) -> torch.Tensor:
        return torch.where(self.phi.detach() >= 0, 1.0, -1.0).to(self.phi.dtype)

    def truth(self) -> torch.Tensor:
        return self.y_true

    def augmented(self, coef: float) -> torch.Tensor:
        flip = 2.0 * self.y_true * self.phi.detach() < coef
        return torch.where(flip, -self.y_true, self.y_true)

    def loss(self, y: torch.Tensor) -> float:
        return float((y != self.y_true).to(torch.float64).mean())

    def score(self, y: torch.Tensor) -> torch.Tensor:
        """:math:`F(x, y, w)`, differentiable in the scores."""
        return (y * self.phi).mean()

    def changed(self, a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a != b).to(torch.float64).mean())
