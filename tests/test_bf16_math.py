"""``models.gemm.bf16_math``: what oneDNN's bf16 math mode does on this CPU, checked against
float64 oracles at shapes other than the probe's, through the GEMM path's own functions."""
from __future__ import annotations

import pytest
import torch

from lpmetrics.models import conv_select, gemm
from lpmetrics.models.gemm_plan import Conv


def _distances(got: torch.Tensor, f, *args) -> tuple[float, float]:
    """Relative distance of ``got`` to the float64 result of ``f`` on ``args`` and on their
    bfloat16 roundings."""
    exact = f(*(t.double() for t in args))
    rounded = f(*(t.bfloat16().double() for t in args))
    got = got.double()
    return ((got - exact).norm() / exact.norm()).item(), ((got - rounded).norm() / rounded.norm()).item()


def _check(mode: str, to_exact: float, to_rounded: float) -> None:
    if mode == "bf16":   # rounded operands: ~1e-3 from the float32 product, float32 rounding from theirs
        assert to_rounded < 1e-5 < 1e-4 < to_exact
    else:                # float32 kernels: float32 rounding from the exact product
        assert to_exact < 1e-5 < 1e-4 < to_rounded


def test_the_labels():
    modes = gemm.bf16_math()
    assert set(modes) == {"matmul", "conv"} and set(modes.values()) <= {"bf16", "fp32"}   # never unknown here
    assert conv_select.machine()["bf16_math"] == modes


@pytest.mark.parametrize("seed", range(3))
def test_the_gemm_does_what_the_label_says(seed):
    g = torch.Generator().manual_seed(seed)
    a, w = torch.randn(1, 512, 1152, generator=g), torch.randn(1, 1152, 128, generator=g)
    with torch.no_grad():
        got = gemm.gemm(a, w, operands="bf16")
    _check(gemm.bf16_math()["matmul"], *_distances(got, torch.bmm, a, w))


@pytest.mark.parametrize("seed", range(3))
def test_the_direct_kernel_does_what_the_label_says(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 4, 4, 128, generator=g)                 # [B, H, W, C]: channels-last memory
    weight = torch.randn(1, 128, 128, 3, 3, generator=g)
    spec = Conv("w", (1, 1), (1, 1))
    with torch.no_grad():
        got = gemm.direct(x.unsqueeze(0), weight, spec, operands="bf16").squeeze(0).permute(0, 3, 1, 2)

    def conv(h, k):
        return torch.nn.functional.conv2d(h.permute(0, 3, 1, 2), k.squeeze(0), padding=1)
    _check(gemm.bf16_math()["conv"], *_distances(got, conv, x, weight))


def test_float32_operands_are_float32_everywhere():
    """The oracle's premise: without the mode, both products are float32 (the labels can differ)."""
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(1, 512, 1152, generator=g), torch.randn(1, 1152, 128, generator=g)
    _check("fp32", *_distances(gemm.gemm(a, w), torch.bmm, a, w))


def _modes(monkeypatch, matmul: str, conv: str) -> None:
    monkeypatch.setattr(gemm, "bf16_math", lambda: {"matmul": matmul, "conv": conv})


def test_auto_under_bf16_leaves_out_paths_that_would_run_float32(monkeypatch):
    _modes(monkeypatch, "fp32", "fp32")

    def make(impl):
        raise AssertionError(f"no path is built when none can compute in bf16 (built {impl})")
    record = conv_select.choose(make, (3, 16, 16), 2, 4, "bf16")
    assert record["impl"] == "stock" and "traceback" not in record
    assert "gemm left out" in record["why"] and "mixed left out" in record["why"]
    assert conv_select.bf16_ignored("mixed") == ["matmul", "conv"] and conv_select.bf16_ignored("stock") == []


def test_auto_under_bf16_weighs_a_path_whose_operations_round(monkeypatch):
    from lpmetrics.models.resnet import resnet18
    _modes(monkeypatch, "bf16", "fp32")   # gemm needs only the matmul; mixed needs the convolution too
    record = conv_select.choose(lambda impl: resnet18(2, [3, 16, 16], conv_impl=impl), (3, 16, 16), 2, 4, "bf16")
    assert "traceback" not in record
    assert set(record["gate"]) == {"gemm"} and "mixed left out" in record["why"]
    assert conv_select.bf16_ignored("gemm") == [] and conv_select.bf16_ignored("mixed") == ["conv"]


def test_under_fp32_nothing_is_left_out(monkeypatch):
    from lpmetrics.models.resnet import resnet18
    _modes(monkeypatch, "fp32", "fp32")
    record = conv_select.choose(lambda impl: resnet18(2, [3, 50, 50], conv_impl=impl), (3, 50, 50), 2, 4, "fp32")
    assert set(record["gate"]) == set(conv_select.CANDIDATES) and "left out" not in record["why"]


def test_an_explicit_path_under_bf16_says_when_it_computes_in_float32(compose_cfg, monkeypatch):
    from lpmetrics.run.builders import conv_path
    _modes(monkeypatch, "fp32", "fp32")
    cfg = compose_cfg(["dataset=cifar10", "model.conv_impl=mixed", "trainer.precision=bf16"])
    record = conv_path(cfg, bundle=None)
    assert record["impl"] == "mixed" and record["precision"] == "bf16"
    assert "matmul and conv" in record["why"] and "float32" in record["why"]
    _modes(monkeypatch, "bf16", "bf16")
    assert conv_path(cfg, bundle=None)["why"] == "model.conv_impl=mixed"


def test_a_torch_without_the_flags_records_unknown_and_leaves_nothing_out(monkeypatch):
    def missing():
        raise AttributeError("no fp32_precision in this torch")
    monkeypatch.setattr(gemm, "_bf16_operands", missing)
    modes = gemm.bf16_math.__wrapped__()
    assert all(m.startswith("unknown (AttributeError") for m in modes.values()) and set(modes) == {"matmul", "conv"}
    monkeypatch.setattr(gemm, "bf16_math", lambda: modes)
    assert conv_select.bf16_ignored("mixed") == []
