"""The interface every training objective implements (LP losses, cross-entropy, baselines).

The trainer calls ``loss = objective(logits, labels)`` and nothing else is required.  Objectives
that own state or updates (PPD-SG's ``a, b, alpha``, a learned surrogate network, solver
diagnostics) override the optional hooks below; the trainer calls every hook for every objective,
so it never branches on which objective it runs.
"""
from __future__ import annotations

import inspect
from collections import defaultdict

import torch
from torch import nn


class Objective(nn.Module):
    """Base class: ``forward(logits [B, K], labels [B] int64) -> scalar loss``.

    Hooks (all optional):

    * :meth:`extra_param_groups` -- optimizer parameter groups owned by the objective
      (added beside the model's parameters; extra keys in a group are passed to the optimizer).
    * :meth:`on_step_end` -- called after ``optimizer.step()`` with the step number, model,
      optimizer and the batch just used. An override that declares a ``draw_batch`` keyword
      (:func:`draws_batches`) is also given a callable returning a new training batch ``(x, y)``
      from a second batch stream of its own (``train.py``), e.g. for the learned surrogate's
      K_beta steps; the others are called without it.
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
    #: whether forward, backward and hooks make no host sync and keep no Python state that a
    #: replayed CUDA graph would freeze (``packed.graph.GraphedStep`` captures only such packs)
    capturable: bool = False

    def __init__(self) -> None:
        super().__init__()
        self._stat_sums: dict[str, float] = defaultdict(float)
        self._stat_counts: dict[str, int] = defaultdict(int)
        self._stat_device: dict[str, torch.Tensor] = {}   # key -> float64 [sum, count], in place
        self._stat_order: dict[str, None] = {}            # keys in the order first recorded

    def extra_param_groups(self) -> list[dict]:
        return []

    def capture_safe_form(self) -> "Objective | None":
        """An objective with this one's loss and gradient that is :attr:`capturable` (``self``
        if it already is), or ``None``; the packed launcher trains it in packs on CUDA
        (:func:`packed.graph.capture_form`)."""
        return self if self.capturable else None

    def on_step_end(self, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        return None

    def record(self, **values: float | torch.Tensor) -> None:
        """Accumulate scalar diagnostics; :meth:`pop_stats` returns their means.

        A value may be a one-element tensor: it is added, in float64 (the arithmetic of summing
        its ``float()``), *in place* into a per-key device tensor ``[sum, count]`` that lives as
        long as the objective. So recording makes no host sync, and a captured CUDA graph that
        replays the step keeps accumulating into the same tensors. :meth:`pop_stats` reads them
        once and zeroes them in place."""
        for key, value in values.items():
            self._stat_order.setdefault(key)
            if isinstance(value, torch.Tensor):
                self._add_on_device(key, value.detach().reshape(()), None)
            else:
                self._stat_sums[key] += float(value)
                self._stat_counts[key] += 1

    def record_where(self, cond: torch.Tensor, **values: float | torch.Tensor) -> None:
        """:meth:`record` the ``values`` only where the 0-dim bool tensor ``cond`` holds, decided
        on the device (no sync): the means are those of :meth:`record` called in the batches
        where ``cond`` was true (a key recorded in none is left out of :meth:`pop_stats`)."""
        cond = cond.detach().reshape(())
        for key, value in values.items():
            self._stat_order.setdefault(key)
            value = value.detach().reshape(()) if isinstance(value, torch.Tensor) else \
                torch.full((), float(value), device=cond.device)   # a fill, not a host copy
            self._add_on_device(key, value, cond)

    def _add_on_device(self, key: str, value: torch.Tensor, cond: torch.Tensor | None) -> None:
        acc = self._stat_device.get(key)
        dtype = torch.float32 if value.device.type == "mps" else torch.float64   # MPS has no float64
        value = value.to(dtype)
        if acc is None or acc.device != value.device:
            # a moved objective: its accumulator on the old device may go once it has been read
            # (pop_stats zeroed it; one read of the old device, at the move only)
            if acc is not None and float(acc[1]) != 0.0:
                raise RuntimeError(f"statistic {key!r} was recorded on {acc.device} and now on "
                                   f"{value.device}: call pop_stats() before moving the objective")
            acc = self._stat_device[key] = torch.zeros(2, dtype=dtype, device=value.device)
        one = torch.ones((), dtype=dtype, device=value.device)
        if cond is None:
            acc.add_(torch.stack([value, one]))
        else:
            acc.add_(torch.where(cond, torch.stack([value, one]), 0.0))

    def pending_stats(self) -> dict:
        """What :meth:`record` has gathered since the last :meth:`pop_stats`, as a checkpoint holds
        it (plain numbers, the device sums as CPU tensors); :meth:`restore_pending_stats` puts it
        back so the sums go on exactly as they would have. Nothing is read off or reset."""
        return {"order": list(self._stat_order),
                "host": {k: [float(self._stat_sums[k]), int(self._stat_counts[k])] for k in self._stat_sums},
                "device": {k: acc.detach().cpu().clone() for k, acc in self._stat_device.items()}}

    def restore_pending_stats(self, state: dict, device: torch.device | str) -> None:
        """Undo a restart between two evaluations: :meth:`pending_stats`' ``state`` becomes what
        is pending, the device sums on ``device`` (where the resumed run records)."""
        self._stat_order = dict.fromkeys(state["order"])
        self._stat_sums.clear()
        self._stat_counts.clear()
        for key, (total, count) in state["host"].items():
            self._stat_sums[key], self._stat_counts[key] = total, count
        self._stat_device = {k: acc.to(device) for k, acc in state["device"].items()}

    def pop_stats(self) -> dict[str, float]:
        sums, counts = dict(self._stat_sums), {k: float(c) for k, c in self._stat_counts.items()}
        if self._stat_device:   # read once here, then zeroed in place (graph replays add here)
            keys = list(self._stat_device)
            for key, (total, count) in zip(keys, torch.stack([self._stat_device[k].cpu() for k in keys]).tolist()):
                sums[key], counts[key] = sums.get(key, 0.0) + total, counts.get(key, 0.0) + count
            for acc in self._stat_device.values():
                acc.zero_()
        self._stat_sums.clear()
        self._stat_counts.clear()
        return {k: sums[k] / counts[k] for k in self._stat_order if counts.get(k)}   # first-recorded order


def draws_batches(objective) -> bool:
    """Whether ``objective.on_step_end`` declares a ``draw_batch`` keyword (a sampler of new
    training batches that the trainer then passes; ``**kwargs`` does not count)."""
    params = inspect.signature(objective.on_step_end).parameters
    return "draw_batch" in params and params["draw_batch"].kind is not inspect.Parameter.VAR_KEYWORD
