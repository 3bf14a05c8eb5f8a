r"""LibAUC's AUC-margin loss with its PESG optimizer: the outside reference users already know.

Yuan, Yan, Sonka, Yang, "Large-scale Robust Deep AUC Maximization: A New Surrogate Loss and
Empirical Studies on Medical Image Classification", ICCV 2021 (arXiv 2012.03173), through the
``libauc`` package (pinned 2.0.1). The min-max objective (its ``v1``), with :math:`h` the score,
:math:`p` the positive ratio and :math:`m` the margin:

.. math::

    \min_{w,a,b}\max_{\alpha\ge0}\; (1-p)\,\mathbb E[(h-a)^2 \mid y=1] + p\,\mathbb E[(h-b)^2 \mid y=0]
    + 2\alpha\big(p(1-p)m + \mathbb E[p\,h\,1_{y=0} - (1-p)\,h\,1_{y=1}]\big) - p(1-p)\alpha^2

(the expectations are minibatch means over all samples, as LibAUC computes them).
PESG descends on :math:`(w, a, b)` with clipped gradients, an epoch-level proximal term towards a
reference point, and ascends on :math:`\alpha`.

Deviations / choices:
* ``p`` is the *train split's* positive ratio, passed explicitly and used with ``auto=False``:
  LibAUC's default ``auto=True`` silently replaces it by each minibatch's ratio.
* The score is the softmax probability of class 1 of the shared 2-way head (as our LP losses).
* The reference point is refreshed (``PESG.update_regularizer``) every ``refresh_every`` steps,
  the trainer's step-decay scheduler divides the learning rate (LibAUC's examples instead call
  ``update_regularizer(decay_factor=10)`` at chosen epochs).
* libauc is installed with ``--no-deps`` (see the Makefile): its wheel declares torch_geometric,
  ogb, transformers and more as hard requirements, none of which the loss or PESG import.
"""
from __future__ import annotations

import torch

from lpmetrics.objectives.base import Objective


class LibAUCAUCM(Objective):
    """``objective=libauc_aucm``: LibAUC's ``AUCMLoss`` (v1) on the positive-class probability.

    Args:
        pos_ratio: positive fraction of the train split (runtime value).
        margin: the AUC margin :math:`m` (LibAUC's default 1.0).
        refresh_every: steps between PESG reference-point refreshes (0: never).

    Example::

        >>> obj = LibAUCAUCM(pos_ratio=0.8)
        >>> loss = obj(torch.randn(8, 2), torch.tensor([0, 1, 1, 1, 1, 1, 1, 0]))
        >>> bool(torch.isfinite(loss))
        True
    """

    def __init__(self, pos_ratio: float, margin: float = 1.0, refresh_every: int = 0) -> None:
        super().__init__()
        from libauc.losses import AUCMLoss

        if not 0.0 < float(pos_ratio) < 1.0:
            raise ValueError(f"pos_ratio must be in (0, 1), got {pos_ratio}: the train split needs "
                             "both classes")
        self.loss = AUCMLoss(margin=margin, imratio=float(pos_ratio), version="v1", device="cpu")
        self.refresh_every = int(refresh_every)

    def extra_param_groups(self) -> list[dict]:
        # No parameters here: PESG takes a, b, alpha from the loss itself (see make_pesg).
        return [{"params": [], "libauc_loss": self.loss}]

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(logits, dim=1)[:, 1]
        loss = self.loss(scores, labels.float(), auto=False)
        self.record(aucm_a=self.loss.a.item(), aucm_b=self.loss.b.item(),
                    aucm_alpha=self.loss.alpha.item())
        return loss.squeeze()

    def on_step_end(self, *, step, model, optimizer, batch) -> None:
        if self.refresh_every and (step + 1) % self.refresh_every == 0:
            optimizer.update_regularizer()


def make_pesg(params, **kwargs):
    """Build ``libauc.optimizers.PESG`` from the trainer's parameter groups.

    The trainer passes ``[{"params": model params}] + objective.extra_param_groups()``; the
    objective's group carries the ``AUCMLoss`` whose ``a, b, alpha`` PESG updates.
    """
    from libauc.optimizers import PESG

    groups = [dict(g) for g in params]
    losses = [g.pop("libauc_loss") for g in groups if "libauc_loss" in g]
    if len(losses) != 1:
        raise TypeError("optimizer=pesg needs objective=libauc_aucm (it updates the AUCM loss's "
                        "a, b, alpha); use optimizer=sgd for other objectives")
    model_params = [p for g in groups for p in g["params"]]
    return PESG(model_params, loss_fn=losses[0], device=model_params[0].device, verbose=False,
                **kwargs)
