"""``python -m scripts.cpu.bench_optimizers``: one optimizer step on ResNet-18's parameters, per
optimizer the campaign trains with, on one CPU thread.

    OMP_NUM_THREADS=1 python -m scripts.cpu.bench_optimizers [--rounds 12] [--pause-lane] [--compiled]

Why: the optimizer step is part of every training step, and the baselines' stage-wise optimizers
(:mod:`baselines.ppd_optim`: PPD-SG, PPD-AdaGrad, Liu et al. 2020) do more per parameter than
SGD with momentum (a proximal pull toward the stage's reference point, the stage sum, AdaGrad's
squared-gradient sums). The optimizers step in turn, round by round, so a drifting load hits them
alike; it prints each one's median ms and its ratio to ``torch.optim.SGD``'s, as
``optimizer=sgd`` builds it (momentum 0.9, no weight decay: the paper's regime). The gradients are
fixed random tensors (the step's cost does not depend on their values); stages are made longer
than the run, so no stage end (averaging) is timed.

``--compiled`` adds the same steps as ``trainer.optimizer_impl=compiled`` runs them
(:mod:`lpmetrics.run.optimizer_step`: ``torch.optim.SGD``'s ``step`` through ``torch.compile``,
the PPD optimizers' own ``compiled_step``, their arithmetic written out once for all parameters
of a group), inductor's C++ code, a C++ compiler needed; per form the compile time of its first
call and the largest parameter difference to the eager optimizer after one step from equal states
(rounding: the fused loops need not round as the eager passes do).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchvision.models import resnet18

from lpmetrics.baselines.ppd_optim import PPDAdaGrad, PPDSG
from lpmetrics.run.optimizer_step import build_step
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


def measure_compiled(rounds: int) -> dict[str, tuple[float, float, float, float]]:
    """Per optimizer: (eager ms, compiled ms, seconds to compile, max |parameter difference| after
    one step from equal states), timed interleaved over ``rounds`` rounds. The compiled step is
    the run option's (``trainer.optimizer_impl=compiled``: :func:`lpmetrics.run.optimizer_step.build_step`)."""
    out = {}
    for name, (cls, kw) in OPTIMIZERS.items():
        models = []
        for _ in range(2):
            torch.manual_seed(0)
            model = resnet18(num_classes=2)
            for p in model.parameters():
                p.grad = torch.randn_like(p) * 1e-3
            models.append(model)
        eager, twin = (cls(m.parameters(), **kw) for m in models)
        for opt in (eager, twin):
            opt.step()   # states exist (and are equal) before the compiled form takes over
        fast, record = build_step(twin, "compiled")
        start = time.perf_counter()
        fast()   # compiles
        compile_s = time.perf_counter() - start
        if record["impl"] != "compiled":
            raise RuntimeError(f"{name}: the compiled step fell back to eager: {record['fallback']}")
        eager.step()
        gap = max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), models[1].parameters()))
        times = {"eager": [], "compiled": []}
        for _ in range(rounds):
            for form, fn_ in (("eager", eager.step), ("compiled", fast)):
                start = time.perf_counter()
                fn_()
                times[form].append(time.perf_counter() - start)
        out[name] = (statistics.median(times["eager"]) * 1e3, statistics.median(times["compiled"]) * 1e3,
                     compile_s, gap)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--compiled", action="store_true", help="also time each step compiled by torch.compile")
    quiet.add_pause_flag(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with quiet.pause_if(args.pause_lane):
        ms, weights = measure(args.rounds)
        compiled = measure_compiled(args.rounds) if args.compiled else {}
    print(f"ResNet-18 ({weights / 1e6:.1f}M parameters), one thread, median of {args.rounds} steps:")
    for name, t in ms.items():
        print(f"  {name:12} {t:7.1f} ms  {t / ms['sgd']:5.2f}x sgd")
    if compiled:
        print("compiled (torch.compile), side by side with the eager step, median of "
              f"{args.rounds} interleaved steps:")
    for name, (eager, fast, compile_s, gap) in compiled.items():
        print(f"  {name:12} eager {eager:7.1f} ms, compiled {fast:7.1f} ms ({fast / eager:.2f}x; "
              f"compiled in {compile_s:.0f} s; max |param diff| after one step {gap:.1e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
