"""The CPU training step of one run: torchvision's ResNet-18 vs the same network's GEMM forms.

``OMP_NUM_THREADS=1 python -m scripts.cpu.bench_step`` (defaults: 32 and 50 px, batch 64, one
thread) writes ``results/cpu_step/bench.json`` and prints the markdown table of
``results/cpu_step/README.md``. Forms (``model.conv_impl`` x ``trainer.precision``): ``stock``
(torchvision, oneDNN's convolutions, fp32), ``stock-bf16`` (the same under bf16 autocast, what
``trainer.precision=bf16`` did before the GEMM path), ``gemm`` (fp32), ``gemm-bf16`` (bf16 GEMM
operands, float32 everything else), ``mixed`` and ``mixed-bf16`` (the large maps' convolutions by
oneDNN's direct kernel, the small maps' as GEMMs; bf16: bf16 operands in both), ``mixed16`` (the
line drawn at smaller maps: at 32 px the same convolutions as ``mixed``) and, for reference
only (no run option), ``gemm-bf16act`` (bf16 activations too). Per image size:

* a training step as ``train.py`` takes it (forward, cross-entropy, backward, SGD with momentum
  0.9 and no weight decay, the paper's regime) on one fixed channels-last batch, the forms
  interleaved round by round (one step each per round) so drifting load hits all; the median over
  ``--rounds`` after one warm round, and its ratio to ``stock``;
* the evaluation forward (``model.eval()``, no grad, ``--eval-images`` images in one batch,
  float32 as ``train.py`` evaluates; the bf16 form for reference), interleaved the same way;
* the top operators of a profiled step per form (self CPU time, ``torch.profiler``), and the
  share of a profiled step and evaluation spent in the multiply-adds (the GEMMs; stock's oneDNN
  convolutions): times the form's ratio, the "arithmetic alone" columns, the ratio the form
  would reach if nothing but its multiply-adds cost time (a floor for work on the rest);
* with ``--pause-lane``, the CPU lane's trainings stopped for the measurement and continued after
  (:mod:`scripts.cpu.quiet`);
* the GFLOP/s reached: the network's nominal FLOPs (every convolution tap and the head, 2 per
  multiply-add; a training step = 3x the forward, the stem's input gradient excepted) over the
  median time;
* hours for one paper-regime run: 40k steps plus 40 evaluations of 5k val + 10k test in both
  BatchNorm modes (1M images at the measured evaluation rate).

The forms start from the same initial weights and see the same batch. Load from other processes
is recorded (``os.getloadavg`` before and after) beside the machine (CPU model, SIMD flags, torch).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lpmetrics.models import conv_select, gemm
from lpmetrics.models.gemm_resnet import GemmResNet
from lpmetrics.models.resnet import resnet18
from scripts.cpu import quiet

FORMS = {"stock": ("stock", False), "stock-bf16": ("stock", True), "gemm": ("gemm", False),
         "gemm-bf16": ("gemm", True), "gemm-bf16act": ("gemm", True), "mixed": ("mixed", False),
         "mixed-bf16": ("mixed", True), "mixed16": ("mixed16", False)}
#: a reference form, not a run option: bf16 activations too (autocast straight through the GEMM
#: code, as a bf16 GEMM pack runs: bf16 GEMM outputs, BatchNorm in float32, cast back to bf16)
BF16_ACTIVATIONS = ("gemm-bf16act",)
STEPS_PER_RUN = 40_000
EVAL_IMAGES_PER_RUN = 40 * (5_000 + 2 * 10_000)   # 40 evaluations: val, test in both BN modes


def nominal_gflop(px: int, batch: int) -> float:
    """Forward GFLOP of ResNet-18 (ImageNet stem, 2 classes) on ``batch`` images of ``px``."""
    flops = []

    def count(module, inputs, out):
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            flops.append(2 * out.numel() * module.in_channels * kh * kw)
        elif isinstance(module, nn.Linear):
            flops.append(2 * out.numel() * module.in_features)
    model = resnet18(2, [3, px, px])
    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model.eval()(torch.zeros(batch, 3, px, px))
    for h in hooks:
        h.remove()
    return sum(flops) / 1e9


def bf16_activations(model: GemmResNet) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model``'s GEMM forward without its own autocast handling (see :data:`BF16_ACTIVATIONS`)."""
    def forward(x):
        params = {k: v.unsqueeze(0) for k, v in model.named_parameters()}
        buffers = {k: v.unsqueeze(0) for k, v in model.named_buffers()}
        return gemm.forward(gemm.plan(model), params, buffers, x.unsqueeze(0), model._norm_modes()).squeeze(0)
    return forward


def step_fn(model: Callable, opt: torch.optim.Optimizer, x, y, amp: bool):
    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def eval_fn(model: Callable, x, amp: bool):
    def forward():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            model(x)
    return forward


def interleaved(fns: dict, rounds: int) -> dict[str, float]:
    """Median ms of each callable, one call each per round, the first round untimed."""
    times = {k: [] for k in fns}
    for r in range(rounds + 1):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            if r:
                times[k].append((time.perf_counter() - start) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


#: the operators doing the network's multiply-adds: the GEMMs, the oneDNN convolutions (stock's, mixed's)
ARITHMETIC_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul",
                  "aten::mkldnn_convolution", "aten::convolution_backward")


def profiled(fn, n: int = 6) -> tuple[list[list], float]:
    """One profiled call of ``fn``: its top ``n`` operators by self CPU time (name, ms, % of the
    call) and the share of the call spent in the multiply-adds (:data:`ARITHMETIC_OPS`, self time)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.key_averages()
    rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:n]
    total = sum(e.self_cpu_time_total for e in events) or 1
    arithmetic = sum(e.self_cpu_time_total for e in events if e.key in ARITHMETIC_OPS)
    return ([[e.key, round(e.self_cpu_time_total / 1e3, 1), round(100 * e.self_cpu_time_total / total, 1)]
             for e in rows], arithmetic / total)


def bench_size(px: int, batch: int, rounds: int, eval_images: int, eval_rounds: int) -> dict:
    g = torch.Generator().manual_seed(px)
    x = torch.randn(batch, 3, px, px, generator=g).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 2, (batch,), generator=g)
    xe = torch.randn(eval_images, 3, px, px, generator=g).contiguous(memory_format=torch.channels_last)
    torch.manual_seed(0)
    init = resnet18(2, [3, px, px]).state_dict()
    steps, evals = {}, {}
    for form, (impl, amp) in FORMS.items():
        model = resnet18(2, [3, px, px], conv_impl=impl)
        model.load_state_dict(init)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        twin = copy_eval(model)
        if form in BF16_ACTIVATIONS:
            model, twin = bf16_activations(model.train()), bf16_activations(twin)
        steps[form] = step_fn(model.train() if isinstance(model, nn.Module) else model, opt, x, y, amp)
        evals[form] = eval_fn(twin, xe, amp)
    step_ms = interleaved(steps, rounds)
    eval_ms = interleaved(evals, eval_rounds)
    profile = {form: profiled(fn) for form, fn in steps.items()}
    eval_profile = {form: profiled(fn) for form, fn in evals.items()}
    gflop = nominal_gflop(px, batch)
    eval_gflop = nominal_gflop(px, eval_images)
    out = {"px": px, "batch": batch, "train_gflop_per_step": 3 * gflop, "forms": {}}
    for form in FORMS:
        hours = (step_ms[form] * STEPS_PER_RUN + eval_ms[form] / eval_images * EVAL_IMAGES_PER_RUN) / 3.6e6
        out["forms"][form] = {
            "step_ms": step_ms[form], "step_ratio": step_ms[form] / step_ms["stock"],
            "eval_ms": eval_ms[form], "eval_ratio": eval_ms[form] / eval_ms["stock"],
            "train_gflops": 3 * gflop / step_ms[form] * 1e3, "eval_gflops": eval_gflop / eval_ms[form] * 1e3,
            "hours_per_40k_run": hours, "top_ops": profile[form][0],
            # the multiply-adds alone, as a fraction of stock's whole step / evaluation: what this
            # form would take if everything else cost nothing (profiled share x measured ratio)
            "arith_share": profile[form][1], "arith_floor": profile[form][1] * step_ms[form] / step_ms["stock"],
            "eval_arith_share": eval_profile[form][1],
            "eval_arith_floor": eval_profile[form][1] * eval_ms[form] / eval_ms["stock"]}
    return out


def copy_eval(model: nn.Module) -> nn.Module:
    """An evaluation twin (its own copy: the training twin's steps do not move it)."""
    import copy
    return copy.deepcopy(model).eval()


def table(results: dict) -> str:
    lines = ["| px | form | step ms | x stock | arithmetic alone | eval ms / 512 | x stock | arithmetic alone | "
             "train GFLOP/s | h per 40k run |", "|---|---|---|---|---|---|---|---|---|---|"]
    for size in results["sizes"]:
        for form, r in size["forms"].items():
            lines.append(f"| {size['px']} | {form} | {r['step_ms']:.0f} | {r['step_ratio']:.2f} | "
                         f"{r['arith_floor']:.2f} | {r['eval_ms'] * 512 / results['eval_images']:.0f} | "
                         f"{r['eval_ratio']:.2f} | {r['eval_arith_floor']:.2f} | "
                         f"{r['train_gflops']:.0f} | {r['hours_per_40k_run']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 50])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=12, help="timed training steps per form")
    ap.add_argument("--eval-images", type=int, default=512)
    ap.add_argument("--eval-rounds", type=int, default=6)
    ap.add_argument("--note", default="", help="what else ran on the machine (recorded)")
    ap.add_argument("--out", type=Path, default=Path("results/cpu_step/bench.json"))
    quiet.add_pause_flag(ap)
    args = ap.parse_args(argv)
    if os.environ.get("OMP_NUM_THREADS") != "1":
        raise SystemExit("run with OMP_NUM_THREADS=1 (the step of one run per core is what is measured)")
    torch.set_num_threads(1)
    with quiet.pause_if(args.pause_lane) as paused:
        load_before = os.getloadavg()
        start = time.time()
        sizes = [bench_size(px, args.batch, args.rounds, args.eval_images, args.eval_rounds) for px in args.sizes]
        load_after = os.getloadavg()
    results = {"machine": conv_select.machine(), "load_before": load_before, "load_after": load_after,
               "lane_paused": len(paused), "note": args.note, "wall_s": round(time.time() - start, 1), "rounds": args.rounds,
               "eval_images": args.eval_images, "eval_rounds": args.eval_rounds, "sizes": sizes,
               "command": "OMP_NUM_THREADS=1 python -m scripts.cpu.bench_step " + " ".join(argv or [])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    ignored = [op for op, mode in results["machine"]["bf16_math"].items() if mode == "fp32"]
    if ignored:
        print(f"note: oneDNN ignores the bf16 math mode for {' and '.join(ignored)} on this CPU, so the "
              "-bf16 GEMM forms (bf16 operands asked, not bf16 activations) compute in float32 here")
    for size in sizes:
        for form, r in size["forms"].items():
            print(f"{size['px']} px {form}: " + "; ".join(f"{k} {ms} ms ({pct} %)" for k, ms, pct in r["top_ops"]))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
