r"""The min-max square-loss AUC objective of PPD-SG / PPD-AdaGrad (Liu, Yuan, Ying, Yang 2020).

Paper: M. Liu, Z. Yuan, Y. Ying, T. Yang, *Stochastic AUC Maximization with Deep Neural
Networks*, ICLR 2020 (arXiv:1908.10831), eq. (1)-(2); the saddle form is Ying et al. (NeurIPS
2016).  With :math:`h = h(w; x) \in [0, 1]` the positive-class score and :math:`p = P(y = 1)`,

.. math::

    F(w, a, b, \alpha; x, y) = (1-p)\,(h-a)^2\,\mathbb 1[y=1] + p\,(h-b)^2\,\mathbb 1[y=0]
        + 2(1+\alpha)\big(p\,h\,\mathbb 1[y=0] - (1-p)\,h\,\mathbb 1[y=1]\big) - p(1-p)\,\alpha^2,

and :math:`\min_{w,a,b}\max_\alpha \mathbb E[F]`.  The inner optimum is closed form:
:math:`a^* = \mathbb E[h \mid y=1]`, :math:`b^* = \mathbb E[h \mid y=0]`,
:math:`\alpha^* = b^* - a^*`, where

.. math::

    \mathbb E[F(w, a^*, b^*, \alpha^*)] = p(1-p)\Big(\mathbb E\big[(1 - h(x) + h(x'))^2
        \,\big|\, y=1, y'=0\big] - 1\Big),

i.e. the square-loss AUC surrogate up to the factor :math:`p(1-p)` and an additive constant
(``tests/test_baselines_ppd.py`` checks this identity on batches).

The trainer minimises ``forward`` over the model's parameters and :math:`(a, b)` and *maximises*
it over :math:`\alpha`: :meth:`extra_param_groups` marks :math:`\alpha`'s group ``ascent=True``,
which only :class:`baselines.ppd_optim.PPDSG` / :class:`~baselines.ppd_optim.PPDAdaGrad`
honour (so pair ``objective=ppd_sg`` with ``optimizer=ppd_sg``; any other optimizer is refused
at the first step rather than silently descending on :math:`\alpha`, which diverges).

At the end of every stage of those optimizers (their ``stage_ended`` flag), :math:`\alpha` is
reset as in Algorithm 1, line 4, from :math:`m_k` samples scored by the new (averaged) model:
:math:`\alpha_k = \frac{\sum_j h(w_k; x_j)\mathbb 1[y_j=0]}{\sum_j \mathbb 1[y_j=0]} -
\frac{\sum_j h(w_k; x_j)\mathbb 1[y_j=1]}{\sum_j \mathbb 1[y_j=1]}`.

Deliberate deviations (and choices the paper leaves open):

* Score: :math:`h` = softmax probability of class 1 (= sigmoid of the logit margin), the score
  the LP losses use; the paper's analysis assumes :math:`h \in [0, 1]`.
* :math:`\alpha_k`'s "fresh" samples are the last ``alpha_samples`` training examples seen through
  :meth:`on_step_end` (whole batches: the last :math:`\lceil m_k / B \rceil`), re-scored by
  :math:`w_k` in eval mode (no BatchNorm side effects); the paper draws a new minibatch of size
  :math:`m_k`.  Not independent of the iterates, but it costs no extra data pass.  They are kept
  in a device ring of batch slots written at a device counter, so a step keeps no Python state
  and can be replayed from a CUDA graph (:mod:`packed.graph`; ``capturable``); a batch of another
  shape than the ring's restarts it.
* No projections: the theory keeps :math:`a, b, \alpha` in bounded sets; with
  :math:`h \in [0,1]` the unprojected iterates stay near those sets anyway.
* ``pos_ratio`` is the train split's positive fraction (runtime value), as in the paper.
* Against Liu et al.'s official code (github.com/yzhuoning/DeepAUC at e7cc490, ``optimizer.py``,
  ``objective_function_batch``; read, not copied; the optimizers' differences are listed in
  :mod:`baselines.ppd_optim`): their batch objective is
  :math:`(1-\hat p)\,\mathrm{mean}\big((h-a)^2 \mathbb 1[y=1] + \hat p\,(h-b)^2 \mathbb 1[y=0]\big) + \dots`,
  which weights the negatives' :math:`(h-b)^2` term by :math:`\hat p(1-\hat p)` where the paper's
  eq. (1) has :math:`p` (0.08 against 0.91 at 91 % positives); we follow the paper. They
  estimate :math:`p` from the batches seen (:math:`\hat p`); we use the train split's fraction.
  Compare our PPD numbers with numbers from their code with that in mind.

Example::

    >>> obj = SquareAUCMinMax(pos_ratio=0.5)
    >>> logits, labels = torch.zeros(4, 2), torch.tensor([0, 1, 1, 0])
    >>> round(obj(logits, labels).item(), 4)   # h = 0.5, a = b = alpha = 0
    0.125
"""
from __future__ import annotations

import torch
from torch import nn

from lpmetrics.objectives.base import Objective
from lpmetrics.objectives.common import binary_scores, check_labels


def square_auc_minmax(h: torch.Tensor, labels: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      alpha: torch.Tensor, p: float) -> torch.Tensor:
    """Batch mean of :math:`F(w, a, b, \\alpha; x, y)` for scores ``h [B]`` and labels ``[B]``."""
    pos = (labels == 1).to(h.dtype)
    neg = 1.0 - pos
    f = ((1 - p) * (h - a) ** 2 * pos + p * (h - b) ** 2 * neg
         + 2 * (1 + alpha) * (p * h * neg - (1 - p) * h * pos))
    return f.mean() - p * (1 - p) * alpha ** 2


class SquareAUCMinMax(Objective):
    """The PPD-SG / PPD-AdaGrad objective :math:`F(w, a, b, \\alpha)` (see the module docstring).

    Args:
        pos_ratio: :math:`p`, the positive fraction of the train split (runtime value ``???``).
        alpha_samples: :math:`m_k`, how many recent training examples re-estimate :math:`\\alpha`
            at each stage end.
    """

    #: no host sync in forward or hooks; the stage-end reset runs only in steps the optimizer
    #: marks ``needs_host`` (run eagerly by :class:`packed.graph.GraphedStep`)
    capturable = True

    def __init__(self, pos_ratio: float, alpha_samples: int = 1024) -> None:
        super().__init__()
        if pos_ratio is None or not 0.0 < float(pos_ratio) < 1.0:
            raise ValueError(f"pos_ratio must lie in (0, 1); got {pos_ratio}. It is the positive "
                             "fraction of the train split (the trainer passes it for `???`)")
        self.p = float(pos_ratio)
        self.alpha_samples = int(alpha_samples)
        self.a = nn.Parameter(torch.zeros(()))
        self.b = nn.Parameter(torch.zeros(()))
        self.alpha = nn.Parameter(torch.zeros(()))
        # the last ceil(alpha_samples / B) batches: slots [K, B, ...], and how many were written
        self._ring_x: torch.Tensor | None = None
        self._ring_y: torch.Tensor | None = None
        self._ring_n: torch.Tensor | None = None

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        labels = check_labels(logits, labels)
        h = binary_scores(logits, "softmax")
        loss = square_auc_minmax(h, labels, self.a, self.b, self.alpha, self.p)
        self.record(ppd_a=self.a, ppd_b=self.b, ppd_alpha=self.alpha)   # on the device: no sync
        return loss

    def extra_param_groups(self) -> list[dict]:
        # a, b are primal (descent, with the proximal term); alpha is the dual (ascent) variable.
        # No weight decay on either: the paper regularises only through the proximal term.
        return [{"params": [self.a, self.b], "weight_decay": 0.0},
                {"params": [self.alpha], "ascent": True, "weight_decay": 0.0}]

    def on_step_end(self, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        if not getattr(optimizer, "handles_ascent", False):
            raise TypeError(
                f"objective SquareAUCMinMax needs an optimizer that ascends on alpha; got "
                f"{type(optimizer).__name__}. Use optimizer=ppd_sg or optimizer=ppd_adagrad "
                "(and scheduler.milestones=[]: their stages set the step size)")
        self._remember(*batch)
        if getattr(optimizer, "stage_ended", False):
            with torch.no_grad():
                self.alpha.copy_(self.estimate_alpha(model))
            self.record(ppd_alpha_reset=self.alpha)   # a device value: no sync

    def _remember(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Write the batch (detached) into the ring slot ``count % K``, both on the device."""
        x, y = x.detach(), y.detach()
        ring = self._ring_x
        if ring is None or ring.shape[1:] != x.shape or ring.dtype != x.dtype or ring.device != x.device:
            slots = max(1, -(-self.alpha_samples // len(y)))
            self._ring_x = x.new_zeros((slots, *x.shape))
            self._ring_y = y.new_zeros((slots, *y.shape))
            self._ring_n = torch.zeros((), dtype=torch.long, device=x.device)
        slot = (self._ring_n % len(self._ring_x)).reshape(1)
        self._ring_x.index_copy_(0, slot, x[None])
        self._ring_y.index_copy_(0, slot, y[None])
        self._ring_n.add_(1)

    # The ring is state: a run resumed a few steps before a stage end re-estimates alpha from the
    # batches the uninterrupted run would (checkpointed with the objective; an older checkpoint
    # without it starts an empty ring, as resumes did before)
    def get_extra_state(self) -> dict:
        if self._ring_x is None:
            return {}
        return {"ring_x": self._ring_x, "ring_y": self._ring_y, "ring_n": self._ring_n}

    def set_extra_state(self, state: dict | None) -> None:
        state = state or {}
        self._ring_x, self._ring_y, self._ring_n = (
            (state[k].to(self.a.device, copy=True) if k in state else None) for k in ("ring_x", "ring_y", "ring_n"))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if "_extra_state" not in state_dict:   # a checkpoint from before the ring was saved
            state_dict = {**state_dict, "_extra_state": {}}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def remembered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept examples ``(x [M, ...], y [M])``, oldest slot first (one host read)."""
        if self._ring_x is None:
            return torch.empty(0), torch.empty(0, dtype=torch.long)
        n, slots = int(self._ring_n), len(self._ring_x)
        kept = min(n, slots)
        order = [(n - kept + s) % slots for s in range(kept)]
        return self._ring_x[order].flatten(0, 1), self._ring_y[order].flatten(0, 1)

    @torch.no_grad()
    def estimate_alpha(self, model: nn.Module) -> torch.Tensor:
        """:math:`\alpha_k = \bar h_{y=0} - \bar h_{y=1}` on the kept examples, model in eval;
        the running :math:`\alpha` where they hold one class only (decided on the device)."""
        if self._ring_x is None:
            return self.alpha.detach().clone()
        was_training = model.training
        model.eval()
        slots = len(self._ring_x)
        h = binary_scores(model(self._ring_x.flatten(0, 1)), "softmax").view(slots, -1)
        model.train(was_training)
        written = (torch.arange(slots, device=h.device) < self._ring_n.to(h.device))[:, None]
        y = self._ring_y.to(h.device)
        pos, neg = written & (y == 1), written & (y == 0)
        n_pos, n_neg = pos.sum(), neg.sum()
        mean_neg = torch.where(neg, h, 0.0).sum() / n_neg.clamp_min(1)
        mean_pos = torch.where(pos, h, 0.0).sum() / n_pos.clamp_min(1)
        both = (n_pos > 0) & (n_neg > 0)
        return torch.where(both, mean_neg - mean_pos, self.alpha.detach()).to(self.alpha.dtype)
