"""One training job: its components and its record (:class:`Run`).

The loop (:func:`lpmetrics.run.loop.train`) drives one run; the packed launcher
(:mod:`lpmetrics.packed.launch`) drives many in one process through the same methods, so both
write the same run folder: ``metrics.csv`` (one row per evaluation), ``best.pt`` (the best
validation evaluation's weights), ``last.pt`` (the checkpoint a resume continues from) and
``results.json`` (:meth:`Run.results`).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from lpmetrics.data.stream import STREAM_VERSION
from lpmetrics.run import optimizer_step, provenance, runfolder
from lpmetrics.run.builders import built
from lpmetrics.run.evaluation import PRIMARY_METRIC, evaluate
from lpmetrics.run.guards import check_degenerate, degenerate_summary
from lpmetrics.run.rng import rng_state
from lpmetrics.run.schedule import build_scheduler


@dataclass
class Run:
    """One training job: its components and its record. The loop (:func:`lpmetrics.run.loop.train`)
    drives one; the packed launcher (:mod:`lpmetrics.packed.launch`) drives many in one process,
    through the same methods, so both write the same run folder (``metrics.csv``, ``best.pt``,
    ``last.pt``, ``results.json``). Built by :func:`lpmetrics.run.prepare.prepare_run`."""

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
    #: the side stream (:data:`lpmetrics.run.loop.SIDE_STREAM_SEED_OFFSET`) where the objective
    #: draws batches; its position is checkpointed so a resumed run draws what the uninterrupted
    #: one would
    side_stream: Any = None
    #: the model's convolution path (:func:`lpmetrics.run.builders.conv_path`): which one ran,
    #: why, at what precision, on which CPU; ``None`` for a model without convolutions
    conv: dict | None = None
    #: the optimizer step that ran (:func:`lpmetrics.run.optimizer_step.build_step`): asked, ran,
    #: why, seconds compiling; ``None`` where the loop did not build one (the packed launcher)
    optimizer_impl: dict | None = None

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
        the RNG state the next training step starts from. ``predict_fn``: see :func:`run.evaluation.evaluate`.

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
        keep = cfg.trainer.checkpoints
        if key in row and (self.best is None or row[key] > self.best[key]):
            self.best = dict(row)
            if keep:
                runfolder.save_best({"step": step, "model": self.model.state_dict(), "config": self.resolved},
                                    run_dir)
        if not keep:   # trainer.checkpoints=false: metrics only
            return row
        self.save_checkpoint(step, timings, rng)
        return row

    def save_checkpoint(self, step: int, timings: dict, rng: Callable[[], dict] | None = None,
                        losses: list[float] | None = None) -> None:
        """Write ``last.pt`` at ``step``: after an evaluation (:meth:`evaluate`), or between two
        (``losses``: the interval's training losses so far; :mod:`lpmetrics.run.request`). Between
        two it also holds the objective's diagnostics recorded since the last evaluation
        (:meth:`~lpmetrics.objectives.base.Objective.pending_stats`) under ``interval``, so the next
        evaluation's row is the uninterrupted run's."""
        interval = None if losses is None else {"losses": list(losses), "stats": self.objective.pending_stats()}
        runfolder.save_checkpoint(
            {"step": step, "model": self.model.state_dict(), "objective": self.objective.state_dict(),
             "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
             "rows": self.rows, "best": self.best, "timings": timings, "rng": (rng or rng_state)(),
             "config": self.resolved, "launches": self.launches, "hydra_files": self.hydra_files,
             **({"side_stream_step": self.side_stream.step} if self.side_stream is not None else {}),
             **({"interval": interval} if interval is not None else {})},
            self.run_dir)
        self.ckpt_step = step

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
            "conv_impl": self.conv,   # the convolution path that ran (builders.conv_path)
            "optimizer_impl": None if self.optimizer_impl is None else optimizer_step.public(self.optimizer_impl),
            **extra,
        }
        if "val" not in self.eval_splits:
            results["val_split"] = (f"none: dataset.split={self.cfg.dataset.get('split')} holds no "
                                    "validation data out, so there are no val metrics, best_val is "
                                    "null and no best.pt is written; final is the last evaluation "
                                    "and nothing is selected on test")
        runfolder.write_results(results, self.run_dir)
        return results
