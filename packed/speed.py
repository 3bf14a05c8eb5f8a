"""Packed step vs the same runs as separate steps: :func:`build_runs`, :func:`interleaved_ms`;
a pack's evaluation: :func:`pack_eval_ms`.

    OMP_NUM_THREADS=1 python -m lpmetrics.packed.speed                         # CPU, N=4
    python -m lpmetrics.packed.speed --device cuda --n 1 8 24 --models resnet18   # GPU, an N sweep

A sanity number for the docstring of :mod:`packed.model` (CE + SGD, float32); the full
benchmark (N sweep, image sizes, objectives, bf16, CUDA graphs, memory, TFLOP/s) is
``scripts/packed/bench_packed.py``, which builds its runs with :func:`build_runs`. Prints median
milliseconds per step (all N runs), the two modes timed alternately so load drifts hit both.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lpmetrics.models.mlp import MLP
from lpmetrics.models.resnet import resnet18
from lpmetrics.objectives.ce import CrossEntropy
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed import PackedStep, pack, param_groups

SGD = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)   # optimizer=sgd's defaults


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, reps: int, device: torch.device = torch.device("cpu")) -> float:
    """Median wall milliseconds of ``fn()`` over ``reps`` calls, after one warm-up call."""
    return interleaved_ms({"fn": fn}, reps, device)["fn"]


def interleaved_ms(fns: dict[str, Callable[[], object]], reps: int,
                   device: torch.device = torch.device("cpu"), warmup: int = 1) -> dict[str, float]:
    """Median wall milliseconds of each ``fns[k]()``, the functions called in turn per round
    (after ``warmup`` untimed rounds: allocator, kernel choice, optimizer state)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    _sync(device)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            _sync(device)
            times[k].append(1000 * (time.perf_counter() - t))
    return {k: statistics.median(v) for k, v in times.items()}


def runner_ms(runs: "Runs", runner, reps: int, device: torch.device = torch.device("cpu")) -> float:
    """Median wall ms of ``runner.step`` on ``runs``' batches, the step number counting up as in
    training: ``runner`` is ``runs.stepper`` or what the launcher would step instead
    (:func:`packed.launch.step_runner`: a :class:`packed.graph.GraphedStep`, whose eager warm-up
    steps and capture are all untimed, so only replays are timed)."""
    steps = iter(range(1 << 62))

    def step():
        with labels_checked() if runs.stepper.sync_free else contextlib.nullcontext():
            return runner.step(runs.x, runs.y, next(steps))
    return interleaved_ms({"step": step}, reps, device, warmup=getattr(runner, "warmup", 0) + 1)["step"]


@dataclass
class Runs:
    """N runs twice over, from the same initial weights: as N separate models (``separate()``
    steps each in turn, as N ``train.py`` processes would) and as one pack (``packed()``: one
    :class:`PackedStep`). ``x [N, B, ...]`` and ``y [N, B]`` are the fixed batches (static
    tensors, so ``packed`` can be captured in a CUDA graph where the step allows it)."""

    separate: Callable[[], None]
    packed: Callable[[], object]
    stepper: PackedStep
    x: torch.Tensor
    y: torch.Tensor


def pack_eval_ms(packed, rows: list, device: torch.device = torch.device("cpu")) -> float:
    """Wall milliseconds of one evaluation of every run of ``packed``, made as the packed launcher
    makes it at a step where all its runs are due (:func:`packed.launch._evaluate_runs`): the
    pack's passes over the evaluation sets in its own forward mode
    (:class:`packed.evaluate.PackEvaluator`; a pack of one goes to :func:`builders.predict`, as
    there), then :func:`run.evaluation.evaluate` of each run's evaluation splits with those
    logits: its own BatchNorm mode on val and test, and test once more in the other mode (batches
    of ``trainer.bntrain_batch_size``), each scored on the host. ``rows[i]``: run ``i``'s ``cfg``,
    ``bundle`` and ``eval_splits`` (a :class:`run.job.Run`, or :class:`EvalRow`).

    Why not one lone model's evaluation: a pack of N pays N runs' passes and metrics, through a
    forward whose cost depends on the mode (``loop``: each run's kernels in turn); on an H200
    (ResNet-18, CIFAR-10, ``eval_every`` 2000) a pack of two took 3.3 s (``gemm``) and 3.75 s
    (``loop``) per evaluation, one lone model's 1.23 s. Not timed: the run's bookkeeping after its
    metrics (``metrics.csv``, the logger), milliseconds against seconds."""
    from lpmetrics.packed.evaluate import PackEvaluator
    from lpmetrics.run.evaluation import evaluate
    runs = dict(enumerate(rows))
    _sync(device)
    t0 = time.perf_counter()
    with PackEvaluator(packed, device).serving(runs) as predict_fn:
        for i, row in runs.items():
            for split in row.eval_splits:
                evaluate(packed.models[i], row.bundle, split, row.cfg, device, predict_fn)
    _sync(device)
    return 1000 * (time.perf_counter() - t0)


@dataclass
class EvalRow:
    """What a run's evaluation reads of it (:func:`pack_eval_ms`), for a probe without a
    :class:`run.job.Run`: its config and data; its evaluation splits by the run's own rule."""

    cfg: object
    bundle: object

    @property
    def eval_splits(self) -> tuple[str, ...]:
        from lpmetrics.run.job import Run
        return Run.eval_splits.fget(self)


def build_runs(make, shape, batch: int, n: int, device: torch.device = torch.device("cpu"),
               make_objective: Callable[[], torch.nn.Module] = CrossEntropy,
               autocast: torch.dtype | None = None, num_classes: int = 2,
               make_optimizer: Callable[[list], torch.optim.Optimizer] | None = None,
               sync_free: bool = False, pack_form: Callable | None = None,
               pack_update: bool | None = None, mode: str = "auto") -> Runs:
    """Build ``n`` runs of ``make()`` (``make_objective()`` and ``make_optimizer(param_groups)``
    each; default SGD with ``optimizer=sgd``'s values) on ``[batch, *shape]`` inputs;
    ``autocast`` (e.g. ``torch.bfloat16``) wraps both steps in ``torch.autocast``;
    ``sync_free``: the packed step's sync-free mode (:class:`PackedStep`), labels checked once;
    ``pack_form(objective)``: the form the packed runs train (e.g. :func:`packed.graph.capture_form`,
    as the launcher does; the separate runs keep the configured one); ``pack_update``: as
    :attr:`PackedStep.pack_update`; ``mode``: the pack's forward (:data:`packed.model.MODES`),
    set before the step is built, since ``streams`` also decides the update."""
    make_optimizer = make_optimizer or (lambda groups: torch.optim.SGD(groups, **SGD))
    torch.manual_seed(0)
    models = [make().to(device) for _ in range(n)]
    alone = [copy.deepcopy(m) for m in models]
    own = [make_objective().to(device) for _ in range(n)]      # separate runs' objectives
    shared = [(pack_form or (lambda o: o))(make_objective().to(device)) for _ in range(n)]   # packed runs' objectives
    opts = [make_optimizer(param_groups(m, o)) for m, o in zip(alone, own)]
    packed = pack(models, mode)
    stepper = PackedStep(packed, shared,
                         [make_optimizer(param_groups(m, o)) for m, o in zip(packed.models, shared)],
                         [None] * n, sync_free=sync_free, pack_update=pack_update)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, batch, *shape, generator=gen).to(device)
    y = torch.randint(0, num_classes, (n, batch), generator=gen).to(device)

    def amp():
        return (torch.autocast(device.type, dtype=autocast) if autocast is not None
                else contextlib.nullcontext())

    def separate():
        with amp():
            for i in range(n):
                loss = own[i](alone[i](x[i]), y[i])
                opts[i].zero_grad(set_to_none=True)
                loss.backward()
                opts[i].step()
                own[i].on_step_end(step=0, model=alone[i], optimizer=opts[i], batch=(x[i], y[i]))

    def packed_step():
        with amp(), (labels_checked() if stepper.sync_free else contextlib.nullcontext()):
            return stepper.step(x, y, 0)

    return Runs(separate, packed_step, stepper, x, y)


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def peak_memory_mb(fn: Callable[[], object], device: torch.device) -> tuple[float, str]:
    """Run ``fn()`` once; return (MB it added at its peak over what was allocated before, how).

    CUDA: ``torch.cuda.max_memory_allocated`` minus ``memory_allocated`` before (tensors only,
    not the caching allocator's reserve). CPU (Linux): the process's peak RSS (``VmHWM``, reset
    to the current RSS through ``/proc/self/clear_refs``) minus its RSS before; freed heap is
    first handed back (``malloc_trim``) so memory a previous measurement freed is not reused
    unseen. Run it in a fresh process for numbers that do not depend on what ran before."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20, "cuda max_memory_allocated delta"
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")   # Linux >= 4.0: peak RSS := current RSS
        before = _rss_kb("VmRSS")
        fn()
        return (_rss_kb("VmHWM") - before) / 1024, "peak RSS delta (VmHWM reset)"
    except OSError:   # no procfs: ru_maxrss never resets, so this is a lower bound
        import resource
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        fn()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, \
            "ru_maxrss delta (lower bound: no /proc/self/clear_refs)"


def warm_on_side_stream(fn: Callable[[], object], device: torch.device, calls: int = 3) -> None:
    """``calls`` calls of ``fn()`` on a side stream, then the current stream waits for them: the
    warm-up ``torch.cuda.graph`` requires before a capture (allocator, kernel choices)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(calls):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)


def graph_ms(fn: Callable[[], object], reps: int, device: torch.device) -> tuple[float | None, str]:
    """Capture ``fn()`` in a CUDA graph and time its replay: (median ms, "captured"), or
    (None, why not). Warm-up runs on a side stream, as ``torch.cuda.graph`` requires. A failed
    capture can leave the CUDA context unusable: call this last in a process."""
    if device.type != "cuda":
        return None, f"n/a ({device.type.upper()}: CUDA graphs need a CUDA device)"
    warm_on_side_stream(fn, device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:   # noqa: BLE001 -- any failure is the answer we record
        first = (str(exc).strip().splitlines() or [""])[0][:240]
        return None, f"capture failed: {type(exc).__name__}: {first}"
    return median_ms(graph.replay, reps, device), "captured"


def compare(make, shape, batch: int, n: int = 4, reps: int = 5,
            device: torch.device = torch.device("cpu")) -> tuple[float, float]:
    """(separate ms, packed ms) for one step of ``n`` runs of ``make()`` on ``[batch, *shape]``."""
    runs = build_runs(make, shape, batch, n, device)
    ms = interleaved_ms({"separate": runs.separate, "packed": runs.packed}, reps, device)
    return ms["separate"], ms["packed"]


def profile_steps(runs: Runs, device: torch.device, label: str, rows: int = 12) -> None:
    """Print the ops that take the time in one packed and one separate step (after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile
    runs.packed(), runs.separate()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for name, fn in (("packed", runs.packed), ("separate", runs.separate)):
        with profile(activities=activities) as prof:
            fn()
            _sync(device)
        print(f"== {label}: one {name} step\n" + prof.key_averages().table(
            sort_by=f"self_{'cuda' if device.type == 'cuda' else 'cpu'}_time_total", row_limit=rows), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, nargs="+", default=[4], help="pack sizes")
    ap.add_argument("--models", nargs="+", default=["mlp", "resnet18"], choices=["mlp", "resnet18"])
    ap.add_argument("--reps", type=int, default=None, help="timed steps (default 50 MLP, 5 ResNet)")
    ap.add_argument("--sync-free", action="store_true", help="the packed step in its sync-free mode")
    ap.add_argument("--profile", action="store_true",
                    help="instead of timing: torch.profiler's top ops of one packed and one separate step")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    cases = {"mlp": ("MLP 256x256, 64-d input, batch 64", lambda: MLP(2, [64]), [64], 64, 50),
             "resnet18": ("ResNet-18 ImageNet stem, 32x32, batch 64", lambda: resnet18(2, [3, 32, 32]),
                          [3, 32, 32], 64, 5)}
    for name in args.models:
        label, make, shape, batch, reps = cases[name]
        for n in args.n:
            if args.profile:
                profile_steps(build_runs(make, shape, batch, n, device, sync_free=args.sync_free), device,
                              f"{label}, N={n}" + (", sync-free" if args.sync_free else ""))
                continue
            sep, pk = compare(make, shape, batch, n=n, reps=args.reps or reps, device=device)
            print(f"{label} on {device}: N={n} separate {sep:.1f} ms, packed {pk:.1f} ms, "
                  f"packed/separate {pk / sep:.2f}", flush=True)


if __name__ == "__main__":
    main()
