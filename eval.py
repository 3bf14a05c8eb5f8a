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
checkpoint, which ``train.py`` keeps), with a note on stderr.

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

from lpmetrics.run import runfolder
from lpmetrics.run.targets import upgrade_targets
from lpmetrics.atomic import atomic_write, atomic_write_json
from lpmetrics.run.builders import build_model, config_from_checkpoint, predict, resolve_device
from lpmetrics.metrics import auc_ova_per_class, evaluate, roc_scores

SPLITS = ("test", "val")


def find_checkpoint(run_dir: Path | None, checkpoint: str | Path | None) -> Path:
    """``checkpoint`` as given, else relative to ``run_dir``; default ``run_dir/last.pt``
    (``run_dir/last.prev.pt`` when only that one exists)."""
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_file() and run_dir is not None and (run_dir / path).is_file():
            path = run_dir / path
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {checkpoint} not found (also looked in {run_dir})")
        return path
    if run_dir is None:
        raise ValueError("give a run folder or --checkpoint PATH")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist (train.py prints its path)")
    path = run_dir / runfolder.LAST
    if not path.is_file() and (run_dir / runfolder.PREVIOUS).is_file():
        return run_dir / runfolder.PREVIOUS
    if not path.is_file():
        found = sorted(p.name for p in run_dir.glob("*.pt"))
        raise FileNotFoundError(f"no last.pt in {run_dir} (checkpoints there: {found or 'none'}); "
                                "the run may not have reached its first evaluation: "
                                "pass --checkpoint PATH")
    return path


#: the opt-in a refused checkpoint's message names
OPT_IN = "eval.py --trust-checkpoint (evaluate_run: trust=True)"


def open_checkpoint(run_dir: Path | None, checkpoint: str | Path | None,
                    trust: bool = False) -> tuple[Path, dict]:
    """``(path, checkpoint dict)``.  A ``run_dir`` that is a file is taken as the checkpoint
    (``python eval.py RUN/last.pt``).  The default ``last.pt`` falls back to ``last.prev.pt``
    (with a note on stderr) when it cannot be read; a damaged checkpoint named explicitly raises
    :class:`runfolder.CheckpointError` naming it; one that needs more than a ``weights_only``
    load, :class:`runfolder.UnsafeCheckpointError` unless ``trust``."""
    if checkpoint is None and run_dir is not None and run_dir.is_file():
        run_dir, checkpoint = run_dir.parent, run_dir
    path = find_checkpoint(run_dir, checkpoint)
    if checkpoint is None and path.parent == run_dir:
        ckpt, path, note = runfolder.load_checkpoint(run_dir, required=("model",), trust=trust,
                                                     opt_in=OPT_IN)
        if note:
            print(f"eval.py: {note}", file=sys.stderr)
        return path, ckpt
    try:
        return path, runfolder.read_checkpoint(path, "cpu", ("model",), trust, OPT_IN)
    except runfolder.UnsafeCheckpointError:
        raise
    except Exception as err:
        previous = path.parent / runfolder.PREVIOUS
        hint = f"; evaluate the previous one instead: --checkpoint {previous}" \
            if previous.is_file() and previous != path else ""
        raise runfolder.CheckpointError(f"checkpoint {path} is damaged ({type(err).__name__}: "
                                        f"{str(err).splitlines()[0][:200]}){hint}") from err


def load_config(ckpt: dict, run_dir: Path | None) -> DictConfig:
    """The run's resolved config, its ``_target_`` names in the package form (a run made before
    the ``lpmetrics`` package names ``objectives.auc.AUCLoss``: :mod:`lpmetrics.run.targets`)."""
    return upgrade_targets(_stored_config(ckpt, run_dir))


def _stored_config(ckpt: dict, run_dir: Path | None) -> DictConfig:
    if "config" in ckpt:
        return config_from_checkpoint(ckpt)
    hydra_cfg = run_dir / ".hydra" / "config.yaml" if run_dir is not None else None
    if hydra_cfg is None or not hydra_cfg.is_file():
        where = f"{hydra_cfg} does not exist" if hydra_cfg else "no run folder was given"
        raise FileNotFoundError(f"the checkpoint holds no 'config' and {where}; "
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
        batch_size = OmegaConf.select(cfg, "trainer.eval_batch_size", default=512)
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


if __name__ == "__main__":
    main()
