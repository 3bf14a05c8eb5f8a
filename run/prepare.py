"""Prepare one job: its run folder, data, model and objective, built from its seed.

:func:`prepare_run` builds in one fixed order from ``cfg.seed`` (seed the RNGs, split, model,
objective), so the same config gives the same split and initial weights wherever it is built:
in the loop (:func:`lpmetrics.run.loop.train`), in the packed launcher and in its selector.
With ``resume`` it also returns the checkpoint to continue from (:mod:`~lpmetrics.run.resume`);
with ``trainer.init_from`` the model starts from another run's weights (:func:`init_weights`).
"""
from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from lpmetrics.data import build_data
from lpmetrics.data.stream import STREAM_VERSION
from lpmetrics.run import provenance, runfolder
from lpmetrics.run.builders import build_model, built, conv_path, instantiate_runtime, runtime_values
from lpmetrics.run.job import Run
from lpmetrics.run.resume import resume_from
from lpmetrics.run.rng import seed_everything
from lpmetrics.run.validate import validate


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


def prepare_run(cfg: DictConfig, run_dir: Path, device: torch.device) -> tuple[Run, dict | None]:
    """The run folder, data, model and objective of one job, built in the loop's order from
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
    conv = conv_path(cfg, bundle, device)   # auto: this machine's choice (RNG untouched; cached)
    model = built("model", cfg, lambda: build_model(cfg, bundle)).to(device)   # the same choice
    if cfg.trainer.init_from and not cfg.resume:   # a resumed run has its own weights
        init_weights(model, Path(cfg.trainer.init_from), device, cfg.trainer.trust_checkpoint)
    objective = built("objective", cfg, lambda: instantiate_runtime(cfg.objective, **runtime)).to(device)
    launches = list(ckpt.get("launches", [])) if ckpt is not None else []
    hydra_files = (ckpt.get("hydra_files") if ckpt is not None else None) or runfolder.hydra_files(run_dir)
    return Run(cfg, run_dir, device, resolved, bundle, model, objective, launches + [launch],
               hydra_files, conv=conv), ckpt
