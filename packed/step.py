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
code of a separate run; except that where every run's optimizer is a plain ``torch.optim.SGD`` over
its model's parameters, on CUDA, one pack-wide update over the stacked storage does what their N
``step()`` calls would (:class:`packed.optim.PackedSGD`, reading each run's hyperparameters from
its own optimizer, equal to 1e-10 in float64; :attr:`PackedStep.pack_update`).

Divergence. A run whose logits or loss are non-finite is marked in :attr:`PackedStep.diverged`
(with the step and the reason, as ``train.py``'s ``NonFiniteLossError`` would report it) and
frozen: its loss is left out of the backward, its optimizer, scheduler and hooks are not called,
and its BatchNorm statistics are put back to their values before the step, so its whole state
stays that of its last finite step. The other runs are unaffected bit for bit (nothing in the
packed computation mixes models).

Host syncs. ``sync_free=False`` (the default; exact ``train.py`` semantics above) reads one
finiteness flag per run every step, as ``train.py`` does. ``sync_free=True`` reads nothing: the
finiteness of each run's logits and loss is a device flag ``[N]``; a run's objective is fed its
logits with non-finite values replaced by 0 (so no objective or solver check raises on a dead
run), a non-finite run's loss is masked out of the backward, and the first failing step and its
reason (logits or loss) are kept on the device (:attr:`PackedStep.pending`). :meth:`PackedStep.poll`
reads them (one sync; the launcher calls it before every evaluation) and from then on the run is
frozen as above. Between its divergence and the poll a dead run keeps being stepped on garbage,
so its *weights* after the divergence step are not kept (its metrics rows and checkpoints are
those of its last evaluation, which the poll precedes); its recorded step and reason are exact,
and the other runs are untouched bit for bit either way (nothing mixes models). Losses stay on the
device (:attr:`StepOutput.losses`). With objectives that make no host sync themselves (``ce``;
the LP objectives with ``solver.capture_safe``) and labels checked once beforehand
(:func:`objectives.common.labels_checked`), such a step can be captured in a CUDA graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from lpmetrics.objectives.base import draws_batches
from lpmetrics.packed.model import PackedModels
from lpmetrics.packed.optim import PackedSGD, unsupported


#: sync-free mode's loss codes, in the words of ``train.py``'s ``f"loss is {loss.item()}"``
LOSS_CODES = {1: "nan", 2: "inf", 3: "-inf"}


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
    sync_free: bool = False
    #: ``trainer.precision``'s autocast dtype (e.g. ``torch.bfloat16``): the packed forward runs
    #: under ``torch.autocast`` and the objectives get float32 scores, as in ``train.py``
    autocast: torch.dtype | None = None
    divergences: dict[int, Divergence] = field(default_factory=dict)
    #: sync-free mode: per run, the 1-based step of the first non-finite scores / loss (0: none
    #: yet), which (0 = scores, else a :data:`LOSS_CODES` key) and how many scores were
    #: non-finite, on the device until :meth:`poll` reads them
    pending: torch.Tensor | None = None
    pending_numel: int = field(default=0, repr=False)
    #: a 0-dim int64 device tensor holding ``step + 1``, set by a caller that replays the step
    #: from a CUDA graph (where a Python ``step`` would be frozen at capture); ``None``: use ``step``
    step_counter: torch.Tensor | None = field(default=None, repr=False)
    #: one pack-wide optimizer update (:class:`packed.optim.PackedSGD`) instead of N
    #: ``optimizer.step()`` calls: ``True`` (raises where unsupported), ``False``, or ``None``:
    #: where supported and the storage is on CUDA. Not on the CPU by default: there the update
    #: is a sliver of a convolution-bound step, and the per-run ``torch.optim.SGD`` keeps the
    #: ``loop`` mode bitwise equal to separate runs (``tests/test_packed.py``)
    pack_update: bool | None = None
    #: the pack-wide update's form (:class:`packed.optim.PackedSGD`'s ``fused``): ``False`` (the
    #: eager kernels, default until a GPU has measured the one pass), ``True`` (one compiled pass
    #: per stacked tensor, raising where it cannot compile) or ``"auto"`` (the one pass where it
    #: compiles); ignored when there is no pack-wide update
    fused_update: bool | str = False
    #: sync-free mode: runs whose objectives return one ``pack_key()`` (e.g. the dense,
    #: capture-safe pairwise LPs: :meth:`objectives.pairwise.PairwiseRampLP.pack_key`) get their
    #: losses from one ``pack_forward`` call, one batched LP instead of one LP per run; equal
    #: to the per-run calls (``tests/test_packed_pack_forward.py``). ``False``: one call per run
    batch_losses: bool = True
    _frozen_mask: tuple | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = self.packed.n
        for name in ("objectives", "optimizers", "schedulers"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for a pack of "
                                 f"{n} models: give one per run (None for no scheduler)")
        self.max_grad_norm = list(self.max_grad_norm or [None] * n)
        if len(self.max_grad_norm) != n:
            raise ValueError(f"max_grad_norm has {len(self.max_grad_norm)} entries for {n} runs")
        # train.py hands such objectives new batches from a side stream (on_step_end(draw_batch=));
        # a pack has none, and its runs must be their train.py twins: refused, not a silent fallback
        wants = [f"run {i} ({type(o).__name__})" for i, o in enumerate(self.objectives) if draws_batches(o)]
        if wants:
            raise ValueError(f"{', '.join(wants)}: the objective draws new training batches in "
                             "on_step_end (draw_batch), which only train.py provides; train such "
                             "runs with train.py (hydra/launcher=basic), not in a pack")
        why = unsupported(self.packed, self.optimizers)
        on_cuda = next(iter(self.packed.params.values())).device.type == "cuda"
        if self.packed.mode == "streams":   # the exact mode: each run's own optimizer.step()
            why = why or "mode='streams' replays each run's own update"
        if self.pack_update and why:
            raise ValueError(f"pack_update=True but {why}: leave pack_update=None to fall back")
        want = self.pack_update if self.pack_update is not None else on_cuda
        #: the pack-wide update in use, or ``None`` (each run's optimizer steps); :attr:`update_note`
        #: says which and, where it fell back, why (the launcher logs it and records it)
        self.update = PackedSGD(self.packed, self.optimizers, fused=self.fused_update) if want and not why else None
        self._no_update_why = why or "CPU default"

    @property
    def update_note(self) -> str:
        """Which update runs, read when asked: a one-pass update that fails to compile at its first
        step falls back to the eager kernels and says so from then on (:attr:`PackedSGD.fused_note`)."""
        if self.update is not None:
            return f"pack-wide SGD ({self.update.fused_note})"
        return f"per-run optimizers ({self._no_update_why})"

    @property
    def diverged(self) -> list[bool]:
        return [i in self.divergences for i in range(self.packed.n)]

    def _diverge(self, i: int, step: int, reason: str) -> None:
        self.divergences[i] = Divergence(step=step + 1, reason=reason)  # 1-based, as train.py

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.autocast is None:
            return self.packed(x)
        with torch.autocast(x.device.type, dtype=self.autocast):
            logits = self.packed(x)
        return logits.float()

    def poll(self) -> list[int]:
        """Sync-free mode: read the device flags (one host sync), record each newly diverged run
        in :attr:`divergences` (then frozen) and return their indices; eager mode: ``[]``."""
        if not self.sync_free or self.pending is None:
            return []
        new = []
        for i, (at, why, count) in enumerate(self.pending.tolist()):
            if at and i not in self.divergences:
                numel = self.pending_numel
                reason = (f"scores are non-finite ({count} of {numel} NaN/inf)" if why == 0 else
                          f"loss is {LOSS_CODES[why]}")   # the eager mode's words
                self.divergences[i] = Divergence(step=int(at), reason=reason)
                new.append(i)
        return new

    def step(self, x: torch.Tensor, y: torch.Tensor, step: int, schedule: bool = True) -> StepOutput:
        """Train every live run one step on its batch ``(x[i], y[i])``; returns the losses
        ``[N]`` (NaN for frozen runs) and the logits ``[N, B, K]``, both detached.
        ``schedule=False`` leaves the schedulers to the caller (:class:`packed.graph.GraphedStep`
        steps them on the host, outside a captured graph)."""
        packed, n = self.packed, self.packed.n
        if y.shape[:1] != (n,):
            raise ValueError(f"labels must be [N={n}, B]; got {tuple(y.shape)}")
        if self.sync_free:
            return self._step_sync_free(x, y, step, schedule)
        saved = {k: b.clone() for k, b in packed.buffers.items()}   # to freeze diverging runs
        logits = self._forward(x)
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
        self._update(lambda: torch.stack([losses[i] for i in live]).sum(), live, saved, x, y, step, schedule)
        return StepOutput(torch.stack([loss.detach() for loss in losses]), logits.detach())

    def _update(self, total, live: list[int], saved: dict | None, x, y, step: int, schedule: bool) -> None:
        """The step after the losses, shared by both modes: one backward of ``total()`` (the
        live runs' summed loss; not called when none is live), the frozen runs' BatchNorm
        statistics put back from ``saved``, then each live run's clipping, optimizer, scheduler
        (``schedule``) and hooks, in ``train.py``'s order."""
        packed = self.packed
        packed.zero_grad()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        if live:
            total().backward()
        # after the backward: BatchNorm's backward keeps the running statistics it was given
        with torch.no_grad():
            for i in self.divergences:   # frozen: BatchNorm statistics as before the step
                for k, b in packed.buffers.items():
                    b[i] = saved[k][i]
        packed.grads_to_models()
        for i in self.divergences:
            packed.models[i].zero_grad(set_to_none=True)
        # per run: clip, update, schedule, hooks. Runs share nothing, so doing each phase for all
        # runs before the next is the same as train.py's order run by run (and lets the update
        # be one pack-wide pass)
        for i in live:
            if self.max_grad_norm[i]:
                torch.nn.utils.clip_grad_norm_(packed.models[i].parameters(), self.max_grad_norm[i])
            if self.update is None:
                self.optimizers[i].step()
        if self.update is not None and live:
            self.update.step(self.frozen_mask(packed.params[next(iter(packed.params))].device)
                             if self.divergences else None)
        for i in live:
            if self.schedulers[i] is not None and schedule:
                self.schedulers[i].step()
            self.objectives[i].on_step_end(step=step, model=packed.models[i], optimizer=self.optimizers[i],
                                           batch=(x[i], y[i]))

    def frozen_mask(self, device: torch.device) -> torch.Tensor:
        """``[N]`` bool on ``device``: the runs frozen on the host; rebuilt (one small
        host-to-device copy) only when the frozen set changed."""
        frozen = frozenset(self.divergences)
        if self._frozen_mask is None or self._frozen_mask[0] != frozen or self._frozen_mask[1].device != device:
            self._frozen_mask = (frozen, torch.tensor([i in frozen for i in range(self.packed.n)], device=device))
        return self._frozen_mask[1]

    def _losses(self, logits: torch.Tensor, y: torch.Tensor, live: list[int]) -> dict[int, torch.Tensor]:
        """Each live run's loss: runs whose objectives share a ``pack_key()`` (two or more) through
        one ``pack_forward`` of their objective class, the others one call each."""
        out: dict[int, torch.Tensor] = {}
        groups: dict = {}
        for i in live:
            batched = self.batch_losses and self.packed.mode != "streams"   # streams: each run's own call
            key = self.objectives[i].pack_key() if batched and hasattr(self.objectives[i], "pack_key") else None
            if key is None:
                out[i] = self.objectives[i](logits[i], y[i])
            else:
                groups.setdefault(key, []).append(i)
        for idx in groups.values():
            objs = [self.objectives[i] for i in idx]
            values = type(objs[0]).pack_forward(objs, [logits[i] for i in idx], [y[i] for i in idx]) \
                if len(idx) > 1 else [objs[0](logits[idx[0]], y[idx[0]])]
            out.update(zip(idx, values))
        return out

    def _step_sync_free(self, x: torch.Tensor, y: torch.Tensor, step: int, schedule: bool = True) -> StepOutput:
        """:meth:`step` without a host sync (see the module docstring). Frozen runs are known on
        the host (from :meth:`poll`) and masked on the device by a mask built at the poll."""
        packed, n = self.packed, self.packed.n
        frozen = set(self.divergences)
        saved = {k: b.clone() for k, b in packed.buffers.items()} if frozen else None
        logits = self._forward(x)
        dev = logits.device
        if self.pending is None or self.pending.device != dev:
            self.pending = torch.zeros(n, 3, dtype=torch.long, device=dev)
        frozen_mask = self.frozen_mask(dev)
        bad_scores = (~torch.isfinite(logits)).flatten(1).sum(1)                   # [N]
        ok_scores = bad_scores == 0
        self.pending_numel = logits[0].numel()
        safe = torch.where(ok_scores.view(n, *[1] * (logits.dim() - 1)), logits, 0.0)
        dtype = torch.promote_types(logits.dtype, torch.float32)   # bf16 logits: float32 losses
        nan = torch.full((), math.nan, dtype=dtype, device=dev)
        live = [i for i in range(n) if i not in frozen]
        per_run = self._losses(safe, y, live)
        losses = torch.stack([per_run[i].to(dtype) if i not in frozen else nan for i in range(n)])   # [N]
        ok = ok_scores & torch.isfinite(losses) & ~frozen_mask
        first = ~ok & ~frozen_mask & (self.pending[:, 0] == 0)
        loss_code = torch.where(torch.isnan(losses), 1, torch.where(losses > 0, 2, 3))
        at = (torch.full_like(self.pending[:, 0], step + 1) if self.step_counter is None
              else self.step_counter.expand(n))   # a graph replays a device step number
        record = torch.stack([at,
                              torch.where(ok_scores, loss_code, 0), bad_scores], 1)
        self.pending.copy_(torch.where(first[:, None], record, self.pending))
        self._update(lambda: torch.where(ok, losses, 0.0).sum(), live, saved, x, y, step, schedule)
        return StepOutput(torch.where(ok, losses, math.nan).detach(), logits.detach())


def param_groups(model: torch.nn.Module, objective) -> list[dict]:
    """The optimizer's parameter groups of one run, as ``train.py`` forms them."""
    return [{"params": list(model.parameters())}] + objective.extra_param_groups()
