r"""Direct loss minimization and its structured-prediction relatives (Song, Schwing, Zemel,
Urtasun 2016, "Direct loss minimization for training deep neural nets"; §2 Theorem 1, eqs. (2)-(3);
§4.1 "Algorithms").

A task loss :math:`\Delta` (``ap``: :mod:`baselines.direct_loss_ap`, ``zero_one``:
:mod:`baselines.direct_loss_01`) defines a scoring function :math:`F(x, y, w)` over outputs
:math:`y` of the batch (a ranking, a labelling), the prediction :math:`y_w = \arg\max_y F`, the
ground truth :math:`y^*` and loss-augmented inference
:math:`y_c = \arg\max_y F(x, y, w) + c\,\Delta(y^*, y)`. The four updates differ only in which two
outputs they compare (:math:`F` is linear in the scores given an output, so each gradient is a
difference of two linear maps):

.. math::

    \text{positive / negative } (s = \pm1):\quad
        g = \frac{s}{\epsilon}\big(\nabla_w F(x, y_{s\epsilon}, w) - \nabla_w F(x, y_w, w)\big)
        \qquad \text{(eq. (2) at finite } \epsilon\text{)}

    \text{hinge}:\quad g = \nabla_w F(x, y_{m}, w) - \nabla_w F(x, y^*, w)
        \qquad \text{(structured hinge } \max_y[F + m\Delta] - F(y^*)\text{, margin } m)

    \text{perceptron}:\quad g = \nabla_w F(x, y_w, w) - \nabla_w F(x, y^*, w).

The paper's nine methods are the eight pairs (``pos-AP`` = ``task_loss=ap update=positive``, ...,
``per-01`` = ``task_loss=zero_one update=perceptron``) and cross-entropy (``objective=ce``,
"logistic"). The positive update steps away from a worse output, the negative one toward a
better output (§2); the hinge and the perceptron compare against the ground truth instead of the
prediction (§2, last paragraph; the perceptron ignores the task loss).

The returned loss has the value :math:`\Delta(y^*, y_w)` (the batch's task loss, e.g. 1 - AP: what
the training bar should show for all nine methods alike) and autograd gradient exactly
:math:`g`: ``task_loss + (L - L.detach())`` where :math:`L` is the update's difference of
:math:`F` values with both outputs held constant.

Deliberate choices: the score :math:`\phi` is the logit margin :math:`l_1 - l_0` (Song et al.
train one unbounded output); the task loss is per minibatch, as in their experiments. A batch
with no positive or no negative has no AP: zero loss, zero gradient, counted in
``degenerate_batches`` and ``empty_batches``; for the 0-1 loss such a batch still trains (the
loss is per sample) and counts in ``degenerate_batches`` only.

Example::

    >>> obj = DirectLoss(task_loss="ap", update="positive", epsilon=0.1)
    >>> logits = torch.tensor([[0., 2.], [0., -1.], [0., 1.], [0., 0.]], requires_grad=True)
    >>> loss = obj(logits, torch.tensor([1, 1, 0, 0]))  # ranking: + - - +  -> AP = (1 + 2/4) / 2
    >>> round(loss.item(), 4)
    0.25

Tips: the direct gradient scales like :math:`1/\epsilon`, so lower ``optimizer.lr`` with
``epsilon``; a small :math:`\epsilon` gives a sparse, noisy gradient (few outputs change), a large
one a smooth but biased one. The hinge's ``margin`` is in score units against a loss in [0, 1].
"""
from __future__ import annotations

import torch

from lpmetrics.baselines.direct_loss_01 import ZeroOneTask
from lpmetrics.baselines.direct_loss_ap import APTask
from lpmetrics.errors import ConfigError
from lpmetrics.objectives.base import Objective
from lpmetrics.objectives.common import binary_scores, check_labels, finite_positive, zero_loss

TASK_LOSSES = {"ap": APTask, "zero_one": ZeroOneTask}
UPDATES = ("positive", "negative", "hinge", "perceptron")


def _choice(key: str, value, allowed) -> str:
    if value not in allowed:
        raise ConfigError(f"objective.{key}={value!r} is not one of {', '.join(allowed)}; e.g. "
                          f"objective.{key}={next(iter(allowed))}")
    return value


class DirectLoss(Objective):
    """The eight direct-loss / hinge / perceptron methods of Song et al. §4.1 (see the module).

    Args:
        task_loss: ``ap`` (1 - average precision of the batch ranking) or ``zero_one``.
        update: ``positive`` | ``negative`` (direct loss, eq. (2) with :math:`s = \\pm1`),
            ``hinge`` (loss-augmented inference against the ground truth) or ``perceptron``
            (prediction against the ground truth).
        epsilon: :math:`\\epsilon` of the direct updates (unused by hinge / perceptron).
        margin: loss weight :math:`m` of the hinge's loss-augmented inference (unused otherwise).
    """

    tasks = ("binary",)
    min_batch_size = 2   # a ranking needs a positive and a negative

    def __init__(self, task_loss: str = "ap", update: str = "positive", epsilon: float = 0.1,
                 margin: float = 1.0) -> None:
        super().__init__()
        self.task_cls = TASK_LOSSES[_choice("task_loss", task_loss, tuple(TASK_LOSSES))]
        self.update = _choice("update", update, UPDATES)
        self.epsilon = finite_positive("epsilon", epsilon, " (e.g. 0.1)")
        self.margin = finite_positive("margin", margin, " (e.g. 1.0)")

    def compared(self, task):
        """The two outputs whose :math:`F` difference is the update, and its factor."""
        if self.update in ("positive", "negative"):
            s = 1.0 if self.update == "positive" else -1.0
            return task.augmented(s * self.epsilon), task.predict(), s / self.epsilon
        if self.update == "hinge":
            return task.augmented(self.margin), task.truth(), 1.0
        return task.predict(), task.truth(), 1.0

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        labels = check_labels(logits, labels)
        task = self.task_cls(binary_scores(logits, "margin"), labels)
        if task.empty:
            self.record(degenerate_batches=1.0, empty_batches=1.0)
            return zero_loss(logits)
        y_a, y_b, factor = self.compared(task)
        surrogate = factor * (task.score(y_a) - task.score(y_b))
        task_loss = task.loss(task.predict())
        self.record(degenerate_batches=float(task.degenerate), empty_batches=0.0,
                    task_loss=task_loss, update_changed=task.changed(y_a, y_b))
        return surrogate - surrogate.detach() + task_loss
