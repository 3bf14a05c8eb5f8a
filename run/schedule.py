"""The learning-rate schedule of a run (``cfg.scheduler``): step decay at ``milestones`` (the
paper's), or the authors' stage schedule (:class:`StageDecayLR`).

Both :mod:`~lpmetrics.run.validate` (which checks ``scheduler.stages`` before anything is built)
and the run (:meth:`~lpmetrics.run.job.Run.attach_optimizer`) use it.
"""
from __future__ import annotations

import torch
from omegaconf import DictConfig


class StageDecayLR(torch.optim.lr_scheduler.LRScheduler):
    r"""The authors' stage schedule: the lr is multiplied by ``gamma`` after each stage, stage
    :math:`k = 1, 2, \dots` lasting :math:`\text{first} \cdot \text{growth}^{k-1}` steps.

    ``binary_auc.py`` of zihangm/nondecomposable-as-lp: ``T_k = c * 3 ** (k - 1)`` steps at
    ``lr_k = lr0 / 3 ** (k - 1)`` with ``c = 2000``; so with ``first=2000, growth=3, gamma=1/3``
    the lr drops after steps 2,000, 8,000, 26,000, 80,000, ... (the paper instead states drops at
    2k / 10k / 25k: ``scheduler.milestones``). Like ``MultiStepLR`` it multiplies the current lr
    at each boundary, so it composes with optimizers that set their own lr.

    Example::

        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.9)
        >>> sched = StageDecayLR(opt, first=2, growth=3, gamma=1 / 3)
        >>> lrs = []
        >>> for _ in range(9):
        ...     lrs.append(round(opt.param_groups[0]["lr"], 4)); opt.step(); sched.step()
        >>> lrs   # stages of 2, 6, 18, ... steps
        [0.9, 0.9, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.1]
    """

    def __init__(self, optimizer: torch.optim.Optimizer, first: int, growth: float = 3.0,
                 gamma: float = 1 / 3, last_epoch: int = -1) -> None:
        if isinstance(first, bool) or not isinstance(first, int) or first < 1:
            raise ValueError(f"scheduler.stages.first={first!r} must be an integer >= 1 (the length "
                             "of the first stage in steps; the authors' code: 2000)")
        if not (isinstance(growth, (int, float)) and growth >= 1):
            raise ValueError(f"scheduler.stages.growth={growth!r} must be a number >= 1 (each stage "
                             "is growth times the one before; the authors' code: 3)")
        self.first, self.growth, self.gamma = int(first), float(growth), float(gamma)
        super().__init__(optimizer, last_epoch)

    def stages_done(self, step: int) -> tuple[int, bool]:
        """How many stages have ended by ``step`` (lr drops so far), and whether one ended
        exactly at ``step`` (the lr drops from this step on)."""
        if self.growth == 1.0:   # equal stages: closed form (the loop would take step/first turns)
            return step // self.first, step > 0 and step % self.first == 0
        done, end, length = 0, self.first, float(self.first)
        while end <= step:
            done += 1
            if end == step:
                return done, True
            length *= self.growth
            end += int(round(length))
        return done, False

    def get_lr(self) -> list[float]:
        drop = self.stages_done(self.last_epoch)[1]
        return [g["lr"] * (self.gamma if drop else 1.0) for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        done = self.stages_done(self.last_epoch)[0]
        return [base * self.gamma ** done for base in self.base_lrs]


def build_scheduler(cfg: DictConfig, optimizer: torch.optim.Optimizer
                    ) -> torch.optim.lr_scheduler.LRScheduler:
    """The lr schedule of ``cfg.scheduler``: step decay by ``gamma`` at ``milestones`` (the
    default, the paper's), or, when ``stages`` is set (``{first, growth}``), the authors' stage
    schedule (:class:`StageDecayLR`; then ``milestones`` must be empty)."""
    if cfg.stages:
        return StageDecayLR(optimizer, first=cfg.stages.first, growth=cfg.stages.growth, gamma=cfg.gamma)
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(cfg.milestones), gamma=cfg.gamma)
