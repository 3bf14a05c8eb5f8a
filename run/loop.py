"""The training loop of one run: :func:`train` (what ``python train.py`` runs).

A plain, iteration-based loop (no Lightning: the min-max and bilevel baselines need control over
their updates). Every component comes from the config through ``_target_``; objectives plug in
with ``loss = objective(logits, labels)`` plus the optional hooks of
:class:`lpmetrics.objectives.base.Objective`, so the loop never branches on which objective runs.

It stops with :class:`~lpmetrics.run.guards.NonFiniteLossError` (step, batch summary, lr hint)
when a score or the loss is non-finite, before the objective's solver sees it; the run's
evaluations (:meth:`lpmetrics.run.job.Run.evaluate`) stop an interval of only degenerate batches.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from tqdm import tqdm

from lpmetrics.data.stream import BatchStream
from lpmetrics.objectives.base import draws_batches
from lpmetrics.run.builders import autocast_dtype, resolve_device
from lpmetrics.run.guards import NonFiniteLossError, nonfinite_message
from lpmetrics.run.optimizer_step import build_step
from lpmetrics.run.prepare import prepare_run
from lpmetrics.run.request import CheckpointRequests
from lpmetrics.run.rng import set_rng_state
from lpmetrics.run.timer import Timer
from lpmetrics.run.validate import validate

#: seed offset of the side stream, the second batch stream of the train split that an objective
#: declaring ``on_step_end(draw_batch=...)`` samples (the learned surrogate's K_beta steps,
#: Grabocka et al. 2019, Algorithm 1 line 9). A stream of its own, so the main stream, and every
#: other objective's run, is unchanged; a pure function of ``(seed, its step)`` like the main one,
#: so resumes and reruns repeat it. The offset is far from any run seed: the side stream of seed s
#: is the main stream of seed s + 10**6, which no run uses, and its shuffles (generator
#: ``seed * 100003 + epoch``) meet a main stream's of a seed below s + 10**6 only past that
#: stream's epoch 100003
SIDE_STREAM_SEED_OFFSET = 10**6


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
    step, timer, amp, losses = 0, Timer(device), autocast_dtype(cfg), []
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        objective.load_state_dict(ckpt["objective"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        step, run.rows, run.best = ckpt["step"], ckpt["rows"], ckpt["best"]
        timer.samples = ckpt["timings"]
        set_rng_state(ckpt["rng"])
        run.ckpt_step = step
        if "interval" in ckpt:   # written between two evaluations, on request (run/request.py)
            losses = list(ckpt["interval"]["losses"])
            objective.restore_pending_stats(ckpt["interval"]["stats"], device)
    # after the state is loaded: a compiled step sees the tensors it will update
    step_optimizer, run.optimizer_impl = build_step(
        optimizer, cfg.trainer.optimizer_impl, earlier=[la.get("optimizer_impl") for la in run.launches[:-1]])
    run.launches[-1]["optimizer_impl"] = run.optimizer_impl   # the same dict: checkpointed as it changes

    def diverged(what: str) -> NonFiniteLossError:
        return NonFiniteLossError(nonfinite_message(
            what, step + 1, x, y, logits, optimizer.param_groups[0]["lr"], run_dir, run.ckpt_step,
            cfg.trainer.eval_every))

    run.logger = instantiate(cfg.logger, _partial_=True)(run_dir=str(run_dir), config=run.resolved)
    requests = CheckpointRequests(run_dir)   # SIGUSR1: last.pt after this step, then on
    try:
        stream = BatchStream(run.bundle.train, cfg.trainer.batch_size, cfg.seed, start_step=step)
        hook_kwargs = {}
        if draws_batches(objective):   # a checkpoint from before the side stream: from its start
            run.side_stream = BatchStream(run.bundle.train, cfg.trainer.batch_size,
                                          cfg.seed + SIDE_STREAM_SEED_OFFSET,
                                          start_step=ckpt.get("side_stream_step", 0) if ckpt else 0)
            hook_kwargs["draw_batch"] = lambda: tuple(t.to(device) for t in next(run.side_stream))
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
            step_optimizer()
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
            if requests.pop() and run.ckpt_step != step:   # an evaluation's checkpoint answers it
                if cfg.trainer.checkpoints:
                    run.save_checkpoint(step, timer.samples, losses=losses)
                    bar.write(f"checkpoint at step {step} (requested: SIGUSR1)")
                else:
                    bar.write(f"checkpoint requested at step {step}: none written (trainer.checkpoints=false)")
        bar.close()
        results = run.results(timer.medians_ms(), choices)
        run.logger.summary({f"final/{k}": v for k, v in run.rows[-1].items()})
        return results
    finally:
        requests.close()
        run.logger.finish()
