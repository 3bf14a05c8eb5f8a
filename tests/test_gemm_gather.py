"""The CPU im2col of the GEMM convolution (``models.gemm._Gather``): its hand-written backward
against finite differences (``gradcheck``, float64) and against autograd through ``unfold``, over
strides, paddings, dropped taps, packs and odd sizes."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from lpmetrics.models import gemm
from lpmetrics.models.gemm_plan import Conv

GEOMETRIES = [   # (H, W, k, stride, padding)
    (8, 8, 3, 1, 1), (4, 4, 3, 2, 1), (2, 2, 3, 1, 1), (2, 2, 3, 2, 1), (5, 3, 3, 1, 1),
    (7, 6, 3, 2, 1), (8, 8, 1, 2, 0), (3, 3, 3, 1, 0), (6, 5, 5, 2, 2), (1, 4, 3, 1, 1),
]


def reference(h, rk, ck, stride, pads, ho, wo):
    """Patches by padding and ``unfold`` (autograd's own backward)."""
    top, bottom, left, right = pads
    p = F.pad(h, (0, 0, left, right, top, bottom)).unfold(2, rk, stride[0]).unfold(3, ck, stride[1])
    n, b, c = h.shape[0], h.shape[1], h.shape[-1]
    return p[:, :, :ho, :wo].permute(0, 1, 2, 3, 5, 6, 4).reshape(n, b * ho * wo, rk * ck * c)


def case(geometry):
    height, width, k, s, pad = geometry
    _, rk, top, bottom, ho = gemm.taps(height, k, s, pad)
    _, ck, left, right, wo = gemm.taps(width, k, s, pad)
    return rk, ck, (s, s), (top, bottom, left, right), ho, wo


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("n", [1, 3])
def test_gather_matches_unfold_forward_and_backward(geometry, n):
    rk, ck, stride, pads, ho, wo = case(geometry)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        h = torch.randn(n, 2, geometry[0], geometry[1], 4, dtype=torch.float64, generator=g)
        a, b = h.clone().requires_grad_(), h.clone().requires_grad_()
        out = gemm._Gather.apply(a, rk, ck, stride, pads, ho, wo)
        ref = reference(b, rk, ck, stride, pads, ho, wo)
        assert torch.equal(out, ref)
        up = torch.randn(ref.shape, dtype=torch.float64, generator=g)
        out.backward(up)
        ref.backward(up)
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("geometry", GEOMETRIES[:6])
def test_gather_gradcheck(geometry):
    rk, ck, stride, pads, ho, wo = case(geometry)
    h = torch.randn(2, 2, geometry[0], geometry[1], 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: gemm._Gather.apply(x, rk, ck, stride, pads, ho, wo), (h,))


def test_gather_backward_takes_strided_inputs_and_is_deterministic():
    """A channels-last view of NCHW memory (what the stem's output can be) and two backward passes
    bit for bit."""
    h = torch.randn(1, 4, 6, 6, 20, dtype=torch.float64).permute(0, 1, 3, 2, 4).requires_grad_()
    rk, ck, stride, pads, ho, wo = case((6, 6, 3, 1, 1))
    up = torch.randn(1, 4 * ho * wo, rk * ck * 20, dtype=torch.float64)
    grads = []
    for _ in range(2):
        h.grad = None
        gemm._Gather.apply(h, rk, ck, stride, pads, ho, wo).backward(up)
        grads.append(h.grad.clone())
    assert torch.equal(grads[0], grads[1])
    ref = h.detach().clone().requires_grad_()
    reference(ref, rk, ck, stride, pads, ho, wo).backward(up)
    torch.testing.assert_close(grads[0], ref.grad, rtol=1e-13, atol=1e-13)


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
