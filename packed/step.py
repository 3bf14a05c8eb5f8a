r"""One training step of N packed runs, each the step ``train.py`` would have made alone.

For every run ``i`` the step makes ``train.py``'s calls in ``train.py``'s order: logits; a
non-finite check on them (before the objective or its LP solver sees them); ``loss_i =
objective_i(logits_i, y_i)``; a non-finite check on the loss; ``zero_grad``; backward; optional
``clip_grad_norm_`` over the model's parameters; ``optimizer_i.step()``; ``scheduler_i.step()``;
``objective_i.on_step_end(step=, model=, optimizer=, batch=)``.

Exactness. The forward is one ``vmap`` over the packed storage (:mod:`packed.model`). The backward
is one call on :math:`\sum_{i\ \mathrm{live}} \mathrm{loss}_i`: the models share no parameter, so
:math:`\partial(\sum_j \mathrm{loss}_j)/\partial\theta_i = \partial \mathrm{loss}_i/\partial\theta_i`
(the sum's backward hands each loss the gradient 1 exactly). Each run keeps its own objective,
optimizer and scheduler objects, built over ``packed.models[i].parameters()`` (views into the
storage) plus the objective's own parameter groups, so its update -- SGD momentum and weight
decay, PPD-SG's stages and averaging, its learning rate and schedule -- is computed by the very
code of a separate run.

Divergence. A run whose logits or loss are non-finite is marked in :attr:`PackedStep.diverged`
(with the step and the reason, as ``train.py``'s ``NonFiniteLossError`` would report it) and
frozen: its loss is left out of the backward, its optimizer, scheduler and hooks are not called,
and its BatchNorm statistics are put back to their values before the step, so its whole state
stays that of its last finite step. The other runs are unaffected bit for bit (nothing in the
packed computation mixes models).

Host syncs: the finiteness checks read one flag per run every step (as ``train.py`` does); the
device-resident, graph-capturable step of issue 9 item 4 is not this module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from packed.model import PackedModels


@dataclass
class Divergence:
    step: int
    reason: str


@dataclass
class StepOutput:
    losses: torch.Tensor   # [N]; NaN where the run is frozen
    logits: torch.Tensor   # [N, B, K]


@dataclass
class PackedStep:
    """The per-run training components around a :class:`PackedModels`.

    Args:
        packed: the N models.
        objectives, optimizers, schedulers: one per run (``schedulers[i]`` may be ``None``).
            Build ``optimizers[i]`` over ``packed.models[i].parameters()`` as ``train.py`` builds
            it over ``model.parameters()`` (:func:`param_groups`).
        max_grad_norm: ``trainer.max_grad_norm`` of each run (``None`` / 0 = no clipping).

    Example::

        >>> stepper = PackedStep(packed, objectives, optimizers, schedulers)
        >>> out = stepper.step(x, y, step=0)   # x [N, B, ...], y [N, B]
        >>> out.losses                       # [N]; NaN for frozen runs
    """

    packed: PackedModels
    objectives: list
    optimizers: list
    schedulers: list
    max_grad_norm: list | None = None
    divergences: dict[int, Divergence] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.packed.n
        for name in ("objectives", "optimizers", "schedulers"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for a pack of "
                                 f"{n} models: give one per run (None for no scheduler)")
        self.max_grad_norm = list(self.max_grad_norm or [None] * n)
        if len(self.max_grad_norm) != n:
            raise ValueError(f"max_grad_norm has {len(self.max_grad_norm)} entries for {n} runs")

    @property
    def diverged(self) -> list[bool]:
        return [i in self.divergences for i in range(self.packed.n)]

    def _diverge(self, i: int, step: int, reason: str) -> None:
        self.divergences[i] = Divergence(step=step + 1, reason=reason)  # 1-based, as train.py

    def step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> StepOutput:
        """Train every live run one step on its batch ``(x[i], y[i])``; returns the losses
        ``[N]`` (NaN for frozen runs) and the logits ``[N, B, K]``, both detached."""
        packed, n = self.packed, self.packed.n
        if y.shape[:1] != (n,):
            raise ValueError(f"labels must be [N={n}, B]; got {tuple(y.shape)}")
        saved = {k: b.clone() for k, b in packed.buffers.items()}   # to freeze diverging runs
        logits = packed(x)
        live: list[int] = []
        losses = [torch.full((), math.nan, dtype=logits.dtype, device=logits.device)] * n
        for i in range(n):
            if i in self.divergences:
                continue
            bad = ~torch.isfinite(logits[i])
            if bad.any():
                self._diverge(i, step, f"scores are non-finite ({int(bad.sum())} of "
                                       f"{logits[i].numel()} NaN/inf)")
                continue
            loss = self.objectives[i](logits[i], y[i])
            if not torch.isfinite(loss):
                self._diverge(i, step, f"loss is {loss.item()}")
                continue
            losses[i] = loss
            live.append(i)
        packed.zero_grad()
        for i in range(n):
            self.optimizers[i].zero_grad(set_to_none=True)
        if live:
            torch.stack([losses[i] for i in live]).sum().backward()
        # after the backward: BatchNorm's backward keeps the running statistics it was given
        with torch.no_grad():
            for i in self.divergences:   # frozen: BatchNorm statistics as before the step
                for k, b in packed.buffers.items():
                    b[i] = saved[k][i]
        packed.grads_to_models()
        for i in self.divergences:
            packed.models[i].zero_grad(set_to_none=True)
        for i in live:
            model = packed.models[i]
            if self.max_grad_norm[i]:
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm[i])
            self.optimizers[i].step()
            if self.schedulers[i] is not None:
                self.schedulers[i].step()
            self.objectives[i].on_step_end(step=step, model=model, optimizer=self.optimizers[i],
                                           batch=(x[i], y[i]))
        return StepOutput(torch.stack([loss.detach() for loss in losses]), logits.detach())


def param_groups(model: torch.nn.Module, objective) -> list[dict]:
    """The optimizer's parameter groups of one run, as ``train.py`` forms them."""
    return [{"params": list(model.parameters())}] + objective.extra_param_groups()
