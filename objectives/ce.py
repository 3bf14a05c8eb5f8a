"""Cross-entropy: the decomposable baseline every table compares against."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lpmetrics.objectives.base import Objective


class CrossEntropy(Objective):
    r"""Mean cross-entropy :math:`-\frac1B\sum_i \log \mathrm{softmax}(f(x_i))_{y_i}`.

    Example::

        >>> loss = CrossEntropy()(torch.zeros(4, 2), torch.tensor([0, 1, 1, 0]))
        >>> round(loss.item(), 4)
        0.6931
    """

    capturable = True   # one kernel chain, no host reads, no hooks

    def __init__(self, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.label_smoothing = label_smoothing

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
