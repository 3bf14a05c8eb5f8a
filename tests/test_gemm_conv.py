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
