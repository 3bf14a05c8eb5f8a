"""Per-phase wall time of the training step (``timing_ms_median`` in ``results.json``).

The phases are :data:`TIMED_PHASES`; a step's time is their sum. On CUDA each lap synchronises,
so the split between phases is honest (and the step a little slower than an untimed one).
"""
from __future__ import annotations

import statistics
import time

import torch

TIMED_PHASES = ("data", "forward", "loss", "backward", "optimizer")


class Timer:
    """Per-phase wall time of one step (synchronising CUDA so the split is honest)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.samples: dict[str, list[float]] = {p: [] for p in TIMED_PHASES}
        self._t = 0.0

    def start(self) -> None:
        self._t = time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.samples[phase].append(1000.0 * (now - self._t))
        self._t = now

    def medians_ms(self) -> dict[str, float]:
        out = {p: statistics.median(v) for p, v in self.samples.items() if v}
        steps = [sum(parts) for parts in zip(*self.samples.values())]
        if steps:
            out["step"] = statistics.median(steps)
        return out
