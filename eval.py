"""Evaluate a run folder (or one checkpoint) on a split; write metrics and ROC curves.

    python eval.py outputs/2026-11-25/12-00-00_digits_ce               # last.pt on the test split
    python eval.py RUN_DIR --checkpoint best.pt --split val --out /tmp/ev
    python eval.py RUN_DIR/best.pt                                     # a checkpoint file directly

Writes into the run folder (or ``--out``):

- ``eval_<split>.json``: ``{"metrics": {...}, "split", "task", "checkpoint", "step", "num_samples"}``
  with the keys of :func:`metrics.evaluate` (binary: auc, ap, f1, acc; multiclass: auc_mu,
  auc_ova, acc), plus ``auc_ova_per_class`` for multiclass;
- ``roc_<split>.png`` (binary) or ``roc_<split>_class<k>.png`` (multiclass, one-vs-rest per class,
  as in the paper's figure 2), and ``roc_<split>.npz`` (``fpr_<name>``, ``tpr_<name>`` arrays) so
  scripts can overlay several runs.

``--bn-mode train`` evaluates with BatchNorm on each evaluation batch's own statistics, as the
authors' public code does (it never switches to ``eval()``); outputs then carry a ``_bntrain``
suffix (``eval_test_bntrain.json``) so both readings can sit in one run folder.

A ``last.pt`` that cannot be read falls back to ``last.prev.pt`` (the previous evaluation's
checkpoint, which ``train.py`` keeps), with a note on stderr: the metrics are then of that step.
A user's error (no such folder or checkpoint, a damaged one, data this machine lacks) ends as one
line, ``eval.py: CheckpointError: ...``, and exit status 1; a damaged checkpoint is named as such,
with the checkpoint to evaluate instead.

The model and data are rebuilt from the checkpoint's resolved config (``RUN_DIR/.hydra/config.yaml``
when the checkpoint has none) with the same builders as ``train.py``. Checkpoints are read with
``torch.load(..., weights_only=True)`` (:func:`runfolder.torch_load`): tensors and plain
containers only, so opening one runs no code. One that needs more (written by an older version of
``train.py``, or from elsewhere) is refused with :class:`runfolder.UnsafeCheckpointError`;
``--trust-checkpoint`` unpickles it in full, for files whose origin you trust.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf
from sklearn.metrics import roc_curve

from lpmetrics.atomic import atomic_write, atomic_write_json
from lpmetrics.data.errors import DamagedDatasetError, DatasetNotFoundError, SplitError
from lpmetrics.errors import ConfigError
from lpmetrics.run import runfolder
from lpmetrics.run.damage import damage
from lpmetrics.run.upgrade import upgrade_config
from lpmetrics.run.builders import build_model, config_from_checkpoint, predict, resolve_device
from lpmetrics.metrics import auc_ova_per_class, evaluate, roc_scores

SPLITS = ("test", "val")
#: a user's errors (nothing to evaluate, a damaged or refused checkpoint, a config or data set this
#: machine cannot use): :func:`main` prints their message as one line and exits with status 1
USER_ERRORS = (runfolder.CheckpointError, ConfigError, DatasetNotFoundError, DamagedDatasetError,
               SplitError)


def find_checkpoint(run_dir: Path | None, checkpoint: str | Path | None) -> Path:
    """``checkpoint`` as given, else relative to ``run_dir``; default ``run_dir/last.pt``
    (``run_dir/last.prev.pt`` when only that one exists).

    Raises:
        runfolder.CheckpointError: nothing to evaluate there (the message says what to pass)."""
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_file() and run_dir is not None and (run_dir / path).is_file():
            path = run_dir / path
        if not path.is_file():
            where = f" (nor in {run_dir})" if run_dir is not None else ""
            raise runfolder.CheckpointError(f"checkpoint {checkpoint} not found{where}: pass an "
                                            "existing file, or a name inside RUN_DIR such as best.pt")
        return path
    if run_dir is None:
        raise runfolder.CheckpointError("give a run folder or --checkpoint PATH")
    if not run_dir.is_dir():
        raise runfolder.CheckpointError(f"run folder {run_dir} does not exist: pass the folder "
                                        "train.py printed (outputs/<date>/<time>_...)")
    path = run_dir / runfolder.LAST
    if not path.is_file() and (run_dir / runfolder.PREVIOUS).is_file():
        return run_dir / runfolder.PREVIOUS
    if not path.is_file():
        found = sorted(p.name for p in run_dir.glob("*.pt"))
        raise runfolder.CheckpointError(
            f"no last.pt in {run_dir} (checkpoints there: {', '.join(found) or 'none'}): the run "
            "may not have reached its first evaluation, or ran with trainer.checkpoints=false; "
            "pass --checkpoint PATH")
    return path


#: the opt-in a refused checkpoint's message names
OPT_IN = "eval.py --trust-checkpoint (evaluate_run: trust=True)"


def read(path: Path, trust: bool = False) -> dict:
    """The checkpoint at ``path`` (it must hold ``model``).

    Raises:
        runfolder.UnsafeCheckpointError: it needs more than a ``weights_only`` load and not ``trust``.
        runfolder.CheckpointError: it cannot be read (the message names it and says why: :func:`damage`)."""
    try:
        return runfolder.read_checkpoint(path, "cpu", ("model",), trust, OPT_IN)
    except runfolder.UnsafeCheckpointError:
        raise
    except Exception as err:  # truncated archive, bytes that are no pickle, a foreign object, ...
        raise runfolder.CheckpointError(f"checkpoint {path} is damaged ({damage(path, err)})") from err


def _what_else(folder: Path, bad: tuple[Path, ...]) -> str:
    """What to do when ``bad`` cannot be evaluated: another checkpoint of the folder, else train again."""
    others = sorted(p.name for p in folder.glob("*.pt") if p not in bad)
    if others:
        return f"evaluate another checkpoint of the run instead: --checkpoint {folder / others[0]}"
    return ("no other checkpoint is there: train the run again (its config: "
            f"{folder / '.hydra' / 'config.yaml'})")


def open_checkpoint(run_dir: Path | None, checkpoint: str | Path | None,
                    trust: bool = False) -> tuple[Path, dict]:
    """``(path, checkpoint dict)``.  A ``run_dir`` that is a file is taken as the checkpoint
    (``python eval.py RUN/last.pt``).  The default ``last.pt`` falls back to ``last.prev.pt``
    (with a note on stderr: the metrics are then of that earlier step) when it is missing or
    cannot be read.

    Raises:
        runfolder.CheckpointError: nothing to evaluate, or the checkpoint named (or both of the
            default's) damaged; the message names each file, why, and what to evaluate instead.
        runfolder.UnsafeCheckpointError: the checkpoint needs more than a ``weights_only`` load
            and not ``trust``."""
    if checkpoint is None and run_dir is not None and run_dir.is_file():
        run_dir, checkpoint = run_dir.parent, run_dir
    path = find_checkpoint(run_dir, checkpoint)
    previous = path.parent / runfolder.PREVIOUS
    default = checkpoint is None
    if default and path == previous:
        print(f"eval.py: {run_dir / runfolder.LAST} does not exist; using the previous checkpoint "
              f"{previous} instead", file=sys.stderr)
    try:
        return path, read(path, trust)
    except runfolder.UnsafeCheckpointError:
        raise
    except runfolder.CheckpointError as err:
        if path == previous or not previous.is_file():
            raise runfolder.CheckpointError(f"{err}; {_what_else(path.parent, (path,))}") from err
        if not default:
            raise runfolder.CheckpointError(f"{err}; evaluate the previous one instead: "
                                            f"--checkpoint {previous}") from err
        damaged = err
    try:
        ckpt = read(previous, trust)
    except runfolder.UnsafeCheckpointError:
        raise
    except runfolder.CheckpointError as err:
        raise runfolder.CheckpointError(f"no usable checkpoint in {run_dir}: {damaged}; {err}; "
                                        f"{_what_else(path.parent, (path, previous))}") from err
    print(f"eval.py: {damaged}; using the previous checkpoint {previous} (step {ckpt.get('step')}) "
          "instead: the metrics are of that step, not of the run's last evaluation", file=sys.stderr)
    return previous, ckpt


def load_config(ckpt: dict, run_dir: Path | None) -> DictConfig:
    """The run's resolved config, upgraded to today's keys (:mod:`lpmetrics.run.upgrade`): keys
    added since the run was made at the value it ran with, and ``_target_`` names in the package
    form (a run made before the ``lpmetrics`` package names ``objectives.auc.AUCLoss``)."""
    return upgrade_config(_stored_config(ckpt, run_dir))


def _stored_config(ckpt: dict, run_dir: Path | None) -> DictConfig:
    if "config" in ckpt:
        return config_from_checkpoint(ckpt)
    hydra_cfg = run_dir / ".hydra" / "config.yaml" if run_dir is not None else None
    if hydra_cfg is None or not hydra_cfg.is_file():
        where = f"{hydra_cfg} does not exist" if hydra_cfg else "no run folder was given"
        raise runfolder.CheckpointError(f"the checkpoint holds no 'config' and {where}; "
                                        "pass the run folder that produced the checkpoint")
    return OmegaConf.load(hydra_cfg)


def roc_curves(labels: np.ndarray, logits: np.ndarray, task: str) -> dict[str, tuple]:
    """``{name: (fpr, tpr)}``: one curve (binary) or one-vs-rest per class present (multiclass)."""
    scores = roc_scores(logits, task)  # ranks like softmax, without saturating to ties
    if task == "binary":
        fpr, tpr, _ = roc_curve(labels, scores)
        return {"positive": (fpr, tpr)}
    curves = {}
    for k in np.unique(labels):
        fpr, tpr, _ = roc_curve(labels == k, scores[:, k])
        curves[f"class{k}"] = (fpr, tpr)
    return curves


def plot_roc(fpr: np.ndarray, tpr: np.ndarray, path: Path, title: str) -> None:
    fig = Figure(figsize=(4, 4))
    FigureCanvasAgg(fig)  # no pyplot: nothing global, no display needed
    ax = fig.add_subplot()
    ax.plot(fpr, tpr, lw=1.5, label=f"AUC = {np.trapezoid(tpr, fpr):.3f}")
    ax.plot([0, 1], [0, 1], "k--", lw=0.8)
    ax.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="false positive rate", ylabel="true positive rate",
           title=title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def evaluate_run(run_dir: str | Path | None, checkpoint: str | Path | None = None,
                 split: str = "test", out_dir: str | Path | None = None,
                 device: str = "auto", bn_mode: str = "eval", batch_size: int | None = None,
                 trust: bool = False) -> dict:
    """Evaluate ``checkpoint`` (default ``run_dir/last.pt``) on ``split``; returns the JSON record.
    ``trust``: unpickle a checkpoint in full when a ``weights_only`` load refuses it
    (:func:`open_checkpoint`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    from lpmetrics.data import build_data  # heavy (torchvision sources); only needed here

    run_dir = Path(run_dir) if run_dir is not None else None
    ckpt_path, ckpt = open_checkpoint(run_dir, checkpoint, trust)
    if run_dir is not None and run_dir.is_file():
        run_dir = run_dir.parent
    cfg = load_config(ckpt, run_dir)
    bundle = build_data(cfg.dataset, seed=cfg.seed)
    dev = resolve_device(device)
    model = build_model(cfg, bundle)
    model.load_state_dict(ckpt["model"])
    if batch_size is None:
        batch_size = cfg.trainer.eval_batch_size
    logits, labels = predict(model.to(dev), getattr(bundle, split), batch_size=batch_size, device=dev,
                             bn_mode=bn_mode)

    record = {"metrics": evaluate(labels, logits, bundle.task), "split": split, "task": bundle.task,
              "bn_mode": bn_mode, "batch_size": int(batch_size),
              "checkpoint": str(ckpt_path), "step": ckpt.get("step"), "num_samples": int(len(labels))}
    if bundle.task == "multiclass":
        record["auc_ova_per_class"] = auc_ova_per_class(labels, roc_scores(logits, "multiclass"))

    out = Path(out_dir) if out_dir is not None else (run_dir or ckpt_path.parent)
    out.mkdir(parents=True, exist_ok=True)
    tag = split if bn_mode == "eval" else f"{split}_bntrain"
    atomic_write_json(out / f"eval_{tag}.json", record)
    curves = roc_curves(labels, logits, bundle.task)
    arrays = {f"{a}_{name}": arr for name, (fpr, tpr) in curves.items()
              for a, arr in (("fpr", fpr), ("tpr", tpr))}
    atomic_write(out / f"roc_{tag}.npz", lambda f: np.savez(f, **arrays))
    for name, (fpr, tpr) in curves.items():
        stem = f"roc_{tag}" if bundle.task == "binary" else f"roc_{tag}_{name}"
        title = f"{bundle.name} {split}" + ("" if bundle.task == "binary" else f": {name} vs rest")
        plot_roc(fpr, tpr, out / f"{stem}.png", title)
    return record


def main(argv: list[str] | None = None) -> dict:
    """The command line's work: parse ``argv``, evaluate, print the metrics, return the record
    (errors propagate, typed: :func:`cli` is the command line)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", help="run folder written by train.py")
    parser.add_argument("--checkpoint", help="checkpoint path (or a name inside RUN_DIR, e.g. best.pt)")
    parser.add_argument("--split", choices=SPLITS, default="test")
    parser.add_argument("--out", help="output folder (default: the run folder)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    parser.add_argument("--bn-mode", choices=("eval", "train"), default="eval",
                        help="train: BatchNorm uses each eval batch's statistics, as the authors' "
                             "code evaluates (outputs get a _bntrain suffix)")
    parser.add_argument("--batch-size", type=int, help="evaluation batch (default: the run's "
                        "trainer.eval_batch_size); matters with --bn-mode train (authors: 32)")
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="unpickle a checkpoint in full when torch.load(weights_only=True) "
                             "refuses it (an older train.py's): it can run code, so only for "
                             "files whose origin you trust")
    args = parser.parse_args(argv)
    if args.run_dir is None and args.checkpoint is None:
        parser.error("give RUN_DIR or --checkpoint PATH")
    record = evaluate_run(args.run_dir, args.checkpoint, args.split, args.out, args.device,
                          args.bn_mode, args.batch_size, args.trust_checkpoint)
    print(json.dumps(record["metrics"], indent=2))
    return record


def cli(argv: list[str] | None = None) -> dict:
    """``python eval.py ...``: :func:`main`, with a user's error (:data:`USER_ERRORS`) ended as one
    line on stderr, ``eval.py: <type>: <message>``, and exit status 1, as ``train.py`` reports its
    own; any other error is a bug and keeps its traceback."""
    try:
        return main(argv)
    except USER_ERRORS as err:
        raise SystemExit(f"eval.py: {type(err).__name__}: " + " ".join(str(err).split("\n"))) from err


if __name__ == "__main__":
    cli()
