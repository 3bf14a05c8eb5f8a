r"""AP-Perf (Fathony & Kolter, AISTATS 2020) for the F1 experiment, through the ``ap-perf`` package.

The adversarial-prediction formulation: the learner's probabilistic prediction :math:`\hat P`
plays against an adversary :math:`\check Q` constrained to match the data's feature statistics,

.. math::

    \min_\theta \; \mathbb E_{P} \Big[\max_{\check Q} \min_{\hat P}
        \mathbb E_{\hat P, \check Q}\big[-\mathrm{metric}(\hat y, \check y)\big]
        + \theta^\top\big(\phi(x, \check y) - \phi(x, y)\big)\Big],

solved per minibatch by the package's ADMM (on the CPU). The metric here is
:math:`F_1 = 2\,TP / (AP + PP)` written in the package's confusion-matrix language, with the
package's positive special case (all-negative prediction and labels scores 1). The target is the
batch F1 that the LP rows (``f1_lp_paper``, ``f1_cvxpy``) relax, but the surrogate differs: the
gradient with respect to each score is :math:`\check q_i - y_i` (:math:`\check q_i` the adversary's
marginal), not an LP's sensitivity.

Deviations / choices:
* The score handed to ``MetricLayer`` is the logit margin :math:`l_1 - l_0` of the shared 2-way
  head (the package expects one real score per sample).
* The package's marginal projection can divide by zero on some minibatches (seen on CIFAR-10 at
  step 12 with lr 0.1: ``ZeroDivisionError`` inside ``ap_perf.projection.obj_rho``). Such a batch
  gets the documented defined value -- zero loss with zero gradient -- and is counted in the
  ``apperf_failed_batches`` diagnostic of metrics.csv, instead of ending the run.
* That gradient is summed over the batch, not averaged, and the package's backward returns it
  whatever the upstream gradient (``ap_perf/layer.py``, ``MetricFunction.backward`` ignores
  ``grad_output``): scaling the loss does not scale it. At init a ResNet-18 batch of 64 (random
  32x32 inputs, 3 seeds) gets a gradient norm of ~1,700-2,000 (cross-entropy: ~22), hence ``trainer.max_grad_norm: 5.0`` in
  ``configs/objective/f1_apperf.yaml`` (our choice; AP-Perf's own code clips nothing).
* ``ap-perf`` 0.1.1 is installed with ``--no-deps`` (requirements-nodeps.txt) so that it cannot
  pull another torch; its own dependencies (numpy, scipy, torch, numba) are pinned in
  requirements.txt.
"""
from __future__ import annotations

import torch

from lpmetrics.objectives.base import Objective


def _f1_metric():
    from ap_perf import PerformanceMetric

    class F1(PerformanceMetric):
        def define(self, C):
            return (2 * C.tp) / (C.ap + C.pp)

    metric = F1()
    metric.initialize()
    metric.enforce_special_case_positive()
    return metric


class APPerfF1(Objective):
    """``objective=f1_apperf``: the AP-Perf F1 layer on the logit margin.

    Example::

        >>> loss = APPerfF1()(torch.randn(16, 2), torch.tensor([0, 1] * 8))  # doctest: +SKIP
    """

    def __init__(self) -> None:
        super().__init__()
        from ap_perf import MetricLayer

        self.layer = MetricLayer(_f1_metric())

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        margin = logits[:, 1] - logits[:, 0]
        # the package's ADMM runs in float64 numpy on the CPU; it returns a tensor like its input
        try:
            loss = self.layer(margin.cpu(), labels.float().cpu()).to(logits.device).reshape(())
        except ZeroDivisionError:
            self.record(apperf_failed_batches=1.0)
            return logits.sum() * 0.0
        self.record(apperf_objective=loss.item(), apperf_failed_batches=0.0)
        return loss
