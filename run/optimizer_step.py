"""The optimizer step a run calls at every training step: eager, or compiled (``trainer.optimizer_impl``).

``eager`` is the optimizer's own ``step()``. ``compiled`` is the same step with its elementwise
arithmetic compiled by ``torch.compile`` (inductor: fused C++ loops on a CPU, a C++ compiler
needed): an optimizer that knows a compiled form of its own gives it (``compiled_step(compile_fn)``
returning a step function that returns ``None``, or the error after which it finished that step
eagerly; e.g.
:meth:`lpmetrics.baselines.ppd_optim.PPDSG.compiled_step`, which keeps its stage logic eager and
its numbers in 0-d tensors); any other optimizer's ``step`` is compiled whole (``torch.optim.SGD``:
a new lr compiles once more, a handful of times per run). The eager step is a chain of passes
over every parameter and is bound by memory bandwidth; on one CPU thread beside another training,
ResNet-18's PPD-AdaGrad step took 98.7 ms eager against 29.8 compiled
(``results/cpu_step/README.md``).

The two forms agree to rounding, not bit for bit (the fused loops do not round as the eager
passes do), so like the convolution path the choice is no part of a run's protocol, is recorded
in ``results.json`` (``optimizer_impl``: what was asked, what ran, why, seconds spent compiling
by the launch that wrote it; a resumed run compiles again)
and may not change on resume. A compiled form that fails (no C++ compiler, an operation the
compiler refuses) falls back to the eager step for the rest of the run, with a warning and the
reason in the record. A compiled function fails before it writes anything, so a single compiled
call that fails is followed by the eager step; an optimizer's own form that compiles one function
per parameter group finishes a step whose later group fails eagerly itself, so no group is
stepped twice. Once a launch fell back, the run's later launches step eagerly too. Dynamo's own
silent fallbacks (a recompile limit) are not detected.
"""
from __future__ import annotations

import time
import warnings
from typing import Callable

import torch

IMPLS = ("eager", "compiled")


def build_step(optimizer: torch.optim.Optimizer, impl: str, compile_fn: Callable | None = None,
               earlier: list[dict] = ()) -> tuple[Callable[[], None], dict]:
    """``(step, record)``: the function the loop calls in place of ``optimizer.step()``, and the
    record for ``results.json`` and this launch's entry in its ``launches`` (updated in place as
    the run goes: the compile time, a fallback). ``earlier``: the records of the run's earlier
    launches; once one fell back to the eager step, the run stays eager (its record says so)."""
    if impl not in IMPLS:
        raise ValueError(f"trainer.optimizer_impl={impl!r} must be one of {', '.join(IMPLS)}")
    record = {"requested": impl, "impl": impl, "optimizer": type(optimizer).__name__}
    fell = next((r["fallback"] for r in earlier if r and r.get("fallback")), None)
    if impl == "compiled" and fell:
        record.update(impl="eager", fallback=f"an earlier launch of this run fell back ({fell})")
    if record["impl"] == "eager":
        return optimizer.step, record
    compile_fn = compile_fn or torch.compile
    try:
        own = getattr(optimizer, "compiled_step", None)
        fast = own(compile_fn) if own is not None else compile_fn(optimizer.step)
    except Exception as err:   # noqa: BLE001 -- any failure to build it: the eager step, recorded
        return _fall_back(optimizer, record, err), record
    record.update(form="the optimizer's own" if own is not None else "torch.compile(optimizer.step)",
                  compile_s=0.0)
    state = {"fast": fast, "frames": _frames_compiled()}

    def step() -> None:
        if state["fast"] is None:
            optimizer.step()
            return
        start = time.perf_counter()
        try:
            finished_after = state["fast"]()
        except Exception as err:   # noqa: BLE001 -- a compile error surfaces at a call, before the
            state["fast"] = None     # compiled function has written anything: the eager step now
            _fall_back(optimizer, record, err)()
            return
        if isinstance(finished_after, Exception):   # an optimizer's own form that failed part-way
            state["fast"] = None                      # and finished this step eagerly: not again
            _fall_back(optimizer, record, finished_after)
            return
        frames = _frames_compiled()
        if frames != state["frames"]:   # this call (re)compiled: its time is compile time
            record["compile_s"] += time.perf_counter() - start
            state["frames"] = frames
        # what the lr scheduler's wrapper of ``optimizer.step`` notes, which this call bypasses (its
        # warning "lr_scheduler.step() before optimizer.step()" would be false)
        optimizer._opt_called = True

    return step, record


def _frames_compiled() -> int:
    """How many frames dynamo has compiled in this process (its counters)."""
    from torch._dynamo.utils import counters
    return sum(counters["stats"].values())


def _fall_back(optimizer: torch.optim.Optimizer, record: dict, err: Exception) -> Callable[[], None]:
    why = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}"
    record.update(impl="eager", fallback=why)
    warnings.warn(f"trainer.optimizer_impl=compiled: compiling {type(optimizer).__name__}'s step failed "
                  f"({why}); the run steps eagerly from here (recorded in results.json, optimizer_impl)",
                  RuntimeWarning, stacklevel=3)
    return optimizer.step


def public(record: dict) -> dict:
    """The record as ``results.json`` stores it (the compile time rounded)."""
    return {k: round(v, 2) if k == "compile_s" else v for k, v in record.items()}
