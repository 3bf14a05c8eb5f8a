"""Check a run's config before anything is built: ``validate(cfg)`` before the data and the model,
``validate(cfg, bundle)`` right after the split is built (the rules that need its size).

Each failure is a :class:`ConfigError` whose message names the key, the value and a fix;
``train.py``'s ``main`` reports it as a clean Hydra error (one message, no traceback). Rules:

* every key of :data:`REQUIRED` is present (the defaults live in ``configs/``; the code reads
  keys without fallbacks, so a key deleted by an override, ``~trainer.eval_bn``, is named here);
* ``trainer.max_steps``, ``eval_every``, ``batch_size``, ``eval_batch_size``, ``log_every`` are
  integers >= 1 (0 used to fail late with ``IndexError`` / ``ZeroDivisionError``);
  ``trainer.max_grad_norm`` is null or finite > 0; ``trainer.eval_bn`` is eval or train; ``trainer.precision`` fp32 or bf16;
  ``trainer.optimizer_impl`` eager or compiled (compiled: on a CPU only);
  ``model.conv_impl`` (where the model has it) stock, gemm, mixed, mixed16 or auto;
  ``trainer.checkpoints`` and ``trainer.trust_checkpoint`` booleans;
  ``trainer.init_from`` names an existing file; ``optimizer.lr`` is finite and >= 0;
* ``seed`` is an integer; ``resume`` is false, true or force; ``dataset.task`` is binary or
  multiclass; ``dataset.neg_keep`` / ``drop_rate`` are numbers the task accepts
  (:func:`data.imbalance.drop_fraction`, the rule the split builder applies);
  ``dataset.split`` is paper or authors, ``dataset.normalize`` per_channel or per_image;
* ``scheduler.stages`` is null or ``{first, growth}`` (both keys) that :class:`schedule.StageDecayLR` accepts,
  and then ``scheduler.milestones`` is empty (one schedule, not two stacked);
* ``device`` exists on this machine (``device=cuda`` without a GPU fails here, not after the data);
* the objective can train the task (``Objective.tasks``: a binary AUC / ratio loss on a
  multi-class split is refused) and gets at least ``Objective.min_batch_size`` samples per batch
  (pairs need two);
* with the data: ``trainer.batch_size`` is at most the train split (a larger batch trained on the
  whole split while the results recorded the requested size).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import DictConfig, OmegaConf

from lpmetrics.data.build import KEYS as DATASET_KEYS
from lpmetrics.errors import ConfigError
from lpmetrics.models.gemm_resnet import MIXED_RATIOS
from lpmetrics.models.resnet import CONV_IMPLS
from lpmetrics.run.builders import resolve_device
from lpmetrics.run.optimizer_step import IMPLS as OPTIMIZER_IMPLS
from lpmetrics.run.schedule import StageDecayLR

TASKS = ("binary", "multiclass")
RESUME_VALUES = (False, True, "force")
POSITIVE_INTS = ("max_steps", "eval_every", "batch_size", "eval_batch_size", "log_every")
PRECISIONS = ("fp32", "bf16")
#: The config keys the run layer reads, by group ("" = top level), each set in configs/ (config.yaml
#: or every file of the group) and read without a fallback; image datasets also read
#: ``dataset.crop_padding`` (:data:`lpmetrics.data.build.IMAGE_KEYS`). The components a config
#: instantiates (model, objective, optimizer, logger) take their keys as constructor arguments.
REQUIRED = {
    "": ("seed", "device", "resume"),
    "trainer": ("max_steps", "batch_size", "eval_every", "eval_batch_size", "eval_bn", "bntrain_batch_size",
                "log_every", "max_grad_norm", "init_from", "trust_checkpoint", "precision", "checkpoints",
                "optimizer_impl"),
    "scheduler": ("milestones", "gamma", "stages"),
    "dataset": DATASET_KEYS,
}
EXAMPLES = {"max_steps": 1000, "eval_every": 100, "batch_size": 64, "eval_batch_size": 512,
            "log_every": 50, "neg_keep": 0.1, "drop_rate": 0.9}


def objective_class(cfg: DictConfig) -> type:
    """The class that ``objective._target_`` names; a :class:`ConfigError` when it cannot be
    imported or is not a class (Hydra's ``get_class`` refuses functions)."""
    from hydra.utils import get_class

    target = OmegaConf.select(cfg, "objective._target_")
    try:
        return get_class(target)
    except Exception as err:  # ImportError, AttributeError, ValueError from Hydra's locator
        raise ConfigError(f"objective._target_={target!r} is not an importable class ({err}); pick one "
                          "of configs/objective/*.yaml, e.g. objective=auc_lp") from None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _error(check: Callable[[], Any]) -> list[str]:
    """``[message]`` of the ``ValueError`` that ``check()`` raises (none: ``[]``): the rule lives
    where the value is used, and is checked here before anything is built."""
    try:
        check()
    except ValueError as err:
        return [str(err)]
    return []


def missing_keys(cfg: DictConfig) -> list[str]:
    """The dotted keys of :data:`REQUIRED` that ``cfg`` lacks."""
    out = []
    for group, keys in REQUIRED.items():
        node = OmegaConf.select(cfg, group) if group else cfg
        out += [f"{group}.{key}".lstrip(".") for key in keys if not isinstance(node, DictConfig) or key not in node]
    return out


def data_config_problems(cfg: DictConfig) -> list[str]:
    """The ``dataset`` keys the split builder and the datasets read (before any data are read)."""
    from lpmetrics.data.datasets import check_normalize
    from lpmetrics.data.imbalance import drop_fraction
    from lpmetrics.data.splits import check_protocol

    ds = cfg.dataset
    knobs = {"neg_keep": ds.neg_keep, "drop_rate": ds.drop_rate}
    problems = [f"dataset.{key}={value!r} must be a number, e.g. dataset.{key}={EXAMPLES[key]}"
                for key, value in knobs.items() if not _number(value)]
    if not problems and ds.task in TASKS:
        problems += _error(lambda: drop_fraction(ds.task, float(knobs["neg_keep"]),
                                                 float(knobs["drop_rate"])))
    return (problems + _error(lambda: check_protocol(ds.split))
            + _error(lambda: check_normalize(ds.normalize)))


def scheduler_problems(cfg: DictConfig) -> list[str]:
    """``scheduler.stages`` (the authors' stage schedule) against ``scheduler.milestones``."""
    sched = cfg.scheduler
    stages = sched.stages
    if not stages:
        return []
    if not isinstance(stages, DictConfig):
        return [f"scheduler.stages={stages!r} must be null or {{first: 2000, growth: 3}}"]
    absent = [key for key in ("first", "growth") if key not in stages]
    if absent:
        return [f"scheduler.stages lacks {' and '.join(absent)}: set both, e.g. "
                "scheduler.stages={first: 2000, growth: 3} (the authors' schedule)"]
    problems = []
    if list(sched.milestones or []):
        problems.append(f"scheduler.milestones={list(sched.milestones)} and scheduler.stages are both "
                        "set; the lr would drop at both: set scheduler.milestones=[] for the stage "
                        "schedule, or scheduler.stages=null for the milestones")
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    return problems + _error(lambda: StageDecayLR(dummy, first=stages.first, growth=stages.growth,
                                                  gamma=sched.gamma))


def static_problems(cfg: DictConfig) -> list[str]:
    """What is wrong with ``cfg`` before any data exist (each item: key, value, fix)."""
    missing = missing_keys(cfg)
    if missing:
        return [f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: the code reads "
                "them with no default (config.yaml and every configs/dataset/*.yaml set them); "
                "remove the override that deleted them, or give them a value"]
    problems = []
    seed = cfg.seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        problems.append(f"seed={seed!r} must be an integer (it seeds the split, the initial weights "
                        "and the batch order), e.g. seed=0")
    trainer = cfg.trainer
    for key in POSITIVE_INTS:
        value = trainer[key]
        if not _positive_int(value):
            problems.append(f"trainer.{key}={value!r} must be an integer >= 1, e.g. "
                            f"trainer.{key}={EXAMPLES[key]}")
    if not _positive_int(trainer.bntrain_batch_size):
        problems.append(f"trainer.bntrain_batch_size={trainer.bntrain_batch_size!r} must be an integer >= 1 "
                        "(the batch of the BatchNorm-train test evaluation), e.g. trainer.bntrain_batch_size=32")
    clip = trainer.max_grad_norm
    if clip is not None and not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0):
        problems.append(f"trainer.max_grad_norm={clip!r} must be null (no clipping) or a finite "
                        "number > 0, e.g. 5.0")
    if trainer.eval_bn not in ("eval", "train"):
        problems.append(f"trainer.eval_bn={trainer.eval_bn!r} must be eval or train")
    if trainer.precision not in PRECISIONS:
        problems.append(f"trainer.precision={trainer.precision!r} must be one of "
                        f"{', '.join(PRECISIONS)} (bf16: the model under torch.autocast)")
    if trainer.optimizer_impl not in OPTIMIZER_IMPLS:
        problems.append(f"trainer.optimizer_impl={trainer.optimizer_impl!r} must be one of "
                        f"{', '.join(OPTIMIZER_IMPLS)} (compiled: the optimizer's step through torch.compile)")
    conv_impl = OmegaConf.select(cfg, "model.conv_impl")
    if conv_impl is not None and conv_impl not in CONV_IMPLS:
        problems.append(f"model.conv_impl={conv_impl!r} must be one of {', '.join(CONV_IMPLS)} (stock: "
                        "torchvision's convolutions; gemm: the same network as GEMMs; mixed: GEMMs on the "
                        "small maps, oneDNN's direct kernel on the large; mixed16: the same, the line at smaller maps; "
                        "auto: this machine's "
                        "choice, gated and timed)")
    if not isinstance(trainer.checkpoints, bool):
        problems.append(f"trainer.checkpoints={trainer.checkpoints!r} must be true or false")
    if not isinstance(trainer.trust_checkpoint, bool):
        problems.append(f"trainer.trust_checkpoint={trainer.trust_checkpoint!r} must be true "
                        "(unpickle an old-format checkpoint in full) or false")
    if cfg.resume not in RESUME_VALUES:
        problems.append(f"resume={cfg.resume!r} must be false, true (continue from "
                        "<run dir>/last.pt) or force (continue although the config differs)")
    task = OmegaConf.select(cfg, "dataset.task")
    if task not in TASKS:
        problems.append(f"dataset.task={task!r} must be one of {TASKS}")
    lr = OmegaConf.select(cfg, "optimizer.lr")
    if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
        problems.append(f"optimizer.lr={lr!r} must be a finite number >= 0, e.g. 0.1")
    problems += data_config_problems(cfg) + scheduler_problems(cfg)
    init_from = trainer.init_from
    if init_from and not cfg.resume and not Path(str(init_from)).expanduser().is_file():
        problems.append(f"trainer.init_from={init_from} does not exist; give a last.pt / best.pt "
                        "of an earlier run (same dataset.task and model), or null")
    cls = objective_class(cfg)
    tasks = getattr(cls, "tasks", TASKS)
    if task in TASKS and task not in tasks:
        problems.append(f"objective={cls.__name__} trains {'/'.join(tasks)} tasks only but "
                        f"dataset.task={task}; use a multi-class objective (objective=auc_ova_lp, "
                        "auc_mu_lp or ce) or dataset.task=binary")
    need = getattr(cls, "min_batch_size", 1)
    batch = trainer.batch_size
    if _positive_int(batch) and batch < need:
        problems.append(f"trainer.batch_size={batch} is too small for objective={cls.__name__}: "
                        f"it compares samples within a batch and needs at least {need} (every "
                        "batch would be degenerate, a zero loss); use e.g. trainer.batch_size=64")
    return problems


def data_problems(cfg: DictConfig, bundle) -> list[str]:
    """What is wrong with ``cfg`` given the built splits."""
    problems = []
    n_train = len(bundle.train)
    batch = cfg.trainer.batch_size
    if batch > n_train:
        problems.append(f"trainer.batch_size={batch} is larger than the train split ({n_train} "
                        f"samples of dataset={bundle.name}); every step would train on those "
                        f"{n_train} while the results record {batch}: use "
                        f"trainer.batch_size<={n_train}")
    return problems


def validate(cfg: DictConfig, bundle=None) -> None:
    """Raise :class:`ConfigError` listing every problem found (none: return quietly).

    ``bundle=None``: the checks that need no data (call before building anything, device
    included); with the :class:`data.DataBundle`: the checks that need the split sizes.
    """
    problems = static_problems(cfg) if bundle is None else data_problems(cfg, bundle)
    if bundle is None and not problems:
        device = resolve_device(cfg.device)
        impl = OmegaConf.select(cfg, "model.conv_impl")
        if impl in MIXED_RATIOS and device.type != "cpu":
            problems.append(f"model.conv_impl={impl} is a CPU path (oneDNN's direct kernel beside GEMMs); "
                            f"on {device.type} use stock or auto")
        if cfg.trainer.optimizer_impl == "compiled" and device.type != "cpu":
            problems.append(f"trainer.optimizer_impl=compiled is tested on CPUs only (inductor's C++ loops); "
                            f"on {device.type} use eager")
    if problems:
        head = "invalid config: " if len(problems) == 1 else f"invalid config ({len(problems)} problems):\n  - "
        raise ConfigError(head + "\n  - ".join(problems))
