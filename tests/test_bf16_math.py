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
    assert set(modes) == {"matmul", "conv"} and set(modes.values()) <= {"bf16", "fp32"}
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
