r"""``model.conv_impl=auto``: each machine chooses a ResNet's convolution path by gate, then time.

A run's convolutions can be torchvision's modules (``stock``: oneDNN's direct convolutions on the
CPU, cuDNN on CUDA), GEMMs (``gemm``: :class:`models.gemm_resnet.GemmResNet`, the code a GEMM
pack runs) or GEMMs on the small maps and oneDNN's direct kernel on the large ones (``mixed``;
``mixed16`` draws the line at smaller maps: :data:`models.gemm_resnet.MIXED_RATIOS`).
Which is faster depends on the CPU (AVX-512, AVX512-BF16 and AMX-BF16 or not), the image size and
the precision, and a path is only worth its speed if it trains what the stock model trains. So,
as a GPU window chooses its pack mode (:mod:`packed.select`), :func:`choose`

1. **gates** each of the other paths (:data:`CANDIDATES`) against the stock model. ``trainer.precision=fp32``: both in float64
   from the same initial weights, :data:`GATE_STEPS` SGD steps (momentum, weight decay) on the
   same random batch of the run's image shape; the logits, every parameter gradient, the
   BatchNorm running statistics and the parameters after each step, then the evaluation forward
   in both BatchNorm modes, must agree to :data:`FP64_TOL` relative (float64 equality class: the
   two differ only in summation order: 2e-14 to 8e-13 measured on this network at 32 and 50 px). ``bf16``: one training forward and
   backward in float32 of the stock model (the reference), of the stock model under bf16
   autocast (the error the precision already brings: distance :math:`r`) and of the candidate
   with bf16 operands (distance :math:`d`), each the relative 2-norm distance of the logits and
   of the flat gradient to the reference; pass iff :math:`d \le K \max(r, 2^{-23})` for both,
   :data:`K` = 4 as in :mod:`packed.select` (recorded: ``d``, ``r`` and the bound);
2. **times** a training step (forward, cross-entropy, backward, SGD) of stock and of each
   candidate that passed, at the run's batch and shape and precision, interleaved round by round
   so drifting load hits all alike, after one warm step: the median of :data:`REPS`;
3. **chooses** the fastest path that passed; any error, or no candidate passing and faster:
   ``stock``, with the reason.

A candidate that computes the same way as an earlier one at the run's image size (the same
convolutions by the direct kernel, :func:`distinct`) is not weighed: at 32 px ``mixed16`` is
``mixed``, so timing noise cannot give one run's arithmetic two names.

``auto`` never changes the precision: every path runs at the run's ``trainer.precision``. So under
``bf16`` a path is no candidate where this CPU ignores oneDNN's bf16 math mode for an operation it
needs (:data:`BF16_OPS`, :func:`models.gemm.bf16_math`): its "bf16 operands" would be float32
there (an AMD EPYC with AVX512-BF16 and no AMX, 2026-11-29), and the choice is recorded with why.
On CUDA (and any device but the CPU) ``auto`` is ``stock`` (cuDNN's convolutions; the GEMM path
there is the GPU packs' business). The choice costs a few seconds (float64 gate, then
up to ``(1 + len(CANDIDATES)) (1 + REPS)`` steps) and is cached per machine in ``~/.cache/lpmetrics/conv_impl.json``
(``$LPMETRICS_CACHE`` overrides the folder), keyed by the CPU model, its flags, the torch version,
the thread count, the image shape, batch, stem and precision. The record (JSON-ready, written into
every run's ``results.json`` by the run layer) names the path, the precision, the threads, the
CPU model and its SIMD flags, the gate's distances and the timings.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lpmetrics.atomic import atomic_write_json
from lpmetrics.models import gemm

K = 4                  # bf16 gate: at most K times the precision's own distance
FLOOR = 2.0 ** -23     # float32's machine epsilon: the least reference distance
FP64_TOL = 1e-9        # fp32 gate: float64 agreement (measured 2e-14 to 8e-13: results/cpu_step/, conv_choice; a real error is >= 1e-4)
GATE_STEPS = 2         # SGD steps of the float64 gate
GATE_BATCH = 8         # images in the gate's batch
REPS = 5               # timed steps per path (after one warm step), as packed.select's
#: CPU flags that decide the GEMMs' speed (recorded; the cache key hashes the whole flag list)
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
CACHE_VERSION = 6      # bump when the rule or a path changes: older entries are then chosen afresh
CANDIDATES = ("gemm", "mixed", "mixed16")   # the paths auto weighs against stock
#: the oneDNN operations (:func:`models.gemm.bf16_math`) whose bf16 math mode each path's bf16 operands need
BF16_OPS = {"gemm": ("matmul",), "mixed": ("matmul", "conv"), "mixed16": ("matmul", "conv")}
_MEMO: dict[str, dict] = {}   # this process's choices (a read-only cache folder chooses once per process)


def _cpuinfo() -> tuple[str, list[str]]:
    """(model name, flags) from ``/proc/cpuinfo``; ``("unknown", [])`` where there is none."""
    name, flags = "unknown", []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown":
                    name = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = value.split()
    except OSError:
        pass
    return name, flags


def machine() -> dict:
    """The CPU, its SIMD flags (those of :data:`SIMD_FLAGS` it has, and a hash of all), the
    torch version and the thread count: what a choice is valid for; and what oneDNN's bf16 math
    mode does here (:func:`models.gemm.bf16_math`: ``"fp32"`` where the GEMM paths' bf16 operands
    stay float32)."""
    name, flags = _cpuinfo()
    return {"cpu": name, "simd_flags": [f for f in SIMD_FLAGS if f in flags],
            "flags_sha1": hashlib.sha1(" ".join(sorted(flags)).encode()).hexdigest()[:12],
            "torch": torch.__version__, "threads": torch.get_num_threads(), "bf16_math": gemm.bf16_math()}


def cache_path() -> Path:
    return Path(os.environ.get("LPMETRICS_CACHE", Path.home() / ".cache" / "lpmetrics")) / "conv_impl.json"


def _key(mach: dict, shape: tuple, batch: int, precision: str, stem: str) -> str:
    return json.dumps([CACHE_VERSION, mach["cpu"], mach["flags_sha1"], mach["torch"], mach["threads"],
                       list(shape), batch, precision, stem])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def _flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def _state(model: nn.Module) -> torch.Tensor:
    return torch.cat([v.double().flatten() for v in model.state_dict().values()])


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)


def _eval_logits(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Evaluation forwards in both BatchNorm modes (running statistics; batch statistics on a copy)."""
    with torch.no_grad():
        bn_train = copy.deepcopy(model).eval()
        for m in bn_train.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.train()
        return [model.eval()(x), bn_train(x)]


def gate_fp32(make: Callable[[str], nn.Module], shape: tuple, classes: int, impl: str = "gemm") -> dict:
    """Float64 twins, stock and ``impl`` (module docstring, step 1): the largest relative distance
    over logits, gradients, statistics and parameters, and whether it is within :data:`FP64_TOL`."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(GATE_BATCH, *shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (GATE_BATCH,), generator=g)
    twins = {name: make(name).double().train() for name in ("stock", impl)}
    twins[impl].load_state_dict(twins["stock"].state_dict())
    opts = {name: _sgd(m) for name, m in twins.items()}
    worst = 0.0
    for _ in range(GATE_STEPS):
        seen = {}
        for name, m in twins.items():
            logits = m(x)
            opts[name].zero_grad(set_to_none=True)
            F.cross_entropy(logits, y).backward()
            seen[name] = [logits.detach(), _flat_grads(m)]
            opts[name].step()
            seen[name].append(_state(m))
        worst = max([worst] + [_rel(a, b) for a, b in zip(seen[impl], seen["stock"])])
    evals = {name: _eval_logits(m, x) for name, m in twins.items()}
    worst = max([worst] + [_rel(a, b) for a, b in zip(evals[impl], evals["stock"])])
    return {"rule": f"float64, {GATE_STEPS} SGD steps + both evaluation modes, max relative distance <= {FP64_TOL}",
            "distance": worst, "passed": worst <= FP64_TOL}


def _bf16_pass(model: nn.Module, x: torch.Tensor, y: torch.Tensor, amp: bool) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        logits = model(x)
    F.cross_entropy(logits.float(), y).backward()
    return [logits.detach().float(), _flat_grads(model)]


def gate_bf16(make: Callable[[str], nn.Module], shape: tuple, classes: int, impl: str = "gemm") -> dict:
    """The bf16 gate (module docstring, step 1): distances ``d`` (``impl``, bf16 operands) and ``r``
    (stock under bf16 autocast) to the float32 stock model, logits and gradients."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(GATE_BATCH * 2, *shape, generator=g)
    y = torch.randint(0, classes, (GATE_BATCH * 2,), generator=g)
    stock = make("stock").train()
    candidate = make(impl).train()
    candidate.load_state_dict(stock.state_dict())
    state = copy.deepcopy(stock.state_dict())   # each pass from the same statistics
    ref = _bf16_pass(stock, x, y, amp=False)
    stock.load_state_dict(state)
    r = [_rel(a, b) for a, b in zip(_bf16_pass(stock, x, y, amp=True), ref)]
    d = [_rel(a, b) for a, b in zip(_bf16_pass(candidate, x, y, amp=True), ref)]
    bound = [K * max(ri, FLOOR) for ri in r]
    return {"rule": f"bf16: distance to float32 stock (logits, gradient) <= {K} x stock bf16 autocast's",
            "distance": d, "reference_distance": r, "bound": bound,
            "passed": all(di <= bi for di, bi in zip(d, bound))}


def _step(model: nn.Module, opt: torch.optim.Optimizer, x, y, amp: bool) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        logits = model(x)
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(logits.float(), y).backward()
    opt.step()


def time_steps(make: Callable[[str], nn.Module], shape: tuple, classes: int, batch: int,
               precision: str, reps: int | None = None,
               impls: tuple[str, ...] = ("stock", *CANDIDATES)) -> dict[str, float]:
    """Median ms per training step of each path in ``impls``, interleaved (module docstring, step
    2); ``reps`` timed steps each (default :data:`REPS`)."""
    reps = REPS if reps is None else reps
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, *shape, generator=g).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (batch,), generator=g)
    runs = {}
    for impl in impls:
        model = make(impl).train()
        runs[impl] = (model, _sgd(model))
    amp = precision == "bf16"
    times = {impl: [] for impl in runs}
    for rep in range(reps + 1):
        for impl, (model, opt) in runs.items():
            start = time.perf_counter()
            _step(model, opt, x, y, amp)
            if rep:   # the first round warms up
                times[impl].append((time.perf_counter() - start) * 1e3)
    return {impl: statistics.median(t) for impl, t in times.items()}


def bf16_ignored(impl: str) -> list[str]:
    """The oneDNN operations of path ``impl`` whose bf16 math mode this CPU ignores
    (:func:`models.gemm.bf16_math`): where any is, the path's bf16 operands are float32 here."""
    modes = gemm.bf16_math()
    return [op for op in BF16_OPS.get(impl, ()) if modes[op] == "fp32"]


def bf16_note(impl: str) -> str:
    """Why path ``impl`` computes in float32 under bf16 on this CPU (:func:`bf16_ignored`), or ``""``."""
    ops = bf16_ignored(impl)
    return f"oneDNN ignores the bf16 math mode for {' and '.join(ops)} on this CPU (float32 kernels)" if ops else ""


def distinct(make: Callable[[str], nn.Module], shape: tuple, candidates: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """``candidates`` less those that compute the same way as an earlier one at this image shape
    (the same convolutions by the direct kernel: at 32 px ``mixed16`` is ``mixed``), and why."""
    kept, seen, why = [], {}, ""
    for impl in candidates:
        model = make(impl)
        if not hasattr(model, "direct_split"):   # not a GEMM model: nothing to compare it by
            kept.append(impl)
            continue
        split = model.direct_split(*shape[-2:])
        key = tuple(sorted(split.items())) if any(split.values()) else ()   # () : every convolution a GEMM
        if key in seen:
            why += f"; {impl} left out: the same convolutions as {seen[key]} at this image size"
        else:
            seen[key] = impl
            kept.append(impl)
    return tuple(kept), why


def choose(make: Callable[[str], nn.Module], shape: tuple, classes: int, batch: int, precision: str) -> dict:
    """Gate, time and choose on this machine (module docstring); never raises."""
    record: dict = {"impl": "stock", "precision": precision}
    start = time.perf_counter()
    try:
        candidates, skipped = CANDIDATES, ""
        if precision == "bf16":   # a path whose bf16 math mode is ignored here would run float32
            notes = {impl: bf16_note(impl) for impl in CANDIDATES}
            candidates = tuple(impl for impl in CANDIDATES if not notes[impl])
            skipped = "".join(f"; {impl} left out: {notes[impl]}" for impl in CANDIDATES if notes[impl])
            if not candidates:
                record["why"] = f"stock (bf16 autocast){skipped}"
                return record
        candidates, same = distinct(make, shape, candidates)
        skipped += same
        gate = gate_bf16 if precision == "bf16" else gate_fp32
        record["gate"] = {impl: gate(make, shape, classes, impl) for impl in candidates}
        passed = tuple(impl for impl in candidates if record["gate"][impl]["passed"])
        if not passed:
            record["why"] = f"{' and '.join(candidates)} failed the gate: stock{skipped}"
            return record
        ms = time_steps(make, shape, classes, batch, precision, impls=("stock", *passed))
        record["ms_per_step"] = ms
        record["impl"] = min(ms, key=ms.get)
        times = ", ".join(f"{impl} {t:.0f}" for impl, t in ms.items())
        failed = "".join(f"; {impl} failed the gate" for impl in candidates if impl not in passed)
        record["why"] = f"{record['impl']} fastest of those that passed the gate ({times} ms per step){failed}{skipped}"
    except Exception as err:   # any failure falls back to the stock path, with its reason
        record.update(impl="stock", why=f"fell back to stock: {type(err).__name__}: {err}",
                      traceback=traceback.format_exc(limit=3))
    finally:
        record["choice_s"] = round(time.perf_counter() - start, 2)
    return record


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def resolve(make: Callable[[str], nn.Module], shape: tuple, classes: int, batch: int, precision: str,
            device: torch.device, stem: str = "imagenet") -> dict:
    """The record of ``auto`` for a run on ``device`` (``impl``: the path to build), from this
    machine's cache when it holds the key, else chosen now (:func:`choose`) and cached."""
    mach = machine()
    if device.type != "cpu":
        return {"impl": "stock", "precision": precision, "why": f"auto on {device.type}: torchvision's "
                "modules (cuDNN); the GEMM path serves GPU packs", **mach}
    path, key = cache_path(), _key(mach, shape, batch, precision, stem)
    if key in _MEMO:
        return _MEMO[key]
    cached = _read_cache(path).get(key)
    if cached is not None:
        _MEMO[key] = {**cached, **mach, "cached": str(path)}
        return _MEMO[key]
    with torch.random.fork_rng(devices=[]):   # the run's own draws (initial weights) stay as they were
        record = choose(make, shape, classes, batch, precision)
    record["chosen_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if "traceback" not in record:   # a failure (maybe passing: a busy machine, a bad config) is not cached
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, {**_read_cache(path), key: record})
        except OSError as err:   # a read-only home: choose again next time
            record["cache_error"] = str(err)
    _MEMO[key] = {**record, **mach, "cached": None}
    return _MEMO[key]
