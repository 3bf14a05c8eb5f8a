"""Train a network on a (non-decomposable) objective: ``python train.py objective=auc_lp dataset=cifar10``.

A plain, iteration-based loop (no Lightning: the min-max and bilevel baselines need control over
their updates). Every component comes from the config through ``_target_``; objectives plug in
with ``loss = objective(logits, labels)`` plus the optional hooks of :class:`objectives.base.Objective`,
so this file never branches on which objective runs.

Writes into Hydra's run folder: ``metrics.csv`` (one row per evaluation), ``results.json``
(final and best-val metrics, split statistics, step timings, resolved config), ``last.pt``
(checkpoint at every evaluation; ``resume=true`` continues from it) and ``best.pt`` (weights of
the best validation evaluation).
"""
from __future__ import annotations

import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import metrics
from builders import build_model, instantiate_runtime, predict, resolve_device, runtime_values
from data import build_data

PRIMARY_METRIC = {"binary": "auc", "multiclass": "auc_mu"}
TIMED_PHASES = ("data", "forward", "loss", "backward", "optimizer")


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN/inf; the message holds the step and the batch statistics."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def batch_stream(dataset, batch_size: int, seed: int, start_step: int = 0):
    """Shuffled minibatches, a pure function of (seed, step): a resumed run sees the same batches."""
    n = len(dataset)
    per_epoch = max(1, n // batch_size)
    step = start_step
    while True:
        epoch, k = divmod(step, per_epoch)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        items = [dataset[int(i)] for i in perm[k * batch_size:(k + 1) * batch_size]]
        yield torch.stack([x for x, _ in items]), torch.stack([torch.as_tensor(y) for _, y in items])
        step += 1


def evaluate(model, bundle, split: str, cfg: DictConfig, device) -> dict[str, float]:
    logits, labels = predict(model, getattr(bundle, split), batch_size=cfg.trainer.eval_batch_size,
                             device=device, bn_mode=cfg.trainer.get("eval_bn", "eval"))
    return metrics.evaluate(labels, logits, bundle.task)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def batch_summary(x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> str:
    counts = torch.bincount(y.flatten().cpu(), minlength=2).tolist()
    finite = torch.isfinite(logits)
    return (f"labels per class {counts}; inputs mean {x.float().mean():.4g} std {x.float().std():.4g}; "
            f"logits finite {int(finite.sum())}/{logits.numel()}, "
            f"range [{logits[finite].min() if finite.any() else float('nan'):.4g}, "
            f"{logits[finite].max() if finite.any() else float('nan'):.4g}]")


def write_metrics_csv(rows: list[dict[str, Any]], path: Path) -> None:
    import csv

    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


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


def init_weights(model: torch.nn.Module, path: Path, device: torch.device) -> None:
    """Start from the model weights of another run's checkpoint (``trainer.init_from``), e.g.
    fine-tune a cross-entropy run on an LP objective.  Only the weights are taken: optimizer,
    schedule and step count start afresh."""
    if not path.is_file():
        raise FileNotFoundError(f"trainer.init_from={path} does not exist; give a last.pt / best.pt "
                                "of an earlier run (same dataset.task and model)")
    state = torch.load(path, map_location=device, weights_only=False)
    model.load_state_dict(state["model"] if "model" in state else state)


def train(cfg: DictConfig, run_dir: Path, choices: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one training job into ``run_dir``; returns the content of ``results.json``.

    ``choices`` (Hydra's ``runtime.choices``, e.g. ``{"objective": "auc_lp"}``) is recorded so
    that scripts can group runs by the option names users typed.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    bundle = build_data(cfg.dataset, seed=cfg.seed)
    runtime = runtime_values(bundle)
    model = build_model(cfg, bundle).to(device)
    if cfg.trainer.get("init_from") and not cfg.resume:   # a resumed run has its own weights
        init_weights(model, Path(cfg.trainer.init_from), device)
    objective = instantiate_runtime(cfg.objective, **runtime).to(device)
    param_groups = [{"params": list(model.parameters())}] + objective.extra_param_groups()
    optimizer = instantiate(cfg.optimizer, _partial_=True)(params=param_groups)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(
        optimizer, milestones=list(cfg.scheduler.milestones), gamma=cfg.scheduler.gamma)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    primary = PRIMARY_METRIC[bundle.task]

    step, rows, best, timer = 0, [], None, Timer(device)
    last_path = run_dir / "last.pt"
    if cfg.resume:
        if not last_path.exists():
            raise FileNotFoundError(f"resume=true but {last_path} does not exist; point the run "
                                    "folder at the interrupted run: hydra.run.dir=<that folder>")
        ckpt = torch.load(last_path, map_location=device, weights_only=False)
        model.load_state_dict(ckpt["model"])
        objective.load_state_dict(ckpt["objective"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        step, rows, best = ckpt["step"], ckpt["rows"], ckpt["best"]
        timer.samples = ckpt["timings"]
        set_rng_state(ckpt["rng"])

    logger = instantiate(cfg.logger, _partial_=True)(run_dir=str(run_dir), config=resolved)
    try:
        stream = batch_stream(bundle.train, cfg.trainer.batch_size, cfg.seed, start_step=step)
        losses: list[float] = []
        model.train()
        bar = tqdm(total=cfg.trainer.max_steps, initial=step, desc="train", dynamic_ncols=True,
                   mininterval=2.0)
        while step < cfg.trainer.max_steps:
            timer.start()
            x, y = next(stream)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            timer.lap("data")
            logits = model(x)
            timer.lap("forward")
            loss = objective(logits, y)
            timer.lap("loss")
            if not torch.isfinite(loss):
                raise NonFiniteLossError(
                    f"loss is {loss.item()} at step {step + 1}; {batch_summary(x, y, logits)}. "
                    f"The last good checkpoint is kept at {last_path}. Try a smaller optimizer.lr "
                    "or trainer.max_grad_norm=5.")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.trainer.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.max_grad_norm)
            timer.lap("backward")
            optimizer.step()
            scheduler.step()
            objective.on_step_end(step=step, model=model, optimizer=optimizer, batch=(x, y))
            timer.lap("optimizer")
            step += 1
            losses.append(loss.item())
            bar.update(1)
            if step % cfg.trainer.log_every == 0:
                bar.set_postfix(loss=f"{statistics.fmean(losses[-cfg.trainer.log_every:]):.4f}")
            if step % cfg.trainer.eval_every == 0 or step == cfg.trainer.max_steps:
                row = {"step": step, "lr": optimizer.param_groups[0]["lr"],
                       "train_loss": statistics.fmean(losses) if losses else math.nan}
                for split in ("val", "test"):
                    row.update({f"{split}_{k}": v for k, v in evaluate(model, bundle, split, cfg, device).items()})
                row.update(objective.pop_stats())
                rows.append(row)
                losses = []
                logger.log(row, step=step)
                write_metrics_csv(rows, run_dir / "metrics.csv")
                if best is None or row[f"val_{primary}"] > best[f"val_{primary}"]:
                    best = dict(row)
                    torch.save({"step": step, "model": model.state_dict(), "config": resolved},
                               run_dir / "best.pt")
                torch.save({"step": step, "model": model.state_dict(), "objective": objective.state_dict(),
                            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                            "rows": rows, "best": best, "timings": timer.samples, "rng": rng_state(),
                            "config": resolved}, last_path)
                bar.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in row.items()))
        bar.close()
        final = rows[-1]
        results = {
            "primary_metric": primary,
            "final": final,
            "best_val": best,
            "splits": bundle.stats,
            "timing_ms_median": timer.medians_ms(),
            "device": str(device),
            "choices": dict(choices or {}),
            "config": resolved,
        }
        (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=float))
        logger.summary({f"final/{k}": v for k, v in final.items()})
        return results
    finally:
        logger.finish()


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the final validation metric so sweepers can optimise it."""
    hydra_cfg = HydraConfig.get()
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra")}
    results = train(cfg, Path(hydra_cfg.runtime.output_dir), choices=choices)
    return float(results["final"][f"val_{results['primary_metric']}"])


if __name__ == "__main__":
    main()
