"""One GEMM convolution (``models.gemm.conv``: dropped taps, reduced padding, the CPU's im2col
gather, the GEMM) against ``F.conv2d`` in float64 over sizes down to 1x1, kernels, strides and
paddings: output, input gradient and weight gradient."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from lpmetrics.models import gemm
from lpmetrics.models.gemm_plan import Conv


@pytest.mark.parametrize("size,k,s,pad", list(itertools.product([1, 2, 4, 8], [1, 3], [1, 2], [0, 1])))
def test_conv_through_the_gather_equals_conv2d(size, k, s, pad):
    """The whole convolution (dropped taps, reduced padding, gather, GEMM) against ``F.conv2d`` in
    float64: output, input gradient and weight gradient."""
    if size + 2 * pad < k:
        pytest.skip("no output")
    g = torch.Generator().manual_seed(size * 100 + k * 10 + s + pad)
    x = torch.randn(3, 17, size, size, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(5, 17, k, k, dtype=torch.float64, generator=g, requires_grad=True)
    y = F.conv2d(x, w, stride=s, padding=pad)
    up = torch.randn(y.shape, dtype=torch.float64, generator=g)
    y.backward(up)
    x2 = x.detach().clone().requires_grad_()
    w2 = w.detach().clone().requires_grad_()
    y2 = gemm.conv(x2.permute(0, 2, 3, 1).unsqueeze(0), w2.unsqueeze(0), Conv("w", (s, s), (pad, pad)))
    y2.backward(up.permute(0, 2, 3, 1).unsqueeze(0))
    torch.testing.assert_close(y2.squeeze(0).permute(0, 3, 1, 2), y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w2.grad, w.grad, rtol=1e-12, atol=1e-12)


def _against_conv2d(fn, h, w_, kernel, stride, pad, seed):
    """``fn`` (a convolution of :mod:`models.gemm` on ``[1, B, H, W, C]``) against ``F.conv2d`` in
    float64: output, input gradient and weight gradient."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 7, h, w_, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(6, 7, *kernel, dtype=torch.float64, generator=g).contiguous(
        memory_format=torch.channels_last).requires_grad_()
    y = F.conv2d(x, w, stride=stride, padding=pad)
    up = torch.randn(y.shape, dtype=torch.float64, generator=g)
    y.backward(up)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y2 = fn(x2.permute(0, 2, 3, 1).unsqueeze(0), w2.unsqueeze(0), Conv("w", stride, pad))
    y2.backward(up.permute(0, 2, 3, 1).unsqueeze(0))
    torch.testing.assert_close(y2.squeeze(0).permute(0, 3, 1, 2), y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w2.grad, w.grad, rtol=1e-12, atol=1e-12)
    return w2.grad


@pytest.mark.parametrize("seed", range(12))
def test_the_dense_map_equals_conv2d(seed):
    """The whole-map form (``models.gemm.dense``) against ``F.conv2d`` on random small maps,
    rectangular kernels, strides and paddings, including pairs of positions that share no tap (a
    zero in the map) and taps no pair uses (a zero weight gradient, as ``F.conv2d``'s)."""
    g = torch.Generator().manual_seed(1000 + seed)
    pick = lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=g))
    kernel, stride = (pick(1, 3), pick(1, 3)), (pick(1, 2), pick(1, 2))
    pad = (pick(0, kernel[0] - 1), pick(0, kernel[1] - 1))
    h, w_ = pick(max(1, kernel[0] - 2 * pad[0]), 4), pick(max(1, kernel[1] - 2 * pad[1]), 4)
    _against_conv2d(gemm.dense, h, w_, kernel, stride, pad, seed)


def test_the_dense_map_zeroes_the_gradient_of_taps_no_pair_uses():
    """1x1 maps under a 3x3 kernel with padding 1: only the centre tap meets the pixel."""
    grad = _against_conv2d(gemm.dense, 1, 1, (3, 3), (1, 1), (1, 1), 0)
    centre = torch.zeros(3, 3, dtype=torch.bool)
    centre[1, 1] = True
    assert grad[:, :, ~centre].abs().max() == 0 and grad[:, :, centre].abs().max() > 0


@pytest.mark.parametrize("size,k,s,pad,expected", [(2, 3, 1, 1, True), (2, 3, 2, 1, False), (1, 3, 1, 1, False),
                                                  (4, 3, 1, 1, False), (3, 5, 1, 2, True)])
def test_conv_takes_the_dense_map_where_it_multiplies_less(monkeypatch, size, k, s, pad, expected):
    """:func:`models.gemm.conv` computes the whole map where the input has fewer positions than
    the kernel has kept taps (2x2 under 3x3: 4 < 9), im2col + GEMM otherwise (the 2x2 -> 1x1
    stride-2 convolution keeps 4 taps for 4 positions; at 1x1 the centre tap is a plain GEMM)."""
    called = []
    real = gemm.dense
    monkeypatch.setattr(gemm, "dense", lambda *a, **kw: called.append(1) or real(*a, **kw))
    _against_conv2d(gemm.conv, size, size, (k, k), (s, s), (pad, pad), size * k)
    assert bool(called) == expected


def test_the_dense_map_reads_any_strides_and_refuses_an_empty_output():
    """A channels-first ``h`` viewed channels-last (not contiguous) and a pack of three runs with
    row-major weights, against ``F.conv2d`` per run; a kernel larger than the padded input is
    refused with the sizes named."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 2, 5, 2, 2, dtype=torch.float64, generator=g)           # [N, B, C, H, W]
    w = torch.randn(3, 4, 5, 3, 3, dtype=torch.float64, generator=g)           # row-major per run
    got = gemm.dense(x.permute(0, 1, 3, 4, 2), w, Conv("w", (1, 1), (1, 1)))   # a non-contiguous view
    for r in range(3):
        want = F.conv2d(x[r], w[r], padding=1).permute(0, 2, 3, 1)
        torch.testing.assert_close(got[r], want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="no output on a 1x1 input"):
        gemm.conv(torch.randn(1, 2, 1, 1, 3), torch.randn(1, 4, 3, 5, 5), Conv("w", (1, 1), (0, 0)))
