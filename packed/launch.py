"""Train the jobs of a multirun as packs: :func:`train_packed` (used by ``hydra/launcher=packed``).

Each job is prepared exactly as ``train.py`` prepares it (:func:`run.prepare.prepare_run`: its seed,
split, imbalance, initial weights, objective), then jobs that can share a pack are trained as one
:class:`packed.PackedModels` by :class:`packed.PackedStep`; every job writes its own run folder
through :class:`run.job.Run` (``metrics.csv``, ``best.pt``, ``last.pt``, ``results.json``: the
schema of ``train.py``, plus a ``"packed"`` record and ``"diverged"``).

Grouping. Jobs share a pack when they agree on :data:`PACK_KEYS` and on the input shape and
number of classes their data give the model; everything else (objective, learning rate and
schedule, seed, imbalance, clipping, evaluation interval) is per run. The launcher logs the packs
and the keys that split them.

Batches. Each run draws from its own :class:`data.stream.BatchStream` (a pure function of its
seed and step, gathered on the device where its data live), so run ``i``'s batches are the
batches ``train.py`` gives the same config. Each run keeps its own torch RNG state (the state
``train.py`` would have, saved in its checkpoints; neither the stream nor evaluation draws from
it); the global numpy / python RNGs are shared (no objective draws from them during training).
A pack's data move to the device when the pack starts and are released when it ends, so device
memory holds one pack's runs, not the whole multirun's.

Divergence. A run whose scores or loss become non-finite, or whose evaluation interval had only
empty batches, is frozen (:class:`packed.PackedStep`) and its ``results.json`` records
``"diverged": {"step", "reason"}``; the other runs go on. ``train.py`` would stop such a run with
an error instead.

Deadline. ``train_packed(..., deadline=t)`` (a :func:`time.monotonic` time, e.g. a GPU slot's end)
stops a pack at the first step boundary past ``t`` (after at least one step): each live run is
evaluated there unless it just was, and its ``results.json`` records
``"stopped": {"step", "reason": "deadline"}``, so a
table never pools it with full-length runs (its final step differs); packs not started by ``t``
are not run (their outcome is a :class:`PackedLaunchError`).

Memory. A pack whose training step runs out of device memory (``torch.OutOfMemoryError``) before
its first evaluation is split in two halves, which are trained one after the other (and split
again if needed); each run restarts from a fresh model with its initial weights and objective
state (kept on the CPU), with the aborted steps' losses and diagnostics dropped, so the result is
the run it would have been. A single run that does not fit is recorded as not run.

Host syncs. ``sync_free`` (default: on where the runs are on CUDA) steps the packs with
:class:`packed.PackedStep`'s sync-free mode: losses and divergence flags stay on the device and
are read at the steps where some run evaluates (one sync there, not one per run and step); each
run's train labels are range-checked once when its pack starts, not per batch
(:func:`objectives.common.labels_checked`). The numbers are the eager mode's (tested equal);
only a diverged run's weights after its divergence step differ (see :mod:`packed.step`).

CUDA graphs. ``cuda_graph=True`` (``hydra.launcher.cuda_graph=true``) replays each pack whose
runs can all be captured (``ce``, ``auc_lp``, ``ppd_sg``, ``ppd_adagrad``: :func:`packed.graph.capturable`)
from a CUDA graph (:class:`packed.graph.GraphedStep`); other packs step eagerly and the log says
why. Off by default until a GPU run has measured it in the launcher (the captured ``ce`` step
itself was checked on an H100: ``results/packed_bench/gpu_h100/``).

On CUDA, whether captured or not, a pack trains ``auc_lp`` in its dense, capture-safe form (same
loss and gradient, no host sync: :func:`packed.graph.capture_form`) and steps plain-SGD runs with
one pack-wide update (:class:`packed.optim.PackedSGD`); ``results.json``'s ``"packed"`` record
says which (``capture_safe_objective``, ``pack_update``).

Evaluation. Runs of a pack that evaluate at the same step get their logits from one pass of the
pack over the evaluation sets (:class:`packed.evaluate.PackEvaluator`: the pack's forward on every
run's batch at once, in both BatchNorm modes), then their metrics, rows and checkpoints from
:meth:`run.job.Run.evaluate` as alone; the rows equal per-run evaluation's (bit for bit on the CPU,
``tests/test_packed_evaluate.py``). ``batched_eval=False`` evaluates run by run; ``results.json``'s
``"packed"`` record counts the predict calls served each way (``evaluation``).

Forward mode. ``mode`` (default ``"auto"``: ``vmap`` on CUDA, ``loop`` on the CPU) is the
:class:`packed.model.PackedModels` mode of every pack, e.g. the one a window's selector chose
(:mod:`packed.select`); a pack that cannot take it (``gemm`` for a non-ResNet) falls back to
``auto`` with a warning. ``results.json``'s ``"packed"`` record names it (``mode``).
``fused_update`` (default ``False``) is :class:`packed.optim.PackedSGD`'s ``fused`` for packs
that take the pack-wide update (``"auto"``: the one compiled pass where it compiles); the record's
``update_note`` says which update ran.

Limits: ``resume=true`` is refused (resume a packed run's folder with ``train.py resume=true``:
its ``last.pt`` holds the run's own RNG state); all runs of a pack stop at the same
``trainer.max_steps``; each run holds its own copy of its splits on the device (runs of one
dataset do not share the source images yet).
"""
from __future__ import annotations

import contextlib
import copy
import gc
import logging
import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from lpmetrics.run.builders import autocast_dtype, build_model, built, resolve_device
from lpmetrics.data.stream import BatchStream
from lpmetrics.run.runfolder import _flatten
from lpmetrics.run.guards import DegenerateBatchesError
from lpmetrics.run.job import Run
from lpmetrics.run.prepare import prepare_run
from lpmetrics.run.rng import rng_state
from lpmetrics.run.validate import validate
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed.evaluate import PackEvaluator
from lpmetrics.packed.graph import GraphedStep, capturable, capture_form
from lpmetrics.packed.model import PackError, pack
from lpmetrics.packed.step import Divergence, PackedStep

log = logging.getLogger(__name__)

#: Config keys that must be equal within a pack (one architecture, one batch shape, one length,
#: one precision, one optimizer family, one device); ``input_shape`` and ``num_classes`` (from the data) too.
PACK_KEYS = ("dataset.name", "dataset.task", "model", "trainer.batch_size", "trainer.max_steps",
             "trainer.precision", "optimizer._target_", "device")


class PackedLaunchError(ValueError):
    """A job the packed launcher cannot run (e.g. ``resume=true``)."""


@dataclass
class Job:
    """One job of the multirun: its composed config, run folder, Hydra choices and a label."""
    cfg: DictConfig
    run_dir: Path
    choices: dict = field(default_factory=dict)
    name: str = ""


@dataclass
class _Member:
    job: Job
    run: Run
    rng: torch.Tensor   # the run's own torch RNG state (for its evaluations)
    stream: Any = None  # its data.stream.BatchStream
    initial: dict = field(default_factory=dict)   # CPU copies of the initial model / objective states
    losses: list = field(default_factory=list)   # training losses since its last evaluation


def pack_key(cfg: DictConfig, run: Run) -> dict[str, Any]:
    """The values a job must share with its pack mates."""
    key: dict[str, Any] = {}
    for k in PACK_KEYS:   # a group (``model``) by its leaves, so the log names ``model.hidden``
        value = OmegaConf.select(cfg, k)
        if isinstance(value, DictConfig):
            key.update({f"{k}.{leaf}": v for leaf, v in _flatten(OmegaConf.to_container(value, resolve=True)).items()})
        else:
            key[k] = value
    key["input_shape"] = list(run.bundle.input_shape)
    key["num_classes"] = run.bundle.num_classes
    return key


def group(keys: list[dict[str, Any]], max_pack: int | None = None) -> tuple[list[list[int]], list[str]]:
    """Job indices grouped by equal key (in order of first appearance, chunks of at most
    ``max_pack``), and the key names whose values differ between jobs."""
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(repr(sorted(key.items())), []).append(i)
    packs = [g[s:s + max_pack] if max_pack else g for g in groups.values()
             for s in range(0, len(g), max_pack or len(g))]
    differing = [k for k in keys[0] if any(key[k] != keys[0][k] for key in keys)] if keys else []
    return packs, differing


def _describe(keys: list[dict[str, Any]], packs: list[list[int]], differing: list[str],
              jobs: list[Job]) -> str:
    lines = [f"packed launcher: {len(jobs)} jobs in {len(packs)} pack(s)"]
    if differing:
        lines.append("  split on: " + ", ".join(
            f"{k} ({' vs '.join(dict.fromkeys(str(keys[p[0]][k]) for p in packs))})" for k in differing))
    for n, p in enumerate(packs):
        lines.append(f"  pack {n} ({len(p)} runs): " + "; ".join(jobs[i].name or str(i) for i in p))
    return "\n".join(lines)


def train_packed(jobs: list[Job], max_pack: int | None = None, deadline: float | None = None,
                 sync_free: bool | None = None, cuda_graph: bool = False,
                 batched_eval: bool = True, mode: str = "auto", fused_update: bool | str = False) -> list[Any]:
    """Train ``jobs`` as packs; returns per job its ``results.json`` dict or the exception that
    stopped its preparation (bad config, missing data, an optimizer that cannot be built) or its
    pack's training (every run of that pack gets it), in the jobs' order; the other jobs run (as under Hydra's basic launcher, the multirun then
    exits with the first failed job's error). ``deadline``, ``sync_free`` (``None``: on for
    packs on CUDA), ``cuda_graph``, ``batched_eval``, ``mode``, ``fused_update``: see the module docstring."""
    outcomes: list[Any] = [None] * len(jobs)
    members: dict[int, _Member] = {}
    for i, job in enumerate(jobs):
        try:
            if job.cfg.resume:
                raise PackedLaunchError(f"{job.name}: resume={job.cfg.resume} is not packed; resume "
                                        "this run folder with `python train.py resume=true ...`")
            if job.cfg.trainer.optimizer_impl != "eager":
                raise PackedLaunchError(f"{job.name}: trainer.optimizer_impl={job.cfg.trainer.optimizer_impl} "
                                        "is a single run's option (a pack steps all its runs in one update "
                                        "of its own: see fused_update); set trainer.optimizer_impl=eager")
            validate(job.cfg)
            device = resolve_device(job.cfg.device)
            run, _ = prepare_run(job.cfg, job.run_dir, device)
            run.attach_optimizer()   # a bad optimizer config fails this job now, not its pack
        except Exception as err:   # as Hydra's run_job: this job fails, the others still run
            log.error(f"{job.name}: not run: {type(err).__name__}: {err}")
            outcomes[i] = err
            continue
        members[i] = _Member(job, run, torch.get_rng_state(), initial={
            "model": _to_cpu(run.model.state_dict()), "objective": _to_cpu(run.objective.state_dict())})
        run.model = run.optimizer = run.scheduler = None   # rebuilt when its pack starts
    order = list(members)
    keys = [pack_key(members[i].job.cfg, members[i].run) for i in order]
    packs, differing = group(keys, max_pack)
    log.info(_describe(keys, packs, differing, [members[i].job for i in order]))
    devices = {str(m.run.device) for m in members.values()}
    if devices == {"cpu"}:
        log.warning("packed launcher: no CUDA device in use; the packs run on the CPU, where a "
                    "packed step costs 1.1-1.2x the separate steps (results/packed_bench/cpu_loop_mode/): "
                    "packing is meant for GPUs")
    queue = list(packs)
    while queue:
        p = queue.pop(0)
        if deadline is not None and time.monotonic() >= deadline:
            for i in p:
                outcomes[order[i]] = PackedLaunchError(f"{members[order[i]].job.name}: not started, "
                                                       "the deadline had passed")
            log.warning(f"packed launcher: deadline passed; {len(p)} run(s) of a pack not started")
            continue
        pack_members = [members[order[j]] for j in p]
        oom = None
        try:
            for i, results in zip(p, _train_pack(pack_members, deadline, sync_free, cuda_graph, batched_eval,
                                                  mode, fused_update)):
                outcomes[order[i]] = results
        except torch.OutOfMemoryError as err:
            if any(m.run.rows for m in pack_members):   # evaluated already: not restartable
                raise
            oom = str(err)
        except Exception as err:   # noqa: BLE001 -- this pack's runs fail, the other packs still run
            log.exception(f"packed launcher: a pack of {len(p)} run(s) failed: {type(err).__name__}: {err}")
            traceback.clear_frames(err.__traceback__)   # its frames hold the pack (device memory)
            err.__traceback__ = None
            for j in p:
                outcomes[order[j]] = err
        _release(pack_members)   # outside the except block: its traceback holds the pack
        if oom is None:
            continue
        if len(p) == 1:
            outcomes[order[p[0]]] = PackedLaunchError(
                f"{pack_members[0].job.name}: does not fit the device memory even alone ({oom})")
            log.error(str(outcomes[order[p[0]]]))
            continue
        half = len(p) // 2
        log.warning(f"packed launcher: a pack of {len(p)} runs is out of memory; trying packs of "
                    f"{half} and {len(p) - half}")
        queue[:0] = [p[:half], p[half:]]
    return outcomes


def _to_cpu(state: dict) -> dict:
    return {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else copy.deepcopy(v)
            for k, v in state.items()}


def _release(members: list[_Member]) -> None:
    """Drop a finished or failed pack's references (optimizers and models alias its storage;
    the data go back to the host) and return its device memory."""
    for m in members:
        m.run.optimizer = m.run.scheduler = m.stream = None
        m.run.model = None
        m.run.bundle.to("cpu")
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _fresh(m: _Member) -> None:
    """The run as :func:`run.prepare.prepare_run` left it: a new model with its initial weights, its
    initial objective state, its data on the device, and no record of steps of an aborted pack."""
    run = m.run
    run.bundle.to(run.device)
    run.model = built("model", run.cfg, lambda: build_model(run.cfg, run.bundle)).to(run.device)
    run.model.load_state_dict(m.initial["model"])
    run.objective.load_state_dict(m.initial["objective"])
    run.objective.pop_stats()
    m.losses = []


def _draw(members: list[_Member], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each run's next batch from its own stream, stacked ``[N, B, ...]`` on ``device``, in the
    standard (contiguous) layout: the image packs store NHWC, so their batches come as
    channels-last views, and under ``vmap`` on CUDA a pack of one then fails in batch norm
    ("querying is_contiguous inside of vmap ...", the second H100 window); the copy is 0.8 MB
    per run-step of CIFAR-10 (the probe, ``gpu_tables.measure``, times contiguous batches too)."""
    xs, ys = zip(*(next(m.stream) for m in members))
    return torch.stack(xs).to(device).contiguous(), torch.stack(ys).to(device)


def step_runner(stepper: PackedStep, cuda_graph: bool, device: torch.device, n: int):
    """The pack's stepper, or its CUDA-graph replay (:mod:`packed.graph`) where asked and possible
    (also what the campaign's probe times: ``scripts/gpu_tables.measure``)."""
    if not cuda_graph:
        return stepper
    why = "not on CUDA" if device.type != "cuda" else capturable(stepper)
    if why:
        log.warning(f"pack of {n}: no CUDA graph ({why}); eager steps")
        return stepper
    log.info(f"pack of {n}: steps replayed from a CUDA graph")
    return GraphedStep(stepper)


def _check_train_labels(m: _Member) -> None:
    """The range check :func:`objectives.common.check_labels` makes per batch, once for the
    whole train split (the sync-free step skips the per-batch one)."""
    labels = m.run.bundle.train.labels
    k = max(2, m.run.bundle.num_classes)
    if len(labels) and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"{m.job.name}: train labels lie in {labels.min()}..{labels.max()}, not in "
                         f"0..{k - 1}: relabel the data (binary tasks: 0 = negative, 1 = positive)")


class _LossLog:
    """Each step's losses ``[N]``, moved to the runs' lists in one read (sync-free mode: at the
    steps where a run evaluates; eager mode: every step)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, torch.Tensor]] = []
        self.warned: set[int] = set()

    def add(self, step: int, losses: torch.Tensor) -> None:
        self.rows.append((step, losses))

    def flush(self, members: list[_Member], stepper: PackedStep) -> None:
        """Poll the divergence flags, then give every run its losses of the steps before its
        divergence (the eager mode's lists, value for value)."""
        stepper.poll()
        for i in sorted(set(stepper.divergences) - self.warned):
            self.warned.add(i)
            div = stepper.divergences[i]
            if div.reason.startswith("DegenerateBatchesError"):
                continue   # _evaluate logged it
            log.warning(f"{members[i].job.name}: diverged at step {div.step}: {div.reason}; "
                        "frozen, the other runs go on")
        if not self.rows:
            return
        values = torch.stack([v for _, v in self.rows]).tolist()
        for (step, _), row in zip(self.rows, values):
            for i, m in enumerate(members):
                div = stepper.divergences.get(i)
                if div is None or step + 1 < div.step:
                    m.losses.append(row[i])
        self.rows = []


def _evaluate(m: _Member, i: int, step: int, stepper: PackedStep, times: dict, predict_fn=None) -> None:
    """``train.py``'s evaluation of run ``i`` (its logits from ``predict_fn``, default
    :func:`builders.predict`); an all-empty interval freezes it (recorded)."""
    torch.set_rng_state(m.rng)   # the run's own state, as train.py's checkpoint holds it
    try:
        m.run.evaluate(step, m.losses, times, rng_state, predict_fn=predict_fn)
    except DegenerateBatchesError as err:
        stepper.divergences[i] = Divergence(step, f"DegenerateBatchesError: {err}")
        log.warning(f"{m.job.name}: stopped at step {step}: {err}")
    finally:
        m.rng = torch.get_rng_state()
    m.losses = []


def _evaluate_runs(members: list[_Member], due: list[int], step: int, stepper: PackedStep,
                   times: dict, evaluator: PackEvaluator) -> None:
    """:func:`_evaluate` of the live runs among ``due``, their logits from one pass of the pack
    where the evaluator can (:class:`packed.evaluate.PackEvaluator`)."""
    live = [i for i in due if i not in stepper.divergences]
    with evaluator.serving({i: members[i].run for i in live}) as predict_fn:
        for i in live:
            _evaluate(members[i], i, step, stepper, times, predict_fn)


def _train_pack(members: list[_Member], deadline: float | None = None,
                sync_free: bool | None = None, cuda_graph: bool = False,
                batched_eval: bool = True, mode: str = "auto",
                fused_update: bool | str = False) -> list[dict[str, Any]]:
    runs = [m.run for m in members]
    n, max_steps, device = len(runs), runs[0].cfg.trainer.max_steps, runs[0].device
    sync_free = device.type == "cuda" if sync_free is None else bool(sync_free)
    if sync_free:
        for m in members:
            _check_train_labels(m)
    for m in members:
        _fresh(m)
    swapped = []   # runs whose objective trains in its capture-safe form (CUDA; same loss and gradient)
    for m in members:
        form = capture_form(m.run.objective, device)
        swapped.append(form is not m.run.objective)
        m.run.objective = form
    try:
        packed = pack([r.model for r in runs], mode)
    except PackError as err:   # a mode chosen on another pack (gemm: ResNets only)
        if mode == "auto":
            raise
        log.warning(f"pack of {n}: mode={mode!r} does not fit this pack ({err}); mode='auto'")
        packed = pack([r.model for r in runs])
    for m, view in zip(members, packed.models):
        m.run.attach_optimizer(view)
        m.run.logger = instantiate(m.run.cfg.logger, _partial_=True)(run_dir=str(m.run.run_dir),
                                                                     config=m.run.resolved)
        m.stream = BatchStream(m.run.bundle.train, m.run.cfg.trainer.batch_size, m.run.cfg.seed)
    stepper = PackedStep(packed, [r.objective for r in runs], [r.optimizer for r in runs],
                         [r.scheduler for r in runs], [r.cfg.trainer.max_grad_norm for r in runs],
                         sync_free=sync_free, autocast=autocast_dtype(runs[0].cfg), fused_update=fused_update)
    log.info(f"pack of {n}: optimizer update: {stepper.update_note}"
             + (f"; {sum(swapped)} objective(s) in their capture-safe form" if any(swapped) else ""))
    runner = step_runner(stepper, cuda_graph, device, n)
    evaluator = PackEvaluator(packed, device, enabled=batched_eval)
    log.info(f"pack of {n}: evaluation: {evaluator.note}"
             + (f"; BN-train evaluations per run ({evaluator.no_bn_train})" if evaluator.no_bn_train else ""))
    times: dict[str, list[float]] = {"data": [], "step": []}
    stopped = None
    loss_log = _LossLog()
    packed.train()
    wall0, eval_s = time.perf_counter(), 0.0
    try:
        with labels_checked() if sync_free else contextlib.nullcontext():
            for step in tqdm(range(max_steps), desc=f"pack of {n}", dynamic_ncols=True, mininterval=2.0):
                if deadline is not None and step > 0 and time.monotonic() >= deadline:
                    loss_log.flush(members, stepper)
                    t2 = time.perf_counter()
                    last = [i for i, m in enumerate(members)   # a last evaluation where there was none
                            if not m.run.rows or m.run.rows[-1]["step"] != step]
                    _evaluate_runs(members, last, step, stepper, times, evaluator)
                    eval_s += time.perf_counter() - t2
                    stopped = {"step": step, "reason": "deadline"}
                    log.warning(f"pack of {n}: deadline reached, stopped at step {step} of {max_steps}")
                    break
                t0 = time.perf_counter()
                x, y = _draw(members, device)
                t1 = time.perf_counter()
                losses = runner.step(x, y, step).losses
                times["data"].append(1000 * (t1 - t0))
                times["step"].append(1000 * (time.perf_counter() - t1))
                due = [i for i, m in enumerate(members)
                       if (step + 1) % m.run.cfg.trainer.eval_every == 0 or step + 1 == max_steps]
                loss_log.add(step, losses)
                if due or not sync_free:   # eager: the losses are read every step anyway
                    loss_log.flush(members, stepper)
                t2 = time.perf_counter()
                _evaluate_runs(members, due, step + 1, stepper, times, evaluator)
                eval_s += time.perf_counter() - t2
            loss_log.flush(members, stepper)
            # per run: the pack's medians shared out; pack_*: the whole pack's step. Sync-free on
            # CUDA the per-step times are host (enqueue) times; pack_wall_ms_per_step is the wall
            # time of the steps taken, evaluations excluded, which includes the device's lag.
            per_run = {k: statistics.median(v) / n for k, v in times.items()}
            taken = len(times["step"])
            timing = {**per_run, "step": sum(per_run.values()),
                      **{f"pack_{k}": statistics.median(v) for k, v in times.items()},
                      "pack_wall_ms_per_step": 1000 * (time.perf_counter() - wall0 - eval_s) / max(1, taken)}
            out = []
            for i, m in enumerate(members):
                div = stepper.divergences.get(i)
                packed_record = {"size": n, "index": i, "sync_free": sync_free,
                                 "pack_update": stepper.update is not None,
                                 "update_note": stepper.update_note,
                                 "mode": packed.mode,
                                 "capture_safe_objective": swapped[i],
                                 "evaluation": {"note": evaluator.note, "batched_predicts": evaluator.served,
                                                "per_run_predicts": evaluator.missed}}
                out.append(m.run.results(timing, m.job.choices, packed=packed_record,
                                         diverged={"step": div.step, "reason": div.reason} if div else None,
                                         stopped=stopped))
                if m.run.rows:
                    m.run.logger.summary({f"final/{k}": v for k, v in m.run.rows[-1].items()})
            return out
    finally:
        for run in runs:
            if run.logger is not None:
                run.logger.finish()
