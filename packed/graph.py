r"""A pack's training step replayed from a captured CUDA graph: :class:`GraphedStep`.

Why. On an H100 the sync-free packed step of 24 ResNet-18 runs (``ce``) takes 90.9 ms eager and
35.0 ms as a graph replay, with equal results (``results/packed_bench/gpu_h100/``): the eager step
is bound by the host launching ~10^4 small kernels, which a replay does not do.

What is captured: one :meth:`packed.PackedStep.step` in sync-free mode with ``schedule=False``, on
static input buffers. What stays on the host, every step: copying the batch into those buffers,
the replay, copying the losses out, and each live run's ``scheduler.step()``. The divergence step
number is a device scalar set before each replay (:attr:`PackedStep.step_counter`).

When it recaptures: a captured graph freezes every Python decision of the step, so the graph is
rebuilt (before the next step) whenever one of them changes: when the frozen set changes
(:meth:`PackedStep.poll` found a divergence), and when a Python number baked into the update's
kernels changes. With the pack-wide update (:class:`packed.optim.PackedSGD`, on CUDA by default)
the learning rates are a device tensor refreshed on the host before each replay, so an lr
milestone needs no new graph; with per-run optimizers each lr change (a milestone, a PPD stage
end) recaptures.

What may be captured: packs whose objectives are all ``capturable`` (``ce``; ``auc_lp`` in its
dense, capture-safe form, which the launcher picks on CUDA: :func:`capture_form`; ``ppd_sg`` /
``ppd_adagrad``) and whose optimizers are plain ``torch.optim.SGD`` or declare ``graph_safe``
(:func:`capturable`). A ``graph_safe`` optimizer makes no host sync in ``step()`` and keeps its
host decisions predictable from the step count: ``needs_host(step)`` says that step decides
something on the host (PPD-SG / PPD-AdaGrad: a stage end, with its averaging, lr cut and
:math:`\alpha` re-estimate), and that step runs eagerly instead of from the graph;
``sync_clock(steps)`` sets its host counters after a replay (which runs no Python). The first
``warmup`` steps run eagerly on a side stream (optimizer state, cuDNN's choices, the allocator),
as ``torch.cuda.graph`` requires; they are real training steps.

Status: the capture of this very step (``ce`` + SGD, 3 replays equal to 3 eager steps, max
parameter difference 0.0) was checked on an H100 (``scripts/packed/check_packed_device.py``); the
recapture logic is tested on the CPU with stand-ins for the graph (``tests/test_packed_graph.py``;
``tests/test_packed_capture.py`` with one that undoes a replay's Python side effects, as a real
replay never has them). On an H100 (2026-11-27, :mod:`packed.check_graph`) the pack-wide update,
PPD and the dense ``auc_lp`` replayed from a graph equalled their eager steps exactly, and the
campaign trained two runs to 40k steps this way (``results/paper_tables/``). The launcher still
uses it only when asked (``train_packed(cuda_graph=True)``, ``hydra.launcher.cuda_graph=true``;
``scripts/campaign/gpu_window.sh`` asks where that check passes on the machine at hand).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lpmetrics.packed.step import PackedStep, StepOutput


def capture_form(objective, device: torch.device | str):
    """The objective a pack on ``device`` trains: on CUDA, where ``objective`` is not
    ``capturable``, its capture-safe form if it has one (same loss and gradient, no host sync:
    :meth:`objectives.base.Objective.capture_safe_form`; ``auc_lp`` -> dense pairs and the
    capture-safe solver); else ``objective`` itself. On the CPU packs keep the configured form
    (no graphs there, and the masked LP is the cheaper one)."""
    if torch.device(device).type != "cuda" or getattr(objective, "capturable", False):
        return objective
    twin = objective.capture_safe_form()
    return objective if twin is None else twin


def capturable(stepper: PackedStep) -> str:
    """Why ``stepper``'s step cannot be captured ("" if it can)."""
    if not stepper.sync_free:
        return "the step is not sync-free (PackedStep(sync_free=True))"
    for i, (obj, opt) in enumerate(zip(stepper.objectives, stepper.optimizers)):
        if not getattr(obj, "capturable", False):
            return (f"run {i}'s objective {type(obj).__name__} is not capturable (ce and "
                    "the capture-safe forms of auc_lp, auc_ova_lp and f1_lp are)")
        if type(opt) is not torch.optim.SGD and not getattr(opt, "graph_safe", False):
            return (f"run {i}'s optimizer {type(opt).__name__} is neither plain torch.optim.SGD "
                    "nor graph_safe")
    return ""


class CudaGraph:
    """``torch.cuda.graph`` around one call of ``fn``; ``output`` holds its (static) result."""

    def __init__(self, fn: Callable[[], Any], device: torch.device) -> None:
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = fn()

    def replay(self) -> None:
        self.graph.replay()


class GraphedStep:
    """Steps a sync-free :class:`PackedStep` by CUDA-graph replay; see the module docstring.

    ``make_graph(fn, device)`` builds the graph (default :class:`CudaGraph`; tests pass a stand-in
    that calls ``fn`` on every replay). :attr:`captures` counts the captures made,
    :attr:`eager_steps` the warm-up steps, :attr:`host_steps` the later steps run eagerly.
    """

    def __init__(self, stepper: PackedStep, warmup: int = 3,
                 make_graph: Callable[[Callable[[], Any], torch.device], Any] = CudaGraph) -> None:
        why = capturable(stepper)
        if why:
            raise ValueError(f"this pack cannot be captured: {why}")
        if int(warmup) < 1:   # state created inside a capture would be re-created by every replay
            raise ValueError(f"warmup={warmup}: at least one eager step must build the optimizer "
                             "state, the device flags and the statistics before a capture")
        self.stepper, self.warmup, self.make_graph = stepper, int(warmup), make_graph
        self.graph, self.key, self.captures, self.eager_steps = None, None, 0, 0
        self.host_steps = 0   # steps run eagerly after the warm-up because they decide on the host
        self.x = self.y = None

    def _key(self) -> tuple:
        """What a capture freezes: the frozen set, and the Python numbers baked into the update's
        kernels: the pack-wide update's few switches (its hyperparameters are device tensors,
        :class:`packed.optim.PackedSGD`), else every scalar hyperparameter of every param group
        of the runs' optimizers (lr, momentum, weight decay, ...)."""
        st = self.stepper
        if st.update is not None:
            return frozenset(st.divergences), st.update.baked()
        return (frozenset(st.divergences),
                tuple((k, v) for opt in st.optimizers for g in opt.param_groups
                      for k, v in sorted(g.items()) if k != "params" and isinstance(v, (int, float, bool))))

    def _live_optimizers(self):
        return [opt for i, opt in enumerate(self.stepper.optimizers) if i not in self.stepper.divergences]

    def _needs_host(self, step: int) -> bool:
        """Whether some live run's optimizer decides something on the host at ``step`` (a PPD
        stage end: averaging, the lr cut, the alpha re-estimate), which a graph captured at
        another step would skip. A pack's optimizers start at step 0, so ``step`` is the number
        of steps each has taken."""
        return any(opt.needs_host(step) for opt in self._live_optimizers() if hasattr(opt, "needs_host"))

    def _sync_clocks(self, steps: int) -> None:
        """After a replay: the optimizers' host counters as ``steps`` steps leave them (a replay
        runs no Python, so a counter its ``step()`` advances would stand still)."""
        for opt in self._live_optimizers():
            if hasattr(opt, "sync_clock"):
                opt.sync_clock(steps)

    def _eager(self, x: torch.Tensor, y: torch.Tensor, step: int) -> StepOutput:
        """A real step, eagerly, on a side stream (what ``torch.cuda.graph`` wants before a capture)."""
        if x.device.type != "cuda":
            return self.stepper.step(x, y, step, schedule=False)
        main = torch.cuda.current_stream(x.device)
        side = torch.cuda.Stream(x.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = self.stepper.step(x, y, step, schedule=False)
        main.wait_stream(side)
        return out

    def step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> StepOutput:
        st = self.stepper
        if st.update is not None:
            st.update.refresh()   # new lrs into the device tensors, outside any capture
        warming = self.eager_steps < self.warmup
        if warming or self._needs_host(step):
            out = self._eager(x, y, step)
            self.eager_steps += warming
            self.host_steps += not warming
            self._schedule()
            return out
        if self.graph is None or self.key != self._key():
            self.graph = None   # the old graph's memory goes before the new one is taken
            self.x, self.y = x.clone(), y.clone()
            st.frozen_mask(x.device)   # built outside the capture (a host-to-device copy)
            st.step_counter = torch.zeros((), dtype=torch.long, device=x.device)
            self.key = self._key()
            self.graph = self.make_graph(lambda: st.step(self.x, self.y, step, schedule=False), x.device)
            self.captures += 1
        else:
            self.x.copy_(x)
            self.y.copy_(y)
        st.step_counter.fill_(step + 1)
        self.graph.replay()
        self._sync_clocks(step + 1)
        out = self.graph.output
        self._schedule()
        return StepOutput(out.losses.clone(), out.logits.clone())   # the graph's outputs are overwritten

    def _schedule(self) -> None:
        for i, sched in enumerate(self.stepper.schedulers):
            if sched is not None and i not in self.stepper.divergences:
                sched.step()
