"""Train a network on a (non-decomposable) objective: ``python train.py objective=auc_lp dataset=cifar10``.

A plain, iteration-based loop (no Lightning: the min-max and bilevel baselines need control over
their updates). Every component comes from the config through ``_target_``; objectives plug in
with ``loss = objective(logits, labels)`` plus the optional hooks of :class:`objectives.base.Objective`,
so this file never branches on which objective runs.

Writes into Hydra's run folder (:mod:`runfolder`; every file atomically, so a killed run never
leaves a half-written one): ``metrics.csv`` (one row per evaluation; test in both BatchNorm
modes, :func:`evaluate`), ``results.json`` (final and best-val metrics, split statistics, step
timings, degenerate-batch fraction, launches, portable config, code version and machine:
:mod:`provenance`), ``last.pt`` (checkpoint at every evaluation, the previous one kept as
``last.prev.pt``; ``resume=true`` continues from it if the config matches, ``resume=force`` even
if not) and ``best.pt`` (weights of the best validation evaluation).

Bad input stops early with a message naming the key, the value and a fix (:mod:`validate`), and
:func:`main` reports these errors without a traceback. During training a non-finite score or loss
stops with :class:`NonFiniteLossError` (step, batch summary, lr hint) before the objective's
solver sees it; an evaluation interval whose batches were all empty for the objective (nothing to
compare: a zero loss) stops with :class:`DegenerateBatchesError`, and more than 10 % degenerate
batches warn.
"""
from __future__ import annotations

import math
import os
import random
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from lpmetrics import metrics
from lpmetrics.run import provenance
from lpmetrics.run import runfolder
from lpmetrics.run.builders import (autocast_dtype, build_model, build_scheduler, instantiate_runtime, predict,
                      resolve_device, runtime_values)
from lpmetrics.data import build_data
from lpmetrics.data.stream import STREAM_VERSION, BatchStream
from lpmetrics.data.errors import DamagedDatasetError, DatasetNotFoundError, SplitError
from lpmetrics.objectives.base import draws_batches
from lpmetrics.run.guards import (DegenerateBatchesError, DegenerateBatchesWarning, NonFiniteLossError,  # noqa: F401
                    check_degenerate, degenerate_summary, nonfinite_message)
from lpmetrics.run.validate import ConfigError, validate

PRIMARY_METRIC = {"binary": "auc", "multiclass": "auc_mu"}
TIMED_PHASES = ("data", "forward", "loss", "backward", "optimizer")
#: seed offset of the side stream, the second batch stream of the train split that an objective
#: declaring ``on_step_end(draw_batch=...)`` samples (the learned surrogate's K_beta steps,
#: Algorithm 1 line 9). A stream of its own, so the main stream, and every other objective's run,
#: is unchanged; a pure function of ``(seed, its step)`` like the main one, so resumes and reruns
#: repeat it. The offset is far from any run seed: the side stream of seed s is the main stream
#: of seed s + 10**6, which no run uses, and its shuffles (generator ``seed * 100003 + epoch``)
#: meet a main stream's of a seed below s + 10**6 only past that stream's epoch 100003
SIDE_STREAM_SEED_OFFSET = 10**6


class CheckpointFallbackWarning(UserWarning):
    """``last.pt`` could not be read; the run resumed from ``last.prev.pt``."""


class StreamChangeWarning(UserWarning):
    """The run being resumed started with another batch stream (data/stream.py's history)."""


class RunError(CompactHydraException):
    """A user error (bad config, missing or damaged data, refused resume, divergence): Hydra
    prints its message alone, without a traceback (``HYDRA_FULL_ERROR=1`` shows it)."""


USER_ERRORS = (ConfigError, runfolder.ResumeConfigError, runfolder.CheckpointError,
               DatasetNotFoundError, DamagedDatasetError, SplitError, NonFiniteLossError,
               DegenerateBatchesError)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


#: key prefix of the test metrics in the BatchNorm mode other than ``trainer.eval_bn``
#: (``test_bntrain_auc`` beside ``test_auc``): the names ``eval.py --bn-mode train`` and
#: ``scripts/summarize_runs.py`` give the authors' evaluation
OTHER_BN_PREFIX = {"train": "bntrain_", "eval": "bneval_"}


def evaluate(model, bundle, split: str, cfg: DictConfig, device,
             predict_fn: Callable | None = None) -> dict[str, float]:
    """Metrics of ``split`` with BatchNorm in the ``trainer.eval_bn`` mode (batches of
    ``trainer.eval_batch_size``); for ``test`` also in the other mode, under the keys
    ``bntrain_<metric>`` (batches of ``trainer.bntrain_batch_size``: the authors' evaluation,
    binary_auc.py of zihangm/nondecomposable-as-lp) or, for an ``eval_bn=train`` run,
    ``bneval_<metric>``. A run records both because it cannot recover either later without its
    checkpoints. Neither mode touches the model's running statistics, its mode or any global RNG
    (:func:`builders.predict`), so the training trajectory is the same as without the second.
    ``predict_fn`` (default :func:`builders.predict`) gives the logits: the packed launcher passes
    one that serves a whole pack's logits from one pass (:mod:`packed.evaluate`)."""
    own = cfg.trainer.get("eval_bn", "eval")
    fn = predict_fn or predict
    out = _scored(fn, model, bundle, split, device, own, cfg.trainer.eval_batch_size)
    if split == "test":
        other = "eval" if own == "train" else "train"
        batch = cfg.trainer.get("bntrain_batch_size", 32) if other == "train" else cfg.trainer.eval_batch_size
        out |= {OTHER_BN_PREFIX[other] + k: v for k, v in _scored(fn, model, bundle, split, device, other, batch).items()}
    return out


def _scored(predict_fn: Callable, model, bundle, split: str, device, bn_mode: str, batch_size: int) -> dict[str, float]:
    logits, labels = predict_fn(model, getattr(bundle, split), batch_size=batch_size, device=device, bn_mode=bn_mode)
    return metrics.evaluate(labels, logits, bundle.task)


def rng_state() -> dict[str, Any]:
    """The global RNGs' states as a ``weights_only`` load reads them (:mod:`runfolder`): numpy's
    MT19937 key, a uint32 array, as an int64 tensor; python's is a tuple of ints already."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (kind, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(gauss))}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`'s states (an older checkpoint's numpy key array as well).  The
    generators take CPU byte tensors, whatever device the checkpoint was mapped to."""
    torch.set_rng_state(state["torch"].cpu())
    kind, key, *rest = state["numpy"]
    key = key.cpu() if torch.is_tensor(key) else key
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), *rest))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


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


def init_weights(model: torch.nn.Module, path: Path, device: torch.device, trust: bool = False) -> None:
    """Start from the model weights of another run's checkpoint (``trainer.init_from``), e.g.
    fine-tune a cross-entropy run on an LP objective.  Only the weights are taken: optimizer,
    schedule and step count start afresh.  ``trust``: ``trainer.trust_checkpoint``
    (:func:`runfolder.torch_load`; without it an old-format file raises
    :class:`runfolder.UnsafeCheckpointError`)."""
    if not path.is_file():
        raise FileNotFoundError(f"trainer.init_from={path} does not exist; give a last.pt / best.pt "
                                "of an earlier run (same dataset.task and model)")
    state = runfolder.torch_load(path, map_location=device, trust=trust)
    model.load_state_dict(state["model"] if "model" in state else state)


def built(key: str, cfg: DictConfig, make: Callable[[], Any]) -> Any:
    """``make()``, turning Hydra's wrapped constructor error into a :class:`ConfigError` naming
    the config group (``objective.epsilon=inf`` -> "objective could not be built ...")."""
    try:
        return make()
    except InstantiationException as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        target = OmegaConf.select(cfg, f"{key}._target_")
        raise ConfigError(f"{key} could not be built from the config ({key}._target_={target}): "
                          f"{type(cause).__name__}: {cause}") from err


def resume_from(cfg: DictConfig, run_dir: Path, resolved: dict, device) -> tuple[dict, dict]:
    """The checkpoint to continue from and this launch's record; refuses a differing config."""
    ckpt, path, note = runfolder.load_checkpoint(run_dir, map_location=device,
                                                 trust=cfg.trainer.get("trust_checkpoint", False))
    diffs = runfolder.config_differences(ckpt["config"], resolved)
    runfolder.restore_hydra_files(run_dir, ckpt.get("hydra_files") or {}, ckpt["step"])
    if diffs and cfg.resume != "force":
        raise runfolder.ResumeConfigError(runfolder.resume_mismatch_message(run_dir, diffs))
    if note:
        warnings.warn(note, CheckpointFallbackWarning, stacklevel=2)
    first = (ckpt.get("launches") or [{}])[0].get("batch_stream", "per-image-global-rng-v1")
    if first != STREAM_VERSION:
        warnings.warn(f"{run_dir} started with batch stream {first}; it goes on with {STREAM_VERSION} "
                      "(same shuffling, other crops and flips: data/stream.py), so its batches "
                      "from step " f"{ckpt['step']} on differ from an uninterrupted old run's",
                      StreamChangeWarning, stacklevel=2)
    launch = {"start_step": ckpt["step"], "resume": cfg.resume, "checkpoint": path.name,
              "batch_stream": STREAM_VERSION, "git_commit": provenance.code_version()[0],
              # results.json stays portable: the note without the run folder's absolute path
              "fallback": note.replace(f"{run_dir}{os.sep}", "") or None,
              "forced_differences": diffs or None}
    return ckpt, launch


@dataclass
class Run:
    """One training job: its components and its record. ``train.py``'s loop drives one; the packed
    launcher (:mod:`packed.launch`) drives many in one process, through the same methods, so both
    write the same run folder (``metrics.csv``, ``best.pt``, ``last.pt``, ``results.json``)."""

    cfg: DictConfig
    run_dir: Path
    device: torch.device
    resolved: dict
    bundle: Any
    model: torch.nn.Module
    objective: Any
    launches: list
    hydra_files: dict
    optimizer: Any = None
    scheduler: Any = None
    logger: Any = None
    rows: list = field(default_factory=list)
    best: dict | None = None
    ckpt_step: int | None = None
    #: the side stream (:data:`SIDE_STREAM_SEED_OFFSET`) where the objective draws batches; its
    #: position is checkpointed so a resumed run draws what the uninterrupted one would
    side_stream: Any = None

    @property
    def primary(self) -> str:
        return PRIMARY_METRIC[self.bundle.task]

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """``("val", "test")``; ``("test",)`` when the split holds no validation data out
        (``dataset.split=authors``): then no ``val_*`` metrics, no best-val selection (``best_val``
        null, no ``best.pt``), and nothing ever selects on test in its place."""
        return ("val", "test") if len(self.bundle.val) else ("test",)

    def attach_optimizer(self, model: torch.nn.Module | None = None) -> None:
        """Build the optimizer and schedule over ``model`` (default: the run's own; the packed
        launcher passes the run's view into the packed storage)."""
        cfg, self.model = self.cfg, model if model is not None else self.model
        param_groups = [{"params": list(self.model.parameters())}] + self.objective.extra_param_groups()
        self.optimizer = built("optimizer", cfg,
                               lambda: instantiate(cfg.optimizer, _partial_=True)(params=param_groups))
        self.scheduler = build_scheduler(cfg.scheduler, self.optimizer)

    def evaluate(self, step: int, losses: list[float], timings: dict,
                 rng: Callable[[], dict] | None = None, predict_fn: Callable | None = None) -> dict[str, Any]:
        """Evaluate at ``step``, append the row and write metrics, best and last checkpoint.

        ``rng`` (default :func:`rng_state`) is called after the evaluation: the checkpoint holds
        the RNG state the next training step starts from. ``predict_fn``: see :func:`evaluate`.

        Raises :class:`DegenerateBatchesError` if the interval's batches were all degenerate."""
        cfg, run_dir = self.cfg, self.run_dir
        row = {"step": step, "lr": self.optimizer.param_groups[0]["lr"],
               "train_loss": statistics.fmean(losses) if losses else math.nan}
        for split in self.eval_splits:
            row.update({f"{split}_{k}": v
                        for k, v in evaluate(self.model, self.bundle, split, cfg, self.device, predict_fn).items()})
        row.update(self.objective.pop_stats())
        check_degenerate(row, (self.rows[-1]["step"] if self.rows else 0) + 1, cfg,
                         self.bundle.stats["train"]["class_counts"])
        self.rows.append(row)
        self.logger.log(row, step=step)
        # order: metrics, best, last; a kill between them replays the interval on resume
        runfolder.write_metrics_csv(self.rows, run_dir / runfolder.METRICS)
        key = f"val_{self.primary}"
        keep = cfg.trainer.get("checkpoints", True)
        if key in row and (self.best is None or row[key] > self.best[key]):
            self.best = dict(row)
            if keep:
                runfolder.save_best({"step": step, "model": self.model.state_dict(), "config": self.resolved},
                                    run_dir)
        if not keep:   # trainer.checkpoints=false: metrics only
            return row
        runfolder.save_checkpoint(
            {"step": step, "model": self.model.state_dict(), "objective": self.objective.state_dict(),
             "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
             "rows": self.rows, "best": self.best, "timings": timings, "rng": (rng or rng_state)(),
             "config": self.resolved, "launches": self.launches, "hydra_files": self.hydra_files,
             **({"side_stream_step": self.side_stream.step} if self.side_stream is not None else {})},
            run_dir)
        self.ckpt_step = step
        return row

    def results(self, timing_ms: dict, choices: dict | None, **extra: Any) -> dict[str, Any]:
        """Write ``results.json`` (``extra`` keys are added, e.g. the packed launcher's record)."""
        results = {
            "primary_metric": self.primary,
            "final": self.rows[-1] if self.rows else None,
            "best_val": self.best,
            "splits": self.bundle.stats,
            "degenerate_batches": degenerate_summary(self.rows),
            "timing_ms_median": timing_ms,
            "device": str(self.device),
            "choices": dict(choices or {}),
            "launches": self.launches,
            "resume_forced": any(la.get("forced_differences") for la in self.launches),
            "config": runfolder.portable_config(self.cfg, self.run_dir),
            "batch_stream": STREAM_VERSION,
            "provenance": provenance.record(self.device),   # code version and machine
            **extra,
        }
        if "val" not in self.eval_splits:
            results["val_split"] = (f"none: dataset.split={self.cfg.dataset.get('split')} holds no "
                                    "validation data out, so there are no val metrics, best_val is "
                                    "null and no best.pt is written; final is the last evaluation "
                                    "and nothing is selected on test")
        runfolder.write_results(results, self.run_dir)
        return results


def prepare_run(cfg: DictConfig, run_dir: Path, device: torch.device) -> tuple[Run, dict | None]:
    """The run folder, data, model and objective of one job, built in ``train.py``'s order from
    its seed (so the same config gives the same split and initial weights wherever it is built),
    and the checkpoint to resume from (``None`` unless ``resume``). No optimizer yet:
    :meth:`Run.attach_optimizer`."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    runfolder.remove_stray_temporaries(run_dir)   # left by a writer that was killed
    ckpt, launch = resume_from(cfg, run_dir, resolved, device) if cfg.resume else \
        (None, {"start_step": 0, "resume": cfg.resume, "batch_stream": STREAM_VERSION,
                "git_commit": provenance.code_version()[0]})   # a resume may run other code
    seed_everything(cfg.seed)
    bundle = build_data(cfg.dataset, seed=cfg.seed)
    validate(cfg, bundle)
    runtime = runtime_values(bundle)
    model = built("model", cfg, lambda: build_model(cfg, bundle)).to(device)
    if cfg.trainer.get("init_from") and not cfg.resume:   # a resumed run has its own weights
        init_weights(model, Path(cfg.trainer.init_from), device, cfg.trainer.get("trust_checkpoint", False))
    objective = built("objective", cfg, lambda: instantiate_runtime(cfg.objective, **runtime)).to(device)
    launches = list(ckpt.get("launches", [])) if ckpt is not None else []
    hydra_files = (ckpt.get("hydra_files") if ckpt is not None else None) or runfolder.hydra_files(run_dir)
    return Run(cfg, run_dir, device, resolved, bundle, model, objective, launches + [launch],
               hydra_files), ckpt


def train(cfg: DictConfig, run_dir: Path, choices: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one training job into ``run_dir``; returns the content of ``results.json``.

    ``choices`` (Hydra's ``runtime.choices``, e.g. ``{"objective": "auc_lp"}``) is recorded so
    that scripts can group runs by the option names users typed.
    """
    validate(cfg)  # before any data or model is built: bad keys fail in a second, not a minute
    device = resolve_device(cfg.device)
    run, ckpt = prepare_run(cfg, run_dir, device)
    run.bundle.to(device)   # the data live on the device: batches and evaluation gather there
    run.attach_optimizer()
    model, objective, optimizer, scheduler = run.model, run.objective, run.optimizer, run.scheduler
    step, timer, amp = 0, Timer(device), autocast_dtype(cfg)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        objective.load_state_dict(ckpt["objective"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        step, run.rows, run.best = ckpt["step"], ckpt["rows"], ckpt["best"]
        timer.samples = ckpt["timings"]
        set_rng_state(ckpt["rng"])
        run.ckpt_step = step

    def diverged(what: str) -> NonFiniteLossError:
        return NonFiniteLossError(nonfinite_message(
            what, step + 1, x, y, logits, optimizer.param_groups[0]["lr"], run_dir, run.ckpt_step,
            cfg.trainer.eval_every))

    run.logger = instantiate(cfg.logger, _partial_=True)(run_dir=str(run_dir), config=run.resolved)
    try:
        stream = BatchStream(run.bundle.train, cfg.trainer.batch_size, cfg.seed, start_step=step)
        hook_kwargs = {}
        if draws_batches(objective):   # a checkpoint from before the side stream: from its start
            run.side_stream = BatchStream(run.bundle.train, cfg.trainer.batch_size,
                                          cfg.seed + SIDE_STREAM_SEED_OFFSET,
                                          start_step=ckpt.get("side_stream_step", 0) if ckpt else 0)
            hook_kwargs["draw_batch"] = lambda: tuple(t.to(device) for t in next(run.side_stream))
        losses: list[float] = []
        model.train()
        bar = tqdm(total=cfg.trainer.max_steps, initial=step, desc="train", dynamic_ncols=True,
                   mininterval=2.0)
        while step < cfg.trainer.max_steps:
            timer.start()
            x, y = next(stream)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            timer.lap("data")
            if amp is None:
                logits = model(x)
            else:   # the model in bf16 (autocast); the loss and any LP see float32 scores
                with torch.autocast(device.type, dtype=amp):
                    logits = model(x)
                logits = logits.float()
            timer.lap("forward")
            finite = torch.isfinite(logits)
            if not finite.all():   # before any objective (or its LP solver) sees them
                raise diverged(f"scores are non-finite ({int((~finite).sum())} of {logits.numel()} "
                               "NaN/inf)")
            loss = objective(logits, y)
            timer.lap("loss")
            if not torch.isfinite(loss):
                raise diverged(f"loss is {loss.item()}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.trainer.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.max_grad_norm)
            timer.lap("backward")
            optimizer.step()
            scheduler.step()
            objective.on_step_end(step=step, model=model, optimizer=optimizer, batch=(x, y), **hook_kwargs)
            timer.lap("optimizer")
            step += 1
            losses.append(loss.item())
            bar.update(1)
            if step % cfg.trainer.log_every == 0:
                bar.set_postfix(loss=f"{statistics.fmean(losses[-cfg.trainer.log_every:]):.4f}")
            if step % cfg.trainer.eval_every == 0 or step == cfg.trainer.max_steps:
                row = run.evaluate(step, losses, timer.samples)
                losses = []
                bar.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in row.items()))
        bar.close()
        results = run.results(timer.medians_ms(), choices)
        run.logger.summary({f"final/{k}": v for k, v in run.rows[-1].items()})
        return results
    finally:
        run.logger.finish()


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the final validation metric so sweepers can optimise it (NaN
    for a split without validation data, ``dataset.split=authors``: never the test metric).

    User errors (:data:`USER_ERRORS`) reach Hydra as :class:`RunError`, which it prints as one
    message without a traceback."""
    hydra_cfg = HydraConfig.get()
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra")}
    try:
        results = train(cfg, Path(hydra_cfg.runtime.output_dir), choices=choices)
    except USER_ERRORS as err:
        raise RunError(f"{type(err).__name__}: {err}") from err
    return float(results["final"].get(f"val_{results['primary_metric']}", math.nan))


if __name__ == "__main__":
    main()
