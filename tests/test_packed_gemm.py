"""``PackedModels(mode="gemm")`` (:mod:`packed.gemm`): a ResNet-18 pack whose convolutions are
batched GEMMs over the runs equals the runs trained alone.

The oracle is each run's own model (torchvision's forward, the project's path), in float64 on the
CPU: ``tests/test_packed.py``'s pack-vs-separate check over 3 SGD steps (momentum 0.9, weight
decay 5e-4 from ``optimizer=sgd``; ``ce`` and ``auc_lp``) compares logits, losses, parameter
gradients, BatchNorm running statistics and parameters to 1e-10, then an eval-mode forward.
Below that: the convolution against ``F.conv2d`` on the shapes where taps are dropped, the GEMM
shapes of a 32 px ResNet-18, the refusals, and the TF32 flag (CPU: through the hooks; CUDA:
skipped without a GPU)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torchvision

import tests.test_packed as tp
from lpmetrics.models.mlp import MLP
from lpmetrics.models.resnet import resnet18
from lpmetrics.packed import PackError, gemm, pack

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("size,k,stride,pad", [(8, 3, 1, 1), (8, 3, 2, 1), (8, 1, 2, 0), (32, 7, 2, 3),
                                               (1, 3, 1, 1), (2, 3, 2, 1), (2, 3, 1, 1), (2, 1, 2, 0),
                                               (3, 5, 2, 2), (5, 3, 1, 0), (7, 3, 2, 1)])
def test_conv_equals_conv2d_per_run(size, k, stride, pad):
    """Forward and both gradients, per run, against ``F.conv2d`` (float64, three draws)."""
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        n, b, cin, cout = 3, 2, 4, 5
        x = torch.randn(n, b, size, size + 1, cin, generator=g, dtype=torch.float64, requires_grad=True)
        w = torch.randn(n, cout, cin, k, k, generator=g, dtype=torch.float64, requires_grad=True)
        out = gemm.conv(x, w, gemm.Conv("w", (stride, stride), (pad, pad)))
        ref = torch.stack([F.conv2d(x[i].permute(0, 3, 1, 2), w[i], stride=stride, padding=pad)
                           .permute(0, 2, 3, 1) for i in range(n)])
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        up = torch.randn(ref.shape, generator=g, dtype=torch.float64)
        got = torch.autograd.grad(out, (x, w), up)
        want = torch.autograd.grad(ref, (x, w), up)
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, rtol=0, atol=1e-12)


def test_taps_keep_only_those_that_meet_pixels():
    assert gemm.taps(1, 3, 1, 1) == (1, 1, 0, 0, 1)      # 1x1: the centre tap, no padding
    assert gemm.taps(2, 3, 2, 1) == (1, 2, 0, 0, 1)      # 2x2 -> 1x1: taps 1, 2 meet pixels 0, 1
    assert gemm.taps(8, 3, 1, 1) == (0, 3, 1, 1, 8)      # every tap meets a pixel
    assert gemm.taps(32, 7, 2, 3) == (0, 7, 3, 2, 16)    # the stem: the last column of padding unread


def test_resnet18_convolutions_are_these_gemms():
    """K of every convolution's ``bmm`` in a 32 px ResNet-18 (ImageNet stem) on the CPU: im2col
    down to the taps that meet pixels; layer3's 3x3 convolutions at 2x2 are their whole maps
    (K = 4 C_in for 4 C_out outputs, not 9 C_in); layer4 runs at 1x1 (centre taps: K = C_in) from
    2x2 (4 taps)."""
    shapes = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.bmm:
                shapes.append((args[0].shape[1], args[0].shape[2], args[1].shape[2]))
            return func(*args, **(kwargs or {}))

    packed = pack([resnet18(2, [3, 32, 32]) for _ in range(2)], "gemm")
    with Record(), torch.no_grad():
        packed(torch.randn(2, 4, 3, 32, 32))
    b = 4
    want = [(b * 256, 147, 64)] + [(b * 64, 576, 64)] * 4                                    # stem, layer1 8x8
    want += [(b * 16, 576, 128), (b * 16, 1152, 128), (b * 16, 64, 128)] + [(b * 16, 1152, 128)] * 2
    want += [(b * 4, 1152, 256), (b, 1024, 1024), (b * 4, 128, 256)] + [(b, 1024, 1024)] * 2   # 2x2 maps
    want += [(b, 4 * 256, 512), (b, 512, 512), (b, 256, 512)] + [(b, 512, 512)] * 2     # layer4 1x1
    assert shapes == want


@pytest.mark.parametrize("px,specs", [
    (32, [("ce", 0.1, 0, False)]),
    (50, [("auc_lp", 0.01, 1, False)]),
    (32, [("ce", 0.1, 0, False), ("auc_lp", 0.01, 1, True), ("ce", 0.05, 2, False)]),
    pytest.param(50, [("auc_lp", 0.01, 3, False), ("ce", 0.1, 4, False), ("auc_lp", 0.05, 5, True)],
                 marks=pytest.mark.slow),   # ~35 s here; the three above cover 50 px and N = 3
], ids=["32px-N1-ce", "50px-N1-auc_lp", "32px-N3", "50px-N3"])
def test_gemm_pack_equals_lone_runs(float64_default, compose_cfg, monkeypatch, px, specs):
    shape = [3, px, px]
    made = []
    monkeypatch.setattr(tp, "pack", lambda models, mode: made.append(pack(models, mode)) or made[-1])
    tp.check_pack_equals_separate(compose_cfg, lambda: resnet18(2, shape), specs, shape, batch=8,
                                  steps=3, mode="gemm")
    # the storage now equals the lone runs' state (checked above): its eval forward against each
    # run's own module on its rows, running statistics untouched
    packed = made[0].eval()
    before = {k: v.clone() for k, v in packed.buffers.items()}
    x = torch.randn(len(specs), 8, *shape, generator=torch.Generator().manual_seed(7))
    out = packed(x)
    for i, model in enumerate(packed.models):
        tp.close(out[i], model(x[i]), f"eval logits run {i}")
    assert all(torch.equal(before[k], v) for k, v in packed.buffers.items())


def test_gemm_refuses_what_it_does_not_compute():
    with pytest.raises(PackError, match="not a torchvision ResNet"):
        pack([MLP(2, [4], hidden=[8]) for _ in range(2)], "gemm")
    packed = pack([MLP(2, [4], hidden=[8]) for _ in range(2)], "loop")
    packed.mode = "gemm"   # set after packing: refused at the call
    with pytest.raises(PackError, match="mode='vmap' or 'loop'"):
        packed(torch.randn(2, 3, 4))
    with torch.device("meta"):
        deep = torchvision.models.resnet50(num_classes=2)
    with pytest.raises(gemm.GemmPlanError, match="layer1.0 is a Bottleneck"):
        gemm.plan(deep)
    with pytest.raises(ValueError, match=r"\[N, B, C, H, W\]"):
        pack([resnet18(2, [3, 32, 32])], "gemm")(torch.randn(1, 2, 3 * 32 * 32))


def test_matmul_tf32_follows_cudnn_in_forward_and_backward_then_is_restored():
    """The flag as each GEMM sees it (hooks: the same code as on CUDA, forced on the CPU)."""
    seen = []

    class Watch(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.bmm:
                seen.append(("forward", torch.backends.cuda.matmul.allow_tf32))
            return func(*args, **(kwargs or {}))

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for cudnn_tf32 in (True, False):
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn_tf32, not cudnn_tf32
            a = torch.randn(2, 3, 4, requires_grad=True)
            with Watch():
                out = gemm.bmm(a, torch.randn(2, 4, 5), like_cudnn=True)
            assert torch.backends.cuda.matmul.allow_tf32 is (not cudnn_tf32)
            out.grad_fn.register_prehook(lambda g: seen.append(("backward", torch.backends.cuda.matmul.allow_tf32)))
            out.sum().backward()
            assert torch.backends.cuda.matmul.allow_tf32 is (not cudnn_tf32)
            assert seen == [("forward", cudnn_tf32), ("backward", cudnn_tf32)]
            seen.clear()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def test_autocast_bf16_runs_batchnorm_in_float32():
    """CPU autocast: bf16 GEMMs, float32 statistics; close to the loop mode (bf16 rounding)."""
    torch.manual_seed(0)
    models = [resnet18(2, [3, 32, 32]) for _ in range(2)]
    packs = {m: pack(copy.deepcopy(models), m) for m in ("loop", "gemm")}
    x = torch.randn(2, 8, 3, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out = {m: p(x) for m, p in packs.items()}
    assert out["gemm"].dtype == out["loop"].dtype == torch.bfloat16
    rel = float((out["gemm"].float() - out["loop"].float()).norm() / out["loop"].float().norm())
    assert rel < 5e-2
    for k, v in packs["gemm"].buffers.items():
        assert v.dtype == packs["loop"].buffers[k].dtype
        torch.testing.assert_close(v.double(), packs["loop"].buffers[k].double(), rtol=5e-2, atol=5e-2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _train_forward(packed, x):
    """Logits, flat parameter gradient, flat BN statistics of one training forward + backward."""
    packed.train()
    logits = packed(x)
    logits.square().mean().backward()
    grads = torch.cat([p.grad.flatten() for p in packed.params.values()])
    stats = torch.cat([b.flatten().double() for b in packed.buffers.values()])
    return logits.detach(), grads, stats


@needs_cuda
def test_cuda_gemm_is_in_the_precision_class_of_vmap():
    """float32 on CUDA: the gemm pack's error against the float64 CPU pack is within a small
    factor of the vmap pack's (cuDNN with TF32), and the TF32 flag is back as it was."""
    torch.manual_seed(0)
    models = [resnet18(2, [3, 32, 32]) for _ in range(3)]
    x = torch.randn(3, 16, 3, 32, 32)
    ref = _train_forward(pack([copy.deepcopy(m).double() for m in models], "loop"), x.double())
    flag = torch.backends.cuda.matmul.allow_tf32
    got = {m: _train_forward(pack([copy.deepcopy(n).cuda() for n in models], m), x.cuda())
           for m in ("vmap", "gemm")}
    assert torch.backends.cuda.matmul.allow_tf32 is flag
    for j, what in enumerate(("logits", "grads", "stats")):
        err = {m: _rel(got[m][j].cpu(), ref[j]) for m in got}
        assert err["gemm"] <= 4 * err["vmap"] + 1e-5, f"{what}: {err}"
        assert _rel(got["gemm"][j], got["vmap"][j]) < 2e-2, what


@needs_cuda
def test_cuda_graph_capture_replays_the_gemm_pack():
    """The forward + backward of a gemm pack captured in a CUDA graph (the TF32 flag toggled by
    the forward and by the backward hooks while capturing) replays the eager numbers."""
    from lpmetrics.packed.speed import warm_on_side_stream
    torch.manual_seed(0)
    packed = pack([resnet18(2, [3, 32, 32]).cuda() for _ in range(2)], "gemm")
    x = torch.randn(2, 8, 3, 32, 32, device="cuda")

    def step():
        packed.zero_grad()
        logits = packed(x)
        logits.square().mean().backward()
        return logits

    flag = torch.backends.cuda.matmul.allow_tf32
    eager = step().detach().clone()
    eager_grads = {k: p.grad.clone() for k, p in packed.params.items()}
    warm_on_side_stream(step, x.device)
    packed.zero_grad()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = packed(x)
        captured.square().mean().backward()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.backends.cuda.matmul.allow_tf32 is flag
    torch.testing.assert_close(captured, eager, rtol=1e-5, atol=1e-5)
    for k, p in packed.params.items():
        torch.testing.assert_close(p.grad, eager_grads[k], rtol=1e-4, atol=1e-5)
