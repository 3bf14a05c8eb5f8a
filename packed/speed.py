"""Quick CPU check: one packed step of N runs vs N separate ``train.py`` steps (CE + SGD, float32).

    OMP_NUM_THREADS=1 python -m packed.speed

Not the benchmark of issue 9 item 6 (N sweep, GPU, graphs, bf16): a sanity number for the
docstring of :mod:`packed.model`. Prints median milliseconds per step (all N runs).
"""
from __future__ import annotations

import copy
import statistics
import time

import torch

from models.mlp import MLP
from models.resnet import resnet18
from objectives.ce import CrossEntropy
from packed import PackedStep, pack, param_groups


def median_ms(fn, reps: int) -> float:
    fn()   # warm-up (allocator, kernel choice)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


def compare(make, shape, batch: int, n: int = 4, reps: int = 5) -> tuple[float, float]:
    """(separate ms, packed ms) for one step of ``n`` runs of ``make()`` on ``[batch, *shape]``."""
    torch.manual_seed(0)
    models = [make() for _ in range(n)]
    alone = [copy.deepcopy(m) for m in models]
    objectives = [CrossEntropy() for _ in range(n)]
    sgd = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)   # optimizer=sgd's defaults
    opts = [torch.optim.SGD(m.parameters(), **sgd) for m in alone]
    packed = pack(models)
    stepper = PackedStep(packed, objectives,
                         [torch.optim.SGD(param_groups(m, o), **sgd)
                          for m, o in zip(packed.models, objectives)], [None] * n)
    x, y = torch.randn(n, batch, *shape), torch.randint(0, 2, (n, batch))

    def separate():
        for i in range(n):
            loss = objectives[i](alone[i](x[i]), y[i])
            opts[i].zero_grad(set_to_none=True)
            loss.backward()
            opts[i].step()

    return median_ms(separate, reps), median_ms(lambda: stepper.step(x, y, 0), reps)


def main() -> None:
    torch.set_num_threads(1)
    cases = [("MLP 256x256, 64-d input, batch 64", lambda: MLP(2, [64]), [64], 64, 50),
             ("ResNet-18 ImageNet stem, 32x32, batch 64", lambda: resnet18(2, [3, 32, 32]),
              [3, 32, 32], 64, 5)]
    for label, make, shape, batch, reps in cases:
        sep, pk = compare(make, shape, batch, reps=reps)
        print(f"{label}: N=4 separate {sep:.1f} ms, packed {pk:.1f} ms, packed/separate {pk / sep:.2f}")


if __name__ == "__main__":
    main()
