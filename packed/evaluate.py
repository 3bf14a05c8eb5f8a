r"""A pack's evaluation in one pass over its evaluation sets: :class:`PackEvaluator`, :func:`pack_predict`.

Why. A run's evaluation (:meth:`run.job.Run.evaluate`) scores val and test through
:func:`builders.predict`, one model at a time: ~0.22 s per run and evaluation on an H100, so a
pack of 32 runs evaluating together pays ~7 s, a third of its time at the pack speeds the
campaign aims for. The pack's forward computes every run at once (``packed(x)``, ``x [N, B, ...]``
-> ``[N, B, K]``), so one pass over the sets gives every run's logits.

What is computed. Per run, :func:`run.evaluation.evaluate` asks :func:`builders.predict` for the logits of
each of its evaluation splits in its ``trainer.eval_bn`` mode (batches of
``trainer.eval_batch_size``), and of test in the other mode too (``test_bntrain_*``: batches of
``trainer.bntrain_batch_size``; ``test_bneval_*`` for an ``eval_bn=train`` run). :func:`pack_predict`
is :func:`builders.predict` for all rows of a pack: the same batches in the same order (split
order; in BN-train mode the seed-0 permutation, a last batch of one joined to the one before),
each run's batch gathered from its own split, logits cast to float32 on the host as predict casts
them, running statistics untouched (the BN-train pass normalises by per-batch statistics, which
per run are its own rows of the pack; its running-statistic updates go to a scratch copy of the
buffers, as predict runs a copy of the model), no global RNG moved, the pack's mode restored.

Metrics. They are the run's own: :meth:`run.job.Run.evaluate` runs per run as before (its row, lr,
train loss, objective statistics, the degenerate-batch check, ``metrics.csv``, ``best.pt``,
``last.pt``), and :meth:`PackEvaluator.serving` yields the ``predict_fn`` it passes to
:func:`run.evaluation.evaluate`: it looks each request up (model, dataset, batch size, BN mode) and returns
the pack's logits and labels, so ``metrics.evaluate`` (score per task: the margin ``l_1 - l_0``
for binary, softmax for AUC_mu) sees what it would have seen; a request it does not hold goes to
:func:`builders.predict`.

Which runs. Runs of a pack share the model architecture, input shape and classes, dataset name
and task (:data:`packed.launch.PACK_KEYS`), not their splits (each run's seed draws its val
split; ``val_size`` or ``split`` may differ) nor their evaluation settings. So requests are grouped by
(split, BN mode, batch size, split length), each run gathering from its own split; a group is
computed through the pack when it holds at least two runs and at least half of the pack (the pass
costs all N rows: rows outside the group get a member's batch and are dropped); the rest go to
:func:`builders.predict`. BN-train groups go through the pack only where BatchNorm is the model's
only train-mode-dependent layer (no dropout: predict puts the rest in eval mode; the pack
cannot). A pass that fails (out of device memory: it is N models wide) is dropped for the rest
of the pack (per-run evaluation from then on, the pack trains on), with the reason in
:attr:`PackEvaluator.note` and the log.

Exactness (``tests/test_packed_evaluate.py``). On the CPU the pack runs each model on its own rows
(``mode="loop"``): float64 logits and float32 logits equal predict's bit for bit, and the rows of
``metrics.csv`` of a pack with batched evaluation equal those of per-run evaluation byte for byte
(float32; digits, an MLP with BatchNorm, ``eval_bn=eval`` and ``eval_bn=train``); the vmap forward
in float64 agrees to 1e-12. On CUDA the pack's vmap
forward groups the convolutions (``packed.model``), so the logits agree to float32 rounding, not
bitwise; not measured yet.

Time. On the CPU the pack runs its models one after another, so one pass saves only predict's
per-call costs: a pack of 4 ResNet-18s, 128 random 32 px images per split, one thread of a 2-core
CPU shared with other trainings (``python -m lpmetrics.packed.evaluate``, 3 repeats): 2.42-2.63 s run by
run, 2.28-2.52 s batched, metrics equal. The pass pays off where the pack's forward is one grouped computation
(CUDA); timing it there is the point of the script.
"""
from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from lpmetrics.data.stream import gather
from lpmetrics.packed.model import PackedModels
from lpmetrics.run.builders import BN_MODES, predict
from lpmetrics.run.evaluation import evaluate
from lpmetrics.run.job import Run

log = logging.getLogger(__name__)

#: layers whose train mode differs from their eval mode other than BatchNorm's; a BN-train pass
#: over the pack would switch them too (predict keeps them in eval mode)
TRAIN_MODE_LAYERS = (nn.modules.dropout._DropoutNd, nn.RReLU)


def _batches(n: int, batch_size: int, bn_mode: str) -> tuple[torch.Tensor, list[list[int]]]:
    """:func:`builders.predict`'s order and batches of a split of ``n`` items (builders.py has no
    helper to share; ``tests/test_packed_evaluate.py`` holds the two equal)."""
    if bn_mode == "train":
        order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    else:
        order = torch.arange(n)
    batches = [idx.tolist() for idx in order.split(batch_size)]
    if bn_mode == "train" and len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2:] = [batches[-2] + batches[-1]]
    return order, batches


@contextlib.contextmanager
def _mode(packed: PackedModels, bn_mode: str) -> Iterator[None]:
    """The pack in ``bn_mode`` (eval: running statistics; train: per-batch statistics, whose
    running-statistic updates land in a scratch copy of the buffers), restored afterwards."""
    was, buffers = packed.training, packed.buffers
    if bn_mode == "train":
        packed.buffers = {k: v.clone() for k, v in buffers.items()}
    packed.train(bn_mode == "train")
    try:
        yield
    finally:
        packed.buffers = buffers
        packed.train(was)


@torch.no_grad()
def pack_predict(packed: PackedModels, datasets: list, *, batch_size: int = 512,
                 device: torch.device | str = "cpu", bn_mode: str = "eval") -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`builders.predict` of every run of ``packed`` at once: row ``i`` on ``datasets[i]``
    (all of one length); returns each row's logits ``[n, K]`` (float32) and labels, in split
    order. See the module docstring for what is kept equal.

    Example::

        >>> from models.mlp import MLP
        >>> from data.datasets import TabularDataset
        >>> from packed import pack
        >>> ds = TabularDataset(np.random.randn(10, 4), np.arange(10) % 2)
        >>> [z.shape for z, _ in pack_predict(pack([MLP(2, [4], hidden=[8])] * 3), [ds] * 3, batch_size=4)]
        [(10, 2), (10, 2), (10, 2)]
    """
    if bn_mode not in BN_MODES:
        raise ValueError(f"bn_mode must be one of {BN_MODES}, got {bn_mode!r}")
    if len(datasets) != packed.n:
        raise ValueError(f"pack_predict needs one dataset per run: {len(datasets)} for a pack of {packed.n}")
    n = len(datasets[0])
    if any(len(d) != n for d in datasets):
        raise ValueError(f"the runs' splits differ in length ({sorted({len(d) for d in datasets})}): "
                         "group the runs by split length, or evaluate them one by one")
    order, batches = _batches(n, batch_size, bn_mode)
    logits: list[list[torch.Tensor]] = [[] for _ in datasets]
    labels: list[list[torch.Tensor]] = [[] for _ in datasets]
    with _mode(packed, bn_mode):
        for idx in batches:
            xs, ys = zip(*(gather(d, torch.tensor(idx, device=getattr(d, "device", "cpu"))) for d in datasets))
            out = packed(torch.stack([x.to(device) for x in xs]).contiguous()).float().cpu()
            for i, y in enumerate(ys):
                logits[i].append(out[i])
                labels[i].append(y.cpu())
    back = torch.argsort(order)
    return [(torch.cat(z)[back].numpy(), torch.cat(y)[back].numpy()) for z, y in zip(logits, labels)]


def requests(run: Run) -> list[tuple[str, str, int]]:
    """The ``(split, bn_mode, batch_size)`` of each predict call :func:`run.evaluation.evaluate` makes for
    ``run`` (its own mode on each evaluation split; test in the other mode too)."""
    t = run.cfg.trainer
    own = t.eval_bn
    out = [(split, own, int(t.eval_batch_size)) for split in run.eval_splits]
    if "test" in run.eval_splits:
        other = "eval" if own == "train" else "train"
        out.append(("test", other, int(t.bntrain_batch_size) if other == "train"
                    else int(t.eval_batch_size)))
    return out


class PackEvaluator:
    """Evaluates runs of one pack through its forward (module docstring).

    Args:
        packed: the pack; ``packed.models[i]`` is run ``i``'s model (``run.model``).
        device: where the pack lives.
        enabled: ``False``: every request goes to :func:`builders.predict` (per-run evaluation).

    Example::

        >>> evaluator = PackEvaluator(packed, device)
        >>> with evaluator.serving({i: runs[i] for i in due}) as predict_fn:
        ...     for i in due:   # train.py's evaluation, the pack's logits
        ...         runs[i].evaluate(step, losses[i], timings, predict_fn=predict_fn)
    """

    def __init__(self, packed: PackedModels, device: torch.device | str, enabled: bool = True) -> None:
        self.packed, self.device, self.enabled = packed, torch.device(device), bool(enabled)
        self.note = "batched" if enabled else "per-run (batched evaluation off)"
        layers = sorted({type(m).__name__ for m in packed.models[0].modules() if isinstance(m, TRAIN_MODE_LAYERS)})
        #: why BN-train requests go to predict ("" if they go through the pack)
        self.no_bn_train = f"the model has {', '.join(layers)} layers" if layers else ""
        self.served = self.missed = 0   # requests answered from the pack / by builders.predict

    def scores(self, runs: dict[int, Any]) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
        """The pack's logits for the requests of ``runs`` (pack row -> :class:`run.job.Run`) that
        form large enough groups, keyed ``(id(model), id(dataset), batch_size, bn_mode)``."""
        groups: dict[tuple, dict[int, Any]] = {}
        for i, run in runs.items():
            for split, bn_mode, batch in requests(run):
                data = getattr(run.bundle, split)
                groups.setdefault((split, bn_mode, batch, len(data)), {})[i] = data
        table: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        n = self.packed.n
        for (split, bn_mode, batch, _), rows in groups.items():
            if len(rows) < max(2, (n + 1) // 2) or (bn_mode == "train" and self.no_bn_train):
                continue
            filler = next(iter(rows.values()))
            out = pack_predict(self.packed, [rows.get(i, filler) for i in range(n)], batch_size=batch,
                               device=self.device, bn_mode=bn_mode)
            for i, data in rows.items():
                table[(id(self.packed.models[i]), id(data), batch, bn_mode)] = out[i]
        return table

    @contextlib.contextmanager
    def serving(self, runs: dict[int, Any]) -> Iterator[Callable | None]:
        """The ``predict_fn`` for :func:`run.evaluation.evaluate` of the runs of ``runs`` (pack row ->
        :class:`run.job.Run`) within the block: the pack's logits (computed on entry) where it has
        them and :func:`builders.predict`'s otherwise; ``None`` (predict itself) when the pack's
        pass is off or failed."""
        table: dict = {}
        if self.enabled and len(runs) > 1:
            try:
                table = self.scores(runs)
            except Exception as err:   # noqa: BLE001 -- e.g. out of memory (the pass is N models wide)
                self.enabled, table = False, {}
                self.note = f"per-run (the batched pass failed: {type(err).__name__}: {err})"
                log.warning(f"pack of {self.packed.n}: evaluation {self.note}; per run from now on")
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        if not table:
            self.missed += sum(len(requests(r)) for r in runs.values())
            yield None
            return

        def served(model, dataset, *, batch_size=512, device="cpu", bn_mode="eval"):
            hit = table.pop((id(model), id(dataset), batch_size, bn_mode), None)
            if hit is None:
                self.missed += 1
                return predict(model, dataset, batch_size=batch_size, device=device, bn_mode=bn_mode)
            self.served += 1
            return hit

        yield served


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m lpmetrics.packed.evaluate [--n 4] [--images 128] [--device cpu] [--mode auto]``:
    one evaluation of a pack (val and test, both BatchNorm modes, as :func:`run.evaluation.evaluate`
    makes it) per run and batched, side by side, on random data; prints the seconds and the
    largest metric difference."""
    import argparse
    import time
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from lpmetrics.data.datasets import ImageDataset
    from lpmetrics.models.resnet import resnet18
    from lpmetrics.packed.model import pack

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--images", type=int, default=128, help="per split (val, test) and run")
    ap.add_argument("--px", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode", default="auto", help="the pack's forward (packed.model.MODES)")
    args = ap.parse_args(argv)
    device, rng = torch.device(args.device), np.random.default_rng(0)
    cfg = OmegaConf.create({"trainer": {"eval_bn": "eval", "eval_batch_size": 512, "bntrain_batch_size": 32}})

    def split():
        images = rng.integers(0, 256, (args.images, 3, args.px, args.px), dtype=np.uint8)
        return ImageDataset(images, np.arange(args.images) % 2, [0.5] * 3, [0.25] * 3).to(device)

    models = []
    for seed in range(args.n):
        torch.manual_seed(seed)
        models.append(resnet18(2, [3, args.px, args.px]).to(device))
    packed = pack(models, args.mode)
    runs = {i: SimpleNamespace(cfg=cfg, eval_splits=("val", "test"), model=packed.models[i],
                               bundle=SimpleNamespace(val=split(), test=split(), task="binary"))
            for i in range(args.n)}

    def once() -> list[dict]:
        out = [{s: evaluate(r.model, r.bundle, s, r.cfg, device) for s in r.eval_splits}
               for r in runs.values()]
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    evaluator, seconds, results = PackEvaluator(packed, device), {"per_run": [], "batched": []}, {}
    for _ in range(args.repeats):
        for how in seconds:
            t0 = time.perf_counter()
            with evaluator.serving(runs) if how == "batched" else contextlib.nullcontext():
                results[how] = once()
            seconds[how].append(time.perf_counter() - t0)
    diff = max(abs(a[s][k] - b[s][k])
               for a, b in zip(results["per_run"], results["batched"]) for s in a for k in a[s])
    row = {"n": args.n, "images_per_split": args.images, "device": str(device), "mode": args.mode,
           **{f"{how}_s": [round(t, 4) for t in ts] for how, ts in seconds.items()},
           "max_metric_diff": diff, "served": evaluator.served, "missed": evaluator.missed}
    print(row)
    return row


if __name__ == "__main__":
    main()
