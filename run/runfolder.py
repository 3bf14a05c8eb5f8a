"""What a run folder holds, written so that a killed run never loses it and a resume never mixes
two configs.

Files (all written by :mod:`lpmetrics.atomic`: temporary file in the folder, fsync, rename):

* ``last.pt`` -- the full training state at the latest evaluation; the one before it is kept as
  ``last.prev.pt``. :func:`load_checkpoint` falls back to ``last.prev.pt`` (and says so) when
  ``last.pt`` is missing or cannot be read.
* ``best.pt`` -- model weights of the best validation evaluation.
* ``metrics.csv`` -- one row per evaluation; ``results.json`` -- the final record.

Checkpoints hold only what ``torch.load(..., weights_only=True)`` reads (tensors, numbers,
strings, bools, None, lists, tuples, dicts): :func:`save_checkpoint` refuses anything else
(:func:`unplain_entry`), and every load in the project goes through :func:`torch_load`, which
unpickles no other object, so opening a checkpoint runs no code it carries.  A file that needs
more (written by an older version of this code, whose RNG state held a numpy array, or by
anyone else) raises :class:`UnsafeCheckpointError`; the caller's explicit opt-in
(``trainer.trust_checkpoint=true``, ``eval.py --trust-checkpoint``) unpickles it in full.

A resume compares the checkpoint's config with the new one (:func:`config_differences`): keys
outside :data:`ALLOWED_ON_RESUME` must not change (``resume=force`` overrides; the trainer then
records the differences in ``results.json``); a key an older checkpoint's config lacks counts at its
:data:`~lpmetrics.run.upgrade.ADDED_DEFAULTS` value.  Hydra rewrites ``.hydra/`` at every launch, so
:func:`restore_hydra_files` puts the run's original files back and keeps the resumed launch's as
``<name>.resume-step<N>.yaml``.

``results.json`` stores the config portably (:func:`portable_config`): a path the config spelled
as an interpolation (``${oc.env:DATA_ROOT,...}``) is kept as spelled, any other absolute path is
made relative to the run folder, so committed run folders name no machine's paths.
"""
from __future__ import annotations

import csv
import io
import os
import pickle
import warnings
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any, Mapping

import torch
from omegaconf import DictConfig, OmegaConf

from lpmetrics.run.damage import damage
from lpmetrics.run.targets import short_targets
from lpmetrics.run.upgrade import ADDED_DEFAULTS   # keys older configs lack (compared at their old value)
from lpmetrics.atomic import atomic_torch_save, atomic_write_json, atomic_write_text

LAST, PREVIOUS, BEST = "last.pt", "last.prev.pt", "best.pt"
METRICS, RESULTS = "metrics.csv", "results.json"
TRAIN_STATE = ("step", "model", "objective", "optimizer", "scheduler", "rows", "best", "rng", "config")
HYDRA_FILES = ("config.yaml", "overrides.yaml", "hydra.yaml")

#: Config keys a resume may change (``key`` or any key below it).  Everything else must match
#: the checkpoint's config: extending ``trainer.max_steps`` continues the same run; a new lr,
#: objective or seed would silently splice two experiments into one ``metrics.csv``.
ALLOWED_ON_RESUME = (
    "resume",                     # false in the checkpoint, true / force now
    "trainer.max_steps",          # extend a run
    "trainer.eval_every",         # evaluate more or less often (no effect on the trajectory)
    "trainer.log_every", "trainer.eval_batch_size",
    "trainer.bntrain_batch_size",  # the extra BN-train test evaluation's batch (no effect on the trajectory)
    "trainer.init_from",          # ignored on resume (the run has its own weights)
    "trainer.checkpoints",        # whether checkpoints are written (no effect on the trajectory)
    "trainer.trust_checkpoint",   # how the checkpoint is read (an old-format one needs it)
    "logger",                     # where rows are mirrored
    "device",                     # same run on another card (bit-identity then not guaranteed)
    "dataset.root", "dataset.cache_dir", "dataset.download",   # where the same data lives
)


class CheckpointError(FileNotFoundError):
    """No usable checkpoint: the message names each file tried and why it was rejected."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint ``torch.load(..., weights_only=True)`` refuses: its pickle names a global
    beyond tensors and plain containers, so unpickling it in full could run code.  The message
    names the file, the global and the opt-in that loads it anyway."""


class ResumeConfigError(ValueError):
    """``resume=true`` with a config that differs from the checkpoint's (outside the allow-list)."""


# ---- checkpoints ---------------------------------------------------------------------------------

#: the opt-in :func:`torch_load`'s refusal names by default (``train.py``'s; ``eval.py`` and
#: ``scripts/solver/nmf_heatmaps.py`` name their ``--trust-checkpoint`` flag)
TRAIN_OPT_IN = "trainer.trust_checkpoint=true"
#: exact types a ``weights_only`` load rebuilds (a subclass, an enum or a numpy scalar is a
#: global the loader refuses); dict, list, tuple and set are walked into
_PLAIN_LEAVES = frozenset({type(None), bool, int, float, complex, str, bytes, torch.Tensor,
                           torch.nn.Parameter, torch.Size, torch.dtype, torch.device})
_PLAIN_MAPPINGS = frozenset({dict, OrderedDict, Counter})


def unplain_entry(tree: Any, where: str = "") -> str | None:
    """The first entry of ``tree`` that ``torch.load(..., weights_only=True)`` would refuse, as
    ``"['rng']['numpy'][1] is a numpy.ndarray"``; ``None`` when the whole tree is plain."""
    kind = type(tree)
    if kind in _PLAIN_MAPPINGS:
        for key, value in tree.items():
            found = (unplain_entry(key, f"a key of {where or 'the state'}")
                     or unplain_entry(value, f"{where}[{key!r}]"))
            if found:
                return found
    elif kind in (list, tuple, set):
        for i, value in enumerate(tree):
            if found := unplain_entry(value, f"{where}[{i}]"):
                return found
    elif kind not in _PLAIN_LEAVES:
        return f"{where or 'the state'} is a {kind.__module__}.{kind.__qualname__}"
    return None


def _check_plain(state: Mapping[str, Any], path: Path) -> dict:
    state = dict(state)
    if found := unplain_entry(state):
        raise TypeError(f"{path} would need more than torch.load(weights_only=True) reads: "
                        f"{found}. Store tensors, numbers, strings, lists and dicts only "
                        "(e.g. a numpy array as a tensor, a config via OmegaConf.to_container)")
    return state


def save_checkpoint(state: Mapping[str, Any], run_dir: Path) -> None:
    """``last.pt`` atomically; the checkpoint it replaces stays as ``last.prev.pt``.

    Raises:
        TypeError: ``state`` holds an object a ``weights_only`` load would refuse (named)."""
    path = run_dir / LAST
    atomic_torch_save(_check_plain(state, path), path, keep_previous=run_dir / PREVIOUS)


def save_best(state: Mapping[str, Any], run_dir: Path) -> None:
    path = run_dir / BEST
    atomic_torch_save(_check_plain(state, path), path)


def _refused_global(err: pickle.UnpicklingError) -> str | None:
    """The line of a ``weights_only`` refusal that names the global it would not load; ``None``
    when the error names none (a damaged file: bad opcodes, not a foreign object)."""
    for line in str(err).splitlines():
        if "GLOBAL" in line:
            line = line.strip().removeprefix("WeightsUnpickler error: ")
            return line.split(". Please use")[0].rstrip(".")[:200]
    return None


def torch_load(path: Path, map_location: Any = "cpu", trust: bool = False,
               opt_in: str = TRAIN_OPT_IN) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, so no code
    the file carries runs.

    ``trust`` is the caller's explicit opt-in: a file the safe load refuses is then unpickled in
    full (as every load did before checkpoints were plain), with a warning naming it; a file the
    safe load reads is read safely all the same.

    Raises:
        UnsafeCheckpointError: the file needs more and ``trust`` is false (the message names the
            file, the global it needs and ``opt_in``)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        needs = _refused_global(err)
        if needs is None:   # damaged, not foreign: the caller's damage handling applies
            raise
        if not trust:
            raise UnsafeCheckpointError(
                f"{path} needs more than torch.load(weights_only=True) reads ({needs}): a "
                "checkpoint from an older version of this code (its RNG state held a numpy array) "
                "or from elsewhere. Unpickling it in full runs any code it carries; if you trust "
                f"where it comes from, load it with {opt_in}") from err
        warnings.warn(f"{path}: unpickled in full ({opt_in}): {needs}", stacklevel=2)
    return torch.load(path, map_location=map_location, weights_only=False)


def read_checkpoint(path: Path, map_location: Any = "cpu",
                    required: tuple[str, ...] = TRAIN_STATE, trust: bool = False,
                    opt_in: str = TRAIN_OPT_IN) -> dict:
    """:func:`torch_load` a checkpoint and check it holds the ``required`` keys."""
    ckpt = torch_load(path, map_location, trust, opt_in)
    if not isinstance(ckpt, dict):
        raise ValueError(f"holds a {type(ckpt).__name__}, not a checkpoint dict")
    missing = [k for k in required if k not in ckpt]
    if missing:
        raise KeyError(f"lacks {missing}")
    return ckpt


#: what falling back to ``last.prev.pt`` means for a resumed training (:func:`load_checkpoint`)
RESUME_CONSEQUENCE = "the steps after it are trained again"


def load_checkpoint(run_dir: Path, map_location: Any = "cpu",
                    required: tuple[str, ...] = TRAIN_STATE, trust: bool = False,
                    opt_in: str = TRAIN_OPT_IN, consequence: str = RESUME_CONSEQUENCE) -> tuple[dict, Path, str]:
    """``(checkpoint, path, note)`` of the newest usable checkpoint of ``run_dir``.

    Tries ``last.pt`` then ``last.prev.pt``; ``note`` is empty for ``last.pt`` and otherwise says
    why ``last.pt`` was passed over (:func:`lpmetrics.run.damage.damage`: from the file's bytes, never
    torch's advice to load it unsafely), which step the run goes back to and ``consequence``.
    ``trust``, ``opt_in``: :func:`torch_load`.

    Raises:
        UnsafeCheckpointError: the first readable file needs more than a ``weights_only`` load
            (no fall back to an older checkpoint: the run's latest state is there).
        CheckpointError: neither file exists or can be read (the message says what to do).
    """
    tried = []
    for name in (LAST, PREVIOUS):
        path = run_dir / name
        if not path.is_file():
            tried.append(f"{path} does not exist")
            continue
        try:
            ckpt = read_checkpoint(path, map_location, required, trust, opt_in)
        except UnsafeCheckpointError:
            raise
        except Exception as err:  # truncated zip, unpickling error, a foreign file, ...
            tried.append(f"{path} is damaged ({damage(path, err)})")
            continue
        note = "" if name == LAST else (
            f"{tried[0]}; using the previous checkpoint {path} (step {ckpt.get('step')}) instead: "
            f"{consequence}")
        return ckpt, path, note
    if all(t.endswith("does not exist") for t in tried):
        raise CheckpointError(f"no checkpoint in {run_dir} ({LAST} does not exist): the run never "
                              "reached its first evaluation, or this is not its folder. To resume, "
                              "point the run folder at the interrupted run: hydra.run.dir=<that "
                              "folder>; to start afresh, drop resume=true")
    raise CheckpointError(f"no usable checkpoint in {run_dir}: " + "; ".join(tried) +
                          ". Start afresh (resume=false, or a new hydra.run.dir)")


def remove_stray_temporaries(run_dir: Path) -> list[str]:
    """Delete the temporary files a killed writer left (``.last.pt.<random>.tmp``, ...): nothing
    reads them, and each is up to a checkpoint in size.  Returns their names."""
    names = (LAST, PREVIOUS, BEST, METRICS, RESULTS)
    stray = [p for name in names for p in run_dir.glob(f".{name}.*.tmp")]
    for path in stray:
        path.unlink(missing_ok=True)
    return sorted(p.name for p in stray)


# ---- resume: the same config -----------------------------------------------------------------

def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: tree}


def _allowed(key: str, allowed: tuple[str, ...]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allowed)


_ABSENT = "<absent>"


def config_differences(old: Mapping, new: Mapping,
                       allowed: tuple[str, ...] = ALLOWED_ON_RESUME) -> dict[str, list]:
    """``{key: [checkpoint value, new value]}`` for every leaf that differs outside ``allowed``
    (``_target_`` names compared in their short form: :mod:`lpmetrics.run.targets`)."""
    a, b = (ADDED_DEFAULTS | short_targets(_flatten(t)) for t in (old, new))
    return {k: [a.get(k, _ABSENT), b.get(k, _ABSENT)] for k in sorted(set(a) | set(b))
            if a.get(k, _ABSENT) != b.get(k, _ABSENT) and not _allowed(k, allowed)}


def resume_mismatch_message(run_dir: Path, diffs: Mapping[str, list]) -> str:
    listing = "; ".join(f"{k}: {old!r} in the checkpoint, {new!r} now" for k, (old, new) in diffs.items())
    if any(_ABSENT in pair for pair in diffs.values()):
        listing += f" ({_ABSENT!r}: the key did not exist in that config)"
    return (f"resume=true would continue the run in {run_dir} with a different config ({listing}). "
            "Resume with the run's own settings (drop those overrides), start a new run folder, "
            "or pass resume=force to continue anyway (recorded in results.json). Keys a resume "
            f"may change: {', '.join(ALLOWED_ON_RESUME)}")


def hydra_files(run_dir: Path) -> dict[str, str]:
    """The text of ``run_dir/.hydra/{config,overrides,hydra}.yaml`` (those that exist)."""
    folder = run_dir / ".hydra"
    return {n: (folder / n).read_text() for n in HYDRA_FILES if (folder / n).is_file()}


def restore_hydra_files(run_dir: Path, original: Mapping[str, str], step: int) -> None:
    """Put the run's original ``.hydra`` files back (Hydra overwrote them at this launch) and keep
    this launch's as ``<name>.resume-step<step>.yaml``."""
    folder = run_dir / ".hydra"
    current = hydra_files(run_dir)
    for name, text in original.items():
        if current.get(name, text) != text:
            atomic_write_text(folder / f"{Path(name).stem}.resume-step{step}.yaml", current[name])
            atomic_write_text(folder / name, text)


# ---- records -----------------------------------------------------------------------------------

def write_metrics_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """One row per evaluation; columns in order of first appearance."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def write_results(results: Mapping[str, Any], run_dir: Path) -> None:
    atomic_write_json(run_dir / RESULTS, results)


def _is_absolute(value: str) -> bool:
    return os.path.isabs(value) or value.startswith("~")


def portable_config(cfg: DictConfig, run_dir: Path) -> dict:
    """The resolved config, with absolute paths kept as the config spelled them (an
    interpolation such as ``${oc.env:DATA_ROOT,...}``) or else made relative to ``run_dir``."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    raw = OmegaConf.to_container(cfg, resolve=False)
    base = Path(run_dir).absolute()

    def walk(value: Any, spelled: Any) -> Any:
        if isinstance(value, dict):
            spelled = spelled if isinstance(spelled, dict) else {}
            return {k: walk(v, spelled.get(k)) for k, v in value.items()}
        if isinstance(value, list):
            spelled = spelled if isinstance(spelled, list) and len(spelled) == len(value) else [None] * len(value)
            return [walk(v, s) for v, s in zip(value, spelled)]
        if isinstance(value, str) and _is_absolute(value):
            if isinstance(spelled, str) and "${" in spelled:
                return spelled
            return os.path.relpath(os.path.expanduser(value), base)
        return value

    return walk(resolved, raw)
