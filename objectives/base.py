"""The interface every training objective implements (LP losses, cross-entropy, baselines).

The trainer calls ``loss = objective(logits, labels)`` and nothing else is required.  Objectives
that own state or updates (PPD-SG's ``a, b, alpha``, a learned surrogate network, solver
diagnostics) override the optional hooks below; the trainer calls every hook for every objective,
so it never branches on which objective it runs.
"""
from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn


class Objective(nn.Module):
    """Base class: ``forward(logits [B, K], labels [B] int64) -> scalar loss``.

    Hooks (all optional):

    * :meth:`extra_param_groups` -- optimizer parameter groups owned by the objective
      (added beside the model's parameters; extra keys in a group are passed to the optimizer).
    * :meth:`on_step_end` -- called after ``optimizer.step()`` with the step number, model,
      optimizer and the batch just used.
    * :meth:`pop_stats` -- diagnostics averaged since the last call (e.g. solver iterations); the
      trainer writes them to ``metrics.csv`` at every evaluation.

    Degenerate batches: an objective that needs more than one class in a batch records, per
    batch, ``degenerate_batches`` (1 when a class the loss compares is missing) and
    ``empty_batches`` (1 when nothing was left to compare: the loss is a constant zero with zero
    gradient).  The trainer warns when more than 10 % of an evaluation interval's batches were
    degenerate and stops when every one was empty.
    """

    #: tasks the objective can train; ``validate.validate`` checks ``dataset.task`` against it
    #: before any data is built (e.g. a binary AUC loss on a multi-class split)
    tasks: tuple[str, ...] = ("binary", "multiclass")
    #: the smallest batch that can carry a training signal (pairs need two samples)
    min_batch_size: int = 1

    def __init__(self) -> None:
        super().__init__()
        self._stat_sums: dict[str, float] = defaultdict(float)
        self._stat_counts: dict[str, int | torch.Tensor] = defaultdict(int)

    def extra_param_groups(self) -> list[dict]:
        return []

    def on_step_end(self, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        return None

    def record(self, **values: float | torch.Tensor) -> None:
        """Accumulate scalar diagnostics; :meth:`pop_stats` returns their means.

        A value may be a one-element tensor: it is summed on its device in float64 (the
        arithmetic of summing its ``float()``) and read once, by :meth:`pop_stats`, so recording
        makes no host sync per step."""
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                self._stat_sums[key] = self._stat_sums[key] + value.detach().reshape(()).double()
            else:
                self._stat_sums[key] += float(value)
            self._stat_counts[key] += 1

    def record_where(self, cond: torch.Tensor, **values: float | torch.Tensor) -> None:
        """:meth:`record` the ``values`` only where the 0-dim bool tensor ``cond`` holds, decided
        on the device (no sync): the means are those of :meth:`record` called in the batches
        where ``cond`` was true (a key recorded in none is left out of :meth:`pop_stats`)."""
        w = cond.detach().reshape(()).double()
        for key, value in values.items():
            value = value.detach().reshape(()).double() if isinstance(value, torch.Tensor) else float(value)
            self._stat_sums[key] = self._stat_sums[key] + torch.where(cond, value, 0.0).double()
            self._stat_counts[key] = self._stat_counts[key] + w

    def pop_stats(self) -> dict[str, float]:
        counts = {k: float(c) for k, c in self._stat_counts.items()}
        out = {k: float(self._stat_sums[k]) / counts[k] for k in self._stat_sums if counts[k]}
        self._stat_sums.clear()
        self._stat_counts.clear()
        return out
