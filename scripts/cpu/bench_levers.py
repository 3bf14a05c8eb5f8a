"""What is left to gain in the CPU GEMM step, measured piece by piece (``results/cpu_step/``).

``OMP_NUM_THREADS=1 python -m scripts.cpu.bench_levers [--pause-lane]`` prints side-by-side
measurements (medians, one thread, the variants interleaved call by call: :func:`scripts.cpu.bench_step.interleaved`):

* ``dead-taps``: the fp32 training step of the 32 px GEMM model against the same model with the
  three layer4 convolutions that run at 1x1 replaced by 1x1 convolutions: the same live
  arithmetic without the taps that meet only padding (their exactly-zero gradients, allocated and
  stepped by SGD), i.e. the most that dropping those taps from the step could give;
* ``malloc``: the fp32 32 px GEMM step in fresh processes with glibc's default allocator
  against the CPU lane's ``MALLOC_ENV`` (allocations kept in the heap: no fresh pages faulting);
* ``gemm``: one of layer1's GEMMs (4096x576 @ 576x64) in float32, in oneDNN's bf16 math mode
  (float32 operands converted on each call: the ``bf16`` run option) and on bfloat16 tensors, and
  each one's distance to the float64 product (bf16 operands ~1e-3; a math mode the CPU ignores
  leaves float32's ~1e-7);
* ``eval``: what one of ``train.py``'s evaluations costs beside its 1,000 training steps, for the
  32 px ``mixed`` model in fp32 (15k images with running statistics in batches of 512, 10k in
  BatchNorm-train mode in batches of 32: ``trainer.eval_batch_size``, ``trainer.bntrain_batch_size``),
  and the running-statistics forward with each BatchNorm folded into the convolution before it
  (weights scaled per output channel, a bias added; the folding paid on every call): the most
  folding could save, as it applies to the running-statistics half only;
* ``winograd``: layer1's and layer2's 3x3 convolutions (the ones ``mixed`` runs by oneDNN's direct
  kernel at 32 px), forward + backward, direct against Winograd's F(2x2, 3x3) written as an index
  gather, transform GEMMs and 16 batched GEMMs (2.25x fewer multiply-adds than the direct
  convolution in those GEMMs, the transforms' own arithmetic aside), and against those 16 GEMMs alone.
"""
from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

from lpmetrics.models import gemm
from lpmetrics.models.resnet import resnet18
from scripts.cpu import quiet
from scripts.cpu.bench_step import interleaved, step_fn

LAYER4_AT_1X1 = ("layer4.0.conv2", "layer4.1.conv1", "layer4.1.conv2")   # 32 px, ImageNet stem


def _model(slim: bool, px: int = 32):
    torch.manual_seed(0)
    model = resnet18(2, [3, px, px], conv_impl="gemm")
    if slim:
        for name in LAYER4_AT_1X1:
            parent, attr = name.rsplit(".", 1)
            old = model.get_submodule(name)
            setattr(model.get_submodule(parent), attr, nn.Conv2d(old.in_channels, old.out_channels, 1, bias=False))
        model.channels_last()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model.train(), opt


def dead_taps(rounds: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 32, 32, generator=g).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 2, (64,), generator=g)
    steps, params = {}, {}
    for name, slim in (("full", False), ("layer4 1x1", True)):
        model, opt = _model(slim)
        steps[name] = step_fn(model, opt, x, y, amp=False)
        params[name] = sum(p.numel() for p in model.parameters())
    ms = interleaved(steps, rounds)
    return [f"dead-taps: fp32 step {ms['full']:.1f} ms; with layer4's 1x1-spatial convolutions as 1x1 "
            f"{ms['layer4 1x1']:.1f} ms ({ms['layer4 1x1'] / ms['full']:.2f}x); weights {params['full'] / 1e6:.1f}M "
            f"-> {params['layer4 1x1'] / 1e6:.1f}M"]


def gemm_precisions(rounds: int) -> list[str]:
    a, b = torch.randn(4096, 576), torch.randn(576, 64)
    a16, b16 = a.bfloat16(), b.bfloat16()

    def bf16_mode():
        with gemm._bf16_operands():
            a @ b
    ms = interleaved({"fp32": lambda: a @ b, "bf16 math mode": bf16_mode, "bf16 tensors": lambda: a16 @ b16},
                     rounds * 4)
    exact = a.double() @ b.double()
    with gemm._bf16_operands():
        mode = a @ b
    dist = {"fp32": a @ b, "bf16 math mode": mode, "bf16 tensors": a16 @ b16}
    dist = {k: ((v.double() - exact).norm() / exact.norm()).item() for k, v in dist.items()}
    return ["gemm 4096x576 @ 576x64: " + ", ".join(f"{k} {v:.2f} ms" for k, v in ms.items())
            + "; relative distance to the float64 product: " + ", ".join(f"{k} {v:.1e}" for k, v in dist.items())]


MALLOC_STEPS = """
import resource, statistics, sys, time
import torch, torch.nn.functional as F
from lpmetrics.models.resnet import resnet18
torch.manual_seed(0)
model = resnet18(2, [3, 32, 32], conv_impl="gemm").train()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(64, 3, 32, 32).contiguous(memory_format=torch.channels_last)
y = torch.randint(0, 2, (64,))
def step():
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
for _ in range(3):
    step()
times, faults = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(int(sys.argv[1])):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(statistics.median(times) * 1e3, faults / len(times))
"""


def malloc(rounds: int) -> list[str]:
    """The fp32 32 px GEMM step in fresh processes, glibc's default malloc against the lane's
    :data:`scripts.campaign.lane.MALLOC_ENV`, alternating, 5 processes each."""
    import os
    import subprocess
    import sys

    from scripts.campaign.lane import MALLOC_ENV
    base = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV} | {"OMP_NUM_THREADS": "1"}
    envs = {"default": base, "lane": base | MALLOC_ENV}
    out = {k: [] for k in envs}
    for _ in range(5):
        for name, env in envs.items():
            ms, faults = subprocess.run([sys.executable, "-c", MALLOC_STEPS, str(rounds)], env=env, check=True,
                                        capture_output=True, text=True).stdout.split()
            out[name].append((float(ms), float(faults)))
    med = {k: (statistics.median(m for m, _ in v), statistics.median(f for _, f in v)) for k, v in out.items()}
    return [f"malloc: fp32 step {med['default'][0]:.1f} ms, {med['default'][1]:.0f} minor faults per step with "
            f"glibc's defaults; {med['lane'][0]:.1f} ms, {med['lane'][1]:.0f} with the lane's MALLOC_ENV "
            f"({med['lane'][0] / med['default'][0]:.2f}x; medians of 5 processes each)"]


def _folded_forward(model: nn.Module, chunk: int = 64):
    """``model``'s (a ``mixed`` GemmResNet in ``eval()``) running-statistics forward with every
    BatchNorm folded into the convolution before it: ``conv(x, w * s) + (beta - mean * s)`` with
    ``s = gamma / sqrt(var + eps)`` per output channel, then ReLU in place; chunks of ``chunk``
    images as the model's own evaluation forward."""
    plan = gemm.plan(model)
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())

    def fold(conv: gemm.Conv, norm: gemm.Norm):
        p = norm.prefix
        scale = torch.rsqrt(buffers[f"{p}.running_var"] + norm.eps) * params[f"{p}.weight"]
        weight = (params[conv.weight] * scale[:, None, None, None]).contiguous(memory_format=torch.channels_last)
        return conv, weight.unsqueeze(0), params[f"{p}.bias"] - buffers[f"{p}.running_mean"] * scale

    def conv_bias(h, folded, relu: bool):
        conv, weight, bias = folded
        out = gemm.conv(h, weight, conv, direct_ratio=model.direct_ratio).add_(bias)
        return out.relu_() if relu else out

    def forward(x):
        stem = fold(plan.stem, plan.stem_bn)
        blocks = [(fold(b.conv1, b.bn1), fold(b.conv2, b.bn2), b.down and fold(*b.down)) for b in plan.blocks]
        out = []
        for part in x.split(chunk):
            h = gemm.max_pool(conv_bias(part.unsqueeze(0).permute(0, 1, 3, 4, 2), stem, True), plan.pool)
            for first, second, down in blocks:
                y = conv_bias(conv_bias(h, first, True), second, False)
                h = y.add_(h if down is None else conv_bias(h, down, False)).relu_()
            out.append(torch.addmm(params[f"{plan.fc}.bias"], h.mean(dim=(2, 3)).squeeze(0), params[f"{plan.fc}.weight"].t()))
        return torch.cat(out)
    return forward


def evaluation(rounds: int) -> list[str]:
    import copy
    torch.manual_seed(0)
    model = resnet18(2, [3, 32, 32], conv_impl="mixed")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 32, 32, generator=g).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 2, (64,), generator=g)
    for _ in range(20):   # BatchNorm statistics away from their initial values
        step_fn(model, opt, x, y, amp=False)()
    running = copy.deepcopy(model).eval()   # twins: the timed steps below move only `model`
    batch_stats = copy.deepcopy(model)
    for m in batch_stats.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.train()
    folded = _folded_forward(running)
    x512 = torch.randn(512, 3, 32, 32, generator=g).contiguous(memory_format=torch.channels_last)
    no_grad = torch.no_grad()(lambda fn: fn())
    gap = no_grad(lambda: (folded(x512) - running(x512)).abs().max().item())
    ms = interleaved({"step": step_fn(model, opt, x, y, amp=False),
                      "running 512": lambda: no_grad(lambda: running(x512)),
                      "folded 512": lambda: no_grad(lambda: folded(x512)),
                      "bn-train 16x32": lambda: no_grad(lambda: [batch_stats(p) for p in x512.split(32)])},
                     max(rounds // 4, 3))
    per_eval = (ms["running 512"] * 15_000 + ms["bn-train 16x32"] * 10_000) / 512
    folded_eval = (ms["folded 512"] * 15_000 + ms["bn-train 16x32"] * 10_000) / 512
    step_k = ms["step"] * 1_000
    return [f"eval: 32 px mixed fp32, per 512 images: running statistics {ms['running 512']:.0f} ms, "
            f"BatchNorm folded {ms['folded 512']:.0f} ms ({ms['folded 512'] / ms['running 512']:.2f}x; "
            f"max |logit gap| {gap:.1e}), BatchNorm-train in batches of 32 {ms['bn-train 16x32']:.0f} ms",
            f"eval: one evaluation {per_eval / 1e3:.1f} s beside 1,000 steps {step_k / 1e3:.0f} s "
            f"({ms['step']:.1f} ms each): {per_eval / (per_eval + step_k):.1%} of a run; with folding "
            f"{folded_eval / (folded_eval + step_k):.1%}"]


#: Winograd's F(2x2, 3x3) (Lavin and Gray, CVPR 2016, "Fast Algorithms for Convolutional Neural
#: Networks", Section 4): input tile transform B^T, filter transform G, output transform A^T
WINO_BT = torch.tensor([[1., 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
WINO_G = torch.tensor([[1., 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])
WINO_AT = torch.tensor([[1., 1, 1, 0], [0, 1, -1, -1]])


def winograd_conv(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A 3x3, stride-1, padding-1 convolution of channels-last ``h [B, H, W, C]`` (H, W even) by
    Winograd's F(2x2, 3x3), written with torch's own ops so autograd derives the backward: the
    overlapping 4x4 tiles (stride 2) of the padded input gathered tap-major (``[16, B T T, C]``,
    an index gather as the GEMM path's im2col), transformed by one ``[16, 16]`` GEMM (``B^T d B``
    as ``kron(B^T, B^T)``), 16 GEMMs with the transformed filters (``G g G^T``: 16 multiply-adds
    per 2x2 outputs where a direct 3x3 takes 36), and the ``[4, 16]`` output transform."""
    b, height, width, c = h.shape
    th, tw, cout = height // 2, width // 2, w.shape[0]
    hp = torch.nn.functional.pad(h, (0, 0, 1, 1, 1, 1))
    k = torch.arange(4)
    rows = (torch.arange(th) * 2)[None, :] + k[:, None]                            # [4, T_h]
    cols = (torch.arange(tw) * 2)[None, :] + k[:, None]                            # [4, T_w]
    pixel = rows[:, None, :, None] * (width + 2) + cols[None, :, None, :]           # [4, 4, T_h, T_w]
    index = (pixel[:, :, None] + (torch.arange(b) * hp.shape[1] * hp.shape[2])[:, None, None]).reshape(-1)
    tiles = hp.reshape(-1, c).index_select(0, index).view(16, -1)                   # [16, B T_h T_w C]
    v = (torch.kron(WINO_BT, WINO_BT).to(h.dtype) @ tiles).view(16, -1, c)
    u = torch.kron(WINO_G, WINO_G).to(h.dtype) @ w.permute(2, 3, 0, 1).reshape(9, -1)   # [16, C_out C_in]
    m = torch.bmm(v, u.view(16, cout, c).transpose(1, 2))                           # [16, B T_h T_w, C_out]
    y = (torch.kron(WINO_AT, WINO_AT).to(h.dtype) @ m.view(16, -1)).view(2, 2, b, th, tw, cout)
    return y.permute(2, 3, 0, 4, 1, 5).reshape(b, height, width, cout)


def winograd(rounds: int) -> list[str]:
    """layer1's and layer2's 3x3 convolutions at 32 px (64 channels at 8x8, 128 at 4x4; batch
    64), forward + backward: oneDNN's direct kernel (what ``mixed`` runs there) against Winograd's
    F(2x2, 3x3) (:func:`winograd_conv`) and against its 16 GEMMs alone (forward + both backward
    GEMMs: what the transforms would cost nothing for); Winograd's largest distance to ``F.conv2d``
    in float64 (output, input and weight gradients)."""
    import torch.nn.functional as F
    direct = lambda h, w: F.conv2d(h.permute(0, 3, 1, 2), w, padding=1).permute(0, 2, 3, 1)
    out = []
    for c, size in ((64, 8), (128, 4)):
        g = torch.Generator().manual_seed(c)
        h64 = torch.randn(4, size, size, c, dtype=torch.float64, generator=g, requires_grad=True)
        w64 = torch.randn(c, c, 3, 3, dtype=torch.float64, generator=g, requires_grad=True)
        up = torch.randn(4, size, size, c, dtype=torch.float64, generator=g)
        got = [winograd_conv(h64, w64), *torch.autograd.grad(winograd_conv(h64, w64), (h64, w64), up)]
        want = [direct(h64, w64), *torch.autograd.grad(direct(h64, w64), (h64, w64), up)]
        gap = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want))
        h = torch.randn(64, size, size, c).requires_grad_()
        w = torch.randn(c, c, 3, 3).contiguous(memory_format=torch.channels_last).requires_grad_()
        up = torch.randn(64, size, size, c)
        v, u, gm = torch.randn(16, 64 * size * size // 4, c), torch.randn(16, c, c), torch.randn(16, 64 * size * size // 4, c)

        def gemms_alone():
            torch.bmm(v, u), torch.bmm(gm, u.transpose(1, 2)), torch.bmm(v.transpose(1, 2), gm)
        ms = interleaved({"direct": lambda: direct(h, w).backward(up), "winograd": lambda: winograd_conv(h, w).backward(up),
                          "its 16 GEMMs alone": gemms_alone}, rounds)
        out.append(f"winograd {c} channels at {size}x{size}, forward + backward: "
                   + ", ".join(f"{k} {v:.2f} ms" for k, v in ms.items())
                   + f"; float64 relative distance to F.conv2d {gap:.1e}")
    return out


LEVERS = {"dead-taps": dead_taps, "gemm": gemm_precisions, "malloc": malloc, "eval": evaluation, "winograd": winograd}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("levers", nargs="*", metavar="LEVER", help=f"any of {', '.join(LEVERS)} (default: all)")
    ap.add_argument("--rounds", type=int, default=20)
    quiet.add_pause_flag(ap)
    args = ap.parse_args(argv)
    unknown = [x for x in args.levers if x not in LEVERS]
    if unknown:
        ap.error(f"unknown lever(s) {unknown}: choose from {', '.join(LEVERS)}")
    torch.set_num_threads(1)
    with quiet.pause_if(args.pause_lane):
        for lever in args.levers or LEVERS:
            for line in LEVERS[lever](args.rounds):
                print(line, flush=True)


if __name__ == "__main__":
    main()
