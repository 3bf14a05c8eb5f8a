"""NMF LP layer (objectives/nmf.py): recovers the anchor rows of a planted separable factorisation."""
from __future__ import annotations

import pytest
import torch

from lpmetrics.objectives.nmf import NMFLayer


def planted(seed: int, s: int = 10, w: int = 12, r: int = 3):
    g = torch.Generator().manual_seed(seed)
    W0 = torch._sample_dirichlet(torch.full((r, w), 0.5, dtype=torch.float64), generator=g)
    M = torch._sample_dirichlet(torch.ones(s - r, r, dtype=torch.float64), generator=g)
    perm = torch.randperm(s, generator=g)
    F = torch.cat([torch.eye(r, dtype=torch.float64), M])[perm]
    anchors = sorted(torch.nonzero(perm < r)[:, 0].tolist())
    return F @ W0, anchors


def check_recovery(layer, seed, noise=0.0):
    V, anchors = planted(seed)
    if noise:
        V = V + noise * torch.rand(V.shape, generator=torch.Generator().manual_seed(99), dtype=V.dtype)
    out = layer(V)
    assert sorted(out.anchors.tolist()) == anchors
    Vn = V / V.sum(1, keepdim=True)
    assert (out.F @ out.W - Vn).abs().max() < 1e-6 + 10 * noise
    return out


@pytest.mark.parametrize("seed", range(4))
def test_highs_reference_recovers_planted_anchors(seed):
    out = check_recovery(NMFLayer(rank=3, method="highs"), seed)
    torch.testing.assert_close(torch.diagonal(out.C)[out.anchors], torch.ones(3, dtype=torch.float64))


def test_small_noise_keeps_the_anchors():
    check_recovery(NMFLayer(rank=3, method="highs"), 0, noise=1e-3)


def test_solver_recovers_planted_anchors_with_gradient():
    V, anchors = planted(1)
    V = V.clone().requires_grad_(True)
    out = NMFLayer(rank=3)(V)
    assert sorted(out.anchors.tolist()) == anchors
    (out.F.sum() + out.W.square().sum()).backward()
    assert torch.isfinite(V.grad).all()


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="nonnegative"):
        NMFLayer(rank=1)(-torch.ones(4, 3))
    with pytest.raises(ValueError, match="s > rank"):
        NMFLayer(rank=4)(torch.ones(4, 3))
