"""``python -m scripts.cpu.bench_optimizers``: one optimizer step on ResNet-18's parameters, per
optimizer the campaign trains with, on one CPU thread.

    OMP_NUM_THREADS=1 python -m scripts.cpu.bench_optimizers [--rounds 12] [--pause-lane]

Why: the optimizer step is part of every training step, and the baselines' stage-wise optimizers
(:mod:`baselines.ppd_optim`: PPD-SG, PPD-AdaGrad, Liu et al. 2020) do more per parameter than
SGD with momentum (a proximal pull toward the stage's reference point, the stage sum, AdaGrad's
squared-gradient sums). The optimizers step in turn, round by round, so a drifting load hits them
alike; it prints each one's median ms and its ratio to ``torch.optim.SGD``'s, as
``optimizer=sgd`` builds it (momentum 0.9, no weight decay: the paper's regime). The gradients are
fixed random tensors (the step's cost does not depend on their values); stages are made longer
than the run, so no stage end (averaging) is timed.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchvision.models import resnet18

from lpmetrics.baselines.ppd_optim import PPDAdaGrad, PPDSG
from scripts.cpu import quiet

OPTIMIZERS = {   # name -> (class, keywords): the campaign's optimizers at their configs' values
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "ppd_sg": (PPDSG, dict(lr=0.1, gamma=500.0, T0=10 ** 9)),
    "ppd_adagrad": (PPDAdaGrad, dict(lr=0.1, gamma=500.0, T0=10 ** 9, delta=0.5)),
}


def measure(rounds: int) -> tuple[dict[str, float], int]:
    """Median ms of one ``step()`` per optimizer, interleaved over ``rounds`` rounds, and the
    number of parameters each step updated."""
    steppers, weights = {}, 0
    for name, (cls, kw) in OPTIMIZERS.items():
        torch.manual_seed(0)
        model = resnet18(num_classes=2)
        weights = sum(p.numel() for p in model.parameters())
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        steppers[name] = cls(model.parameters(), **kw)
        steppers[name].step()   # the state (momentum, reference point, sums) exists before timing
    times = {name: [] for name in steppers}
    for _ in range(rounds):
        for name, opt in steppers.items():
            start = time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}, weights


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    quiet.add_pause_flag(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with quiet.pause_if(args.pause_lane):
        ms, weights = measure(args.rounds)
    print(f"ResNet-18 ({weights / 1e6:.1f}M parameters), one thread, median of {args.rounds} steps:")
    for name, t in ms.items():
        print(f"  {name:12} {t:7.1f} ms  {t / ms['sgd']:5.2f}x sgd")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
