"""Quick check: one packed step of N runs vs N separate ``train.py`` steps (CE + SGD, float32).

    OMP_NUM_THREADS=1 python -m packed.speed                         # CPU, N=4
    python -m packed.speed --device cuda --n 1 8 24 --models resnet18   # GPU, an N sweep

Not the benchmark of issue 9 item 6 (N sweep, GPU, graphs, bf16): a sanity number for the
docstring of :mod:`packed.model`. Prints median milliseconds per step (all N runs).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from models.mlp import MLP
from models.resnet import resnet18
from objectives.ce import CrossEntropy
from packed import PackedStep, pack, param_groups


def median_ms(fn, reps: int, device: torch.device = torch.device("cpu")) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    fn()   # warm-up (allocator, kernel choice)
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


def compare(make, shape, batch: int, n: int = 4, reps: int = 5,
            device: torch.device = torch.device("cpu")) -> tuple[float, float]:
    """(separate ms, packed ms) for one step of ``n`` runs of ``make()`` on ``[batch, *shape]``."""
    torch.manual_seed(0)
    models = [make().to(device) for _ in range(n)]
    alone = [copy.deepcopy(m) for m in models]
    objectives = [CrossEntropy() for _ in range(n)]
    sgd = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)   # optimizer=sgd's defaults
    opts = [torch.optim.SGD(m.parameters(), **sgd) for m in alone]
    packed = pack(models)
    stepper = PackedStep(packed, objectives,
                         [torch.optim.SGD(param_groups(m, o), **sgd)
                          for m, o in zip(packed.models, objectives)], [None] * n)
    x, y = torch.randn(n, batch, *shape, device=device), torch.randint(0, 2, (n, batch), device=device)

    def separate():
        for i in range(n):
            loss = objectives[i](alone[i](x[i]), y[i])
            opts[i].zero_grad(set_to_none=True)
            loss.backward()
            opts[i].step()

    return (median_ms(separate, reps, device),
            median_ms(lambda: stepper.step(x, y, 0), reps, device))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, nargs="+", default=[4], help="pack sizes")
    ap.add_argument("--models", nargs="+", default=["mlp", "resnet18"], choices=["mlp", "resnet18"])
    ap.add_argument("--reps", type=int, default=None, help="timed steps (default 50 MLP, 5 ResNet)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    cases = {"mlp": ("MLP 256x256, 64-d input, batch 64", lambda: MLP(2, [64]), [64], 64, 50),
             "resnet18": ("ResNet-18 ImageNet stem, 32x32, batch 64", lambda: resnet18(2, [3, 32, 32]),
                          [3, 32, 32], 64, 5)}
    for name in args.models:
        label, make, shape, batch, reps = cases[name]
        for n in args.n:
            sep, pk = compare(make, shape, batch, n=n, reps=args.reps or reps, device=device)
            print(f"{label} on {device}: N={n} separate {sep:.1f} ms, packed {pk:.1f} ms, "
                  f"packed/separate {pk / sep:.2f}", flush=True)


if __name__ == "__main__":
    main()
