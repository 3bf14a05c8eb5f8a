"""``model.conv_impl=gemm`` and ``mixed`` (:class:`models.gemm_resnet.GemmResNet`): the same
ResNet-18 as torchvision's, its convolutions as GEMMs (``mixed``: those of the large maps by
oneDNN's direct kernel).

The oracle is torchvision's model itself, in float64 on the CPU, from the same initial weights:
logits, every parameter gradient, the BatchNorm running statistics and the parameters over two
SGD steps (momentum, weight decay), then the evaluation forward in both BatchNorm modes, at 32 px
(where layer4 runs at 1x1 and taps are dropped) and 50 px (Cat&Dog's size: 2x2 at layer4), to
1e-10 relative. Then the bf16 gate (operands only: within 4x the error bf16 autocast already
brings to the stock model), the state_dict both ways, and the layout promises (channels-last
weights whose gradients arrive in that layout)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import resnet18 as tv_resnet18

from lpmetrics.models import conv_select
from lpmetrics.models.gemm_resnet import GemmResNet
from lpmetrics.models.resnet import resnet18

TOL = 1e-10


def twins(px: int, classes: int = 2, cifar_stem: bool = False, impl: str = "gemm"):
    torch.manual_seed(0)
    stock = resnet18(classes, [3, px, px], cifar_stem=cifar_stem)
    torch.manual_seed(0)
    gemm = resnet18(classes, [3, px, px], cifar_stem=cifar_stem, conv_impl=impl)
    return stock, gemm


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1.0))


def test_same_initial_weights_as_torchvision_and_same_state_dict():
    torch.manual_seed(0)
    tv = tv_resnet18(weights=None, num_classes=2)
    stock, gemm = twins(32)
    assert isinstance(gemm, GemmResNet) and type(stock) is type(tv)
    for ref in (tv.state_dict(), stock.state_dict()):
        got = gemm.state_dict()
        assert list(got) == list(ref)
        assert all(got[k].shape == v.shape and torch.equal(got[k], v) for k, v in ref.items())


@pytest.mark.parametrize("impl", ["gemm", "mixed", "mixed16"])
@pytest.mark.parametrize("px", [32, 50])
def test_float64_steps_equal_torchvision(px, impl, float64_default):
    stock, gemm = (m.double().train() for m in twins(px, impl=impl))
    g = torch.Generator().manual_seed(px)
    x = torch.randn(4, 3, px, px, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 0])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4) for m in (stock, gemm)]
    for _ in range(2):
        logits = [m(x) for m in (stock, gemm)]
        assert rel(logits[1], logits[0]) < TOL
        for m, out, opt in zip((stock, gemm), logits, opts):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(out, y).backward()
        for (name, p), q in zip(stock.named_parameters(), gemm.parameters()):
            assert rel(q.grad, p.grad) < TOL, name
        for opt in opts:
            opt.step()
        for (name, a), b in zip(stock.state_dict().items(), gemm.state_dict().values()):
            assert rel(b.double(), a.double()) < TOL, name   # parameters and running statistics
    eval_modes = [conv_select._eval_logits(m, x) for m in (stock, gemm)]
    for mode, a, b in zip(("eval", "bn-train"), *eval_modes):
        assert rel(b, a) < TOL, mode


@pytest.mark.parametrize("impl", ["gemm", "mixed"])
def test_cifar_stem_and_cumulative_bn_momentum_equal_torchvision(impl, float64_default):
    stock, gemm = (m.double().train() for m in twins(16, classes=3, cifar_stem=True, impl=impl))
    for m in (stock, gemm):
        for bn in m.modules():
            if isinstance(bn, nn.BatchNorm2d):
                bn.momentum = None
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    for _ in range(2):
        assert rel(gemm(x), stock(x)) < TOL
    for (name, a), b in zip(stock.state_dict().items(), gemm.state_dict().values()):
        assert rel(b.double(), a.double()) < TOL, name


@pytest.mark.parametrize("impl", ["gemm", "mixed"])
def test_bf16_gate_passes_and_logits_stay_float32(impl):
    make = lambda impl: resnet18(2, [3, 32, 32], conv_impl=impl)   # noqa: E731
    gate = conv_select.gate_bf16(make, (3, 32, 32), 2, impl)
    assert gate["passed"], gate
    assert all(0 < d for d in gate["distance"])   # bf16 really ran: not the float32 model
    _, gemm = twins(32, impl=impl)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = gemm(torch.randn(2, 3, 32, 32))
    assert out.dtype == torch.float32
    assert torch.backends.mkldnn.matmul.fp32_precision != "bf16"   # restored after the GEMMs
    assert torch.backends.mkldnn.conv.fp32_precision != "bf16"     # and after the direct kernels


@pytest.mark.parametrize("impl, px, direct", [
    ("mixed", 32, ["conv1", "layer1", "layer2"]),             # 16x16, 8x8, 4x4 (128 channels); layer3 2x2 (256)
    ("mixed", 50, ["conv1", "layer1", "layer2"]),             # 25x25, 13x13, 7x7; layer3 4x4 (256): 16 < 256 / 8
    ("mixed", 96, ["conv1", "layer1", "layer2", "layer3"]),   # layer3 6x6 (256): 36 >= 32; layer4 3x3 (512)
    ("mixed16", 32, ["conv1", "layer1", "layer2"]),           # layer3 2x2: 4 < 256 / 16: as mixed
    ("mixed16", 50, ["conv1", "layer1", "layer2", "layer3"]),  # layer3 4x4: 16 >= 256 / 16
])
def test_mixed_runs_the_large_maps_direct_and_the_small_as_gemms(impl, px, direct, direct_conv_weights):
    """The split is by shape only (more than one tap, ``MIXED_RATIOS[impl]`` output positions per
    output channel), so it is the same on every machine: F.conv2d for the stem and the named
    layers' 3x3 convolutions, GEMMs for the rest (every 1x1 downsampling among them); the model's
    ``direct_split`` (what ``auto`` compares paths by) names the same convolutions without running."""
    _, mixed = twins(px, impl=impl)
    called = direct_conv_weights(mixed, torch.randn(2, 3, px, px))
    want = [(name, tuple(m.weight.shape)) for name, m in mixed.named_modules()
            if isinstance(m, nn.Conv2d) and name.split(".")[0] in direct and m.kernel_size != (1, 1)]
    assert called == [shape for _, shape in want] and len(want) < 20   # ResNet-18 has 20 convolutions
    split = mixed.direct_split(px, px)
    assert len(split) == 20 and sorted(k for k, v in split.items() if v) == sorted(f"{n}.weight" for n, _ in want)


def test_the_direct_kernel_is_for_a_lone_run_on_the_cpu():
    from lpmetrics.models import gemm
    spec = gemm.Conv("w", (1, 1), (1, 1))
    with pytest.raises(ValueError, match="lone run"):
        gemm.direct(torch.randn(2, 1, 4, 4, 3), torch.randn(2, 5, 3, 3, 3), spec)
    with pytest.raises(ValueError, match="operands"):
        gemm.direct(torch.randn(1, 1, 4, 4, 3), torch.randn(1, 5, 3, 3, 3), spec, operands="fp16")


def test_bf16_operands_are_scoped_to_the_convolution_gemms():
    """Forward and backward GEMMs of a convolution see oneDNN's bf16 mode; nothing after them."""
    seen = []

    class Watch(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.mm:
                seen.append(torch.backends.mkldnn.matmul.fp32_precision)
            return func(*args, **(kwargs or {}))

    from lpmetrics.models import gemm
    before = torch.backends.mkldnn.matmul.fp32_precision
    a = torch.randn(1, 6, 4, requires_grad=True)
    with Watch():
        out = gemm.gemm(a, torch.randn(1, 4, 3), operands="bf16")
    assert seen == ["bf16"] and torch.backends.mkldnn.matmul.fp32_precision == before
    mm_node = out.grad_fn.next_functions[0][0]   # out = mm(...).unsqueeze(0)
    assert type(mm_node).__name__ == "MmBackward0"
    mm_node.register_prehook(lambda g: seen.append(torch.backends.mkldnn.matmul.fp32_precision))
    out.sum().backward()
    assert seen[-1] == "bf16" and torch.backends.mkldnn.matmul.fp32_precision == before
    with pytest.raises(ValueError, match="operands"):
        gemm.gemm(a, torch.randn(1, 4, 3), operands="fp16")


def test_state_dict_round_trip_both_ways():
    stock, gemm = twins(32)
    x = torch.randn(4, 3, 32, 32)
    stock.train()(x)   # moves its running statistics: something to carry over
    fresh_gemm = resnet18(2, [3, 32, 32], conv_impl="gemm")
    fresh_gemm.load_state_dict(stock.state_dict())
    back = resnet18(2, [3, 32, 32])
    back.load_state_dict(fresh_gemm.state_dict())
    stock.eval(), fresh_gemm.eval(), back.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh_gemm(x), stock(x), rtol=1e-4, atol=1e-4)
        assert torch.equal(back(x), stock(x))
    assert fresh_gemm.conv1.weight.is_contiguous(memory_format=torch.channels_last)


def test_weights_and_their_gradients_stay_channels_last():
    _, gemm = twins(32)
    gemm(torch.randn(2, 3, 32, 32)).sum().backward()
    for name, p in gemm.named_parameters():
        if p.dim() == 4 and p.shape[-1] > 1:
            assert p.is_contiguous(memory_format=torch.channels_last), name
            assert p.grad.stride() == p.stride(), name


def test_bad_conv_impl_and_input_are_named():
    with pytest.raises(ValueError, match="conv_impl='fast'"):
        resnet18(2, [3, 32, 32], conv_impl="fast")
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        resnet18(2, [3, 32, 32], conv_impl="gemm")(torch.randn(2, 3 * 32 * 32))


@pytest.mark.parametrize("px, kept", [(50, ("gemm", "mixed", "mixed16")), (32, ("gemm", "mixed")),
                                      (2, ("gemm",))])
def test_auto_weighs_only_paths_that_compute_differently(px, kept):
    """``conv_select.distinct``: at 32 px ``mixed16`` runs the same convolutions direct as
    ``mixed`` and is not weighed; at 2 px neither runs any direct (all GEMMs: ``gemm``)."""
    from lpmetrics.models import conv_select
    got, why = conv_select.distinct(lambda impl: resnet18(2, [3, px, px], conv_impl=impl), (3, px, px),
                                    conv_select.CANDIDATES)
    assert got == kept
    assert all(f"{impl} left out: the same convolutions as" in why for impl in conv_select.CANDIDATES if impl not in kept)


def test_distinct_keeps_a_path_it_cannot_compare():
    """A candidate built as a model without ``direct_split`` (not a GEMM model) is weighed, not
    taken for ``gemm``."""
    from lpmetrics.models import conv_select
    make = lambda impl: resnet18(2, [3, 32, 32], conv_impl="stock" if impl == "mixed" else impl)
    got, why = conv_select.distinct(make, (3, 32, 32), ("gemm", "mixed"))
    assert got == ("gemm", "mixed") and why == ""
