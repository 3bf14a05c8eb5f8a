"""Guards of the training loop: a run that cannot learn stops with a message that says why.

* :class:`NonFiniteLossError` -- a NaN/inf score (checked before any objective or LP solver sees
  it) or loss; the message has the step, a batch summary, the lr and the last good checkpoint.
* Degenerate batches: objectives record per batch ``degenerate_batches`` (a class the loss
  compares is missing) and ``empty_batches`` (nothing to compare: zero loss, zero gradient), see
  :class:`objectives.base.Objective`.  :func:`check_degenerate` warns when more than
  :data:`DEGENERATE_WARN` of an evaluation interval's batches were degenerate and raises
  :class:`DegenerateBatchesError` when every one was empty (e.g. ``trainer.batch_size=1`` with a
  pairwise loss: the run used to finish "successfully" with its initial weights);
  :func:`degenerate_summary` is what ``results.json`` records.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from lpmetrics.run.runfolder import LAST

DEGENERATE_WARN = 0.10  # warn above this fraction of degenerate batches in an evaluation interval


class NonFiniteLossError(FloatingPointError):
    """A score or the loss became NaN/inf; the message holds the step, the batch statistics, the
    lr and where the last good checkpoint is."""


class DegenerateBatchesError(RuntimeError):
    """Every batch of an evaluation interval was empty for the objective (zero loss, no update)."""


class DegenerateBatchesWarning(UserWarning):
    """More than 10 % of an evaluation interval's batches were degenerate for the objective."""


def batch_summary(x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> str:
    counts = torch.bincount(y.flatten().cpu(), minlength=2).tolist()
    finite = torch.isfinite(logits)
    return (f"labels per class {counts}; inputs mean {x.float().mean():.4g} std {x.float().std():.4g}; "
            f"logits finite {int(finite.sum())}/{logits.numel()}, "
            f"range [{logits[finite].min() if finite.any() else float('nan'):.4g}, "
            f"{logits[finite].max() if finite.any() else float('nan'):.4g}]")


def nonfinite_message(what: str, step: int, x, y, logits, lr: float, run_dir: Path,
                      ckpt_step: int | None, eval_every: int) -> str:
    if ckpt_step is None:
        where = (f"No checkpoint was written yet (the first comes at step {eval_every}): rerun "
                 f"with a smaller optimizer.lr (now {lr:g}) or trainer.max_grad_norm=5.")
    else:
        where = (f"The last good checkpoint is {Path(run_dir) / LAST} (step {ckpt_step}): "
                 f"rerun with a smaller optimizer.lr (now {lr:g}) or trainer.max_grad_norm=5 "
                 "and resume=force to continue from it.")
    return f"{what} at step {step}; {batch_summary(x, y, logits)}. {where}"


def check_degenerate(row: dict[str, Any], first_step: int, cfg: DictConfig, counts) -> None:
    """Warn when > 10 % of the interval's batches were degenerate; stop when all were empty."""
    steps = f"steps {first_step}-{row['step']}"
    if row.get("empty_batches") == 1.0:
        raise DegenerateBatchesError(
            f"every batch of {steps} was empty for the objective ({cfg.objective._target_}): "
            "nothing to compare (a batch without a positive or without a negative), so the loss "
            f"was a constant zero and the model did not train. trainer.batch_size="
            f"{cfg.trainer.batch_size} with train class counts {counts}: raise trainer.batch_size "
            "or rebalance the split (dataset.neg_keep / dataset.drop_rate)")
    frac = row.get("degenerate_batches")
    if frac is not None and frac > DEGENERATE_WARN:
        warnings.warn(f"{100 * frac:.0f} % of the batches of {steps} were degenerate for the "
                      f"objective (a class missing from the batch; {100 * row.get('empty_batches', 0):.0f} % "
                      "had nothing to compare); consider a larger trainer.batch_size",
                      DegenerateBatchesWarning, stacklevel=2)


def degenerate_summary(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Fractions of degenerate / empty batches over the whole run (``None``: not reported)."""
    if not rows or "degenerate_batches" not in rows[-1]:
        return None
    steps = [r["step"] - (rows[i - 1]["step"] if i else 0) for i, r in enumerate(rows)]
    total = sum(steps)

    def mean(key):
        return sum(r.get(key, 0.0) * n for r, n in zip(rows, steps)) / total

    return {"fraction": mean("degenerate_batches"), "empty_fraction": mean("empty_batches"),
            "max_interval_fraction": max(r.get("degenerate_batches", 0.0) for r in rows)}
