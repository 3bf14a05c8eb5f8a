"""``python -m scripts.cpu.bench_layers``: each convolution of ResNet-18 on one CPU thread, as
GEMMs (:func:`models.gemm.conv`) and by oneDNN's direct kernel (:func:`models.gemm.direct`).

    OMP_NUM_THREADS=1 python -m scripts.cpu.bench_layers [--px 32] [--batch 64] [--rounds 10] [--pause-lane]

Why: ``model.conv_impl=mixed`` runs a convolution of more than one tap direct when its output has
at least ``MIXED_DIRECT_RATIO`` positions per image per output channel (:mod:`models.gemm_resnet`);
this prints, per distinct
convolution of the network at ``--px`` (ImageNet stem), the median ms of its forward and of its
backward (input gradient, except for the stem whose input is the images, and weight gradient)
both ways, the faster way and the way the rule takes. Random activations of the convolution's
input shape, channels-last as in the model; the two ways interleaved round by round so a drifting
load hits both. A convolution is timed alone, with its operands in cache, so the sum over layers
is not the step (``scripts.cpu.bench_step`` times that).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from lpmetrics.models import gemm
from lpmetrics.models.gemm_resnet import MIXED_DIRECT_RATIO
from lpmetrics.models.resnet import resnet18
from scripts.cpu import quiet


def convolutions(px: int, batch: int) -> list[tuple[str, nn.Conv2d, tuple[int, ...], int]]:
    """(name, module, input shape [B, C, H, W], output positions per image) of each distinct
    convolution of ResNet-18 at ``px`` (the first of each shape and stride, in forward order)."""
    model, seen, out = resnet18(2, [3, px, px]), set(), []

    def record(name):
        def hook(module, inputs, output):
            key = (tuple(inputs[0].shape), tuple(module.weight.shape), module.stride)
            if key not in seen:
                seen.add(key)
                out.append((name, module, tuple(inputs[0].shape), output.shape[2] * output.shape[3]))
        return hook
    hooks = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model.eval()(torch.zeros(batch, 3, px, px))
    for h in hooks:
        h.remove()
    return out


def measure(px: int, batch: int, rounds: int) -> list[dict]:
    """Per convolution: median ms of forward and backward, direct and as GEMMs."""
    rows = []
    for name, module, (b, c, h, w), positions in convolutions(px, batch):
        spec = gemm.Conv(f"{name}.weight", tuple(module.stride), tuple(module.padding))
        weight = module.weight.detach().contiguous(memory_format=torch.channels_last).unsqueeze(0).requires_grad_()
        x = torch.randn(1, b, h, w, c, requires_grad=name != "conv1")   # the stem's input is the images
        ways = {"direct": gemm.direct, "gemm": gemm.conv}
        times = {(way, part): [] for way in ways for part in ("fwd", "bwd")}
        for r in range(rounds + 1):
            for way, fn in ways.items():
                start = time.perf_counter()
                y = fn(x, weight, spec)
                mid = time.perf_counter()
                y.backward(torch.ones_like(y))
                end = time.perf_counter()
                if r:   # the first round warms up
                    times[(way, "fwd")].append((mid - start) * 1e3)
                    times[(way, "bwd")].append((end - mid) * 1e3)
                weight.grad = x.grad = None
        ms = {f"{way}_{part}": statistics.median(t) for (way, part), t in times.items()}
        total = {way: ms[f"{way}_fwd"] + ms[f"{way}_bwd"] for way in ways}
        rows.append({"conv": name, "input": [c, h, w], "out_positions": positions, **ms,
                     "faster": min(total, key=total.get),
                     "rule": "direct" if gemm.runs_direct(weight.shape[-1] * weight.shape[-2], positions,
                                                          module.out_channels, MIXED_DIRECT_RATIO) else "gemm"})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--px", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10)
    quiet.add_pause_flag(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with quiet.pause_if(args.pause_lane):
        rows = measure(args.px, args.batch, args.rounds)
    print(f"ResNet-18 at {args.px} px, batch {args.batch}, one thread, median of {args.rounds} (ms):")
    print("| convolution | input C, H, W | out positions | direct fwd | direct bwd | gemm fwd | gemm bwd | faster | rule |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['conv']} | {', '.join(map(str, r['input']))} | {r['out_positions']} | {r['direct_fwd']:.2f} | "
              f"{r['direct_bwd']:.2f} | {r['gemm_fwd']:.2f} | {r['gemm_bwd']:.2f} | {r['faster']} | {r['rule']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
