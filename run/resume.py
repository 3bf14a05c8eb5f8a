"""Continue a run from its run folder (``resume=true``; ``resume=force`` despite a changed config).

:func:`resume_from` reads ``last.pt`` (``last.prev.pt`` when it cannot be read:
:class:`CheckpointFallbackWarning`), refuses a config that differs from the checkpoint's
(:class:`~lpmetrics.run.runfolder.ResumeConfigError`, unless forced), restores the Hydra files the
run started with, and returns the checkpoint with this launch's record (``launches`` in
``results.json``). A run that started with an older batch stream goes on with the current one
(:class:`StreamChangeWarning`).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from omegaconf import DictConfig

from lpmetrics.data.stream import STREAM_VERSION
from lpmetrics.run import provenance, runfolder


class CheckpointFallbackWarning(UserWarning):
    """``last.pt`` could not be read; the run resumed from ``last.prev.pt``."""


class StreamChangeWarning(UserWarning):
    """The run being resumed started with another batch stream (data/stream.py's history)."""


def resume_from(cfg: DictConfig, run_dir: Path, resolved: dict, device) -> tuple[dict, dict]:
    """The checkpoint to continue from and this launch's record; refuses a differing config."""
    ckpt, path, note = runfolder.load_checkpoint(run_dir, map_location=device,
                                                 trust=cfg.trainer.trust_checkpoint)
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
