r"""Sketched Newton directions (Meng et al. 2021, sec. 4.1, eq. 6-7; "sufficient dimension
reduction").

The gradient stays exact; only the Hessian's big term is replaced by a sketch,
:math:`A^\top W_A A \approx (S W_A^{1/2} A)^\top (S W_A^{1/2} A)` with a fresh
:math:`S \in \mathbb R^{k\times m}` each iteration and :math:`\mathbb E[S^\top S] = I` -- the
iterative Hessian sketch of Pilanci & Wainwright (2016).  ``"gaussian"``: i.i.d.
:math:`N(0, 1/k)` entries; ``"sampling"``: ``k`` of the violated rows drawn uniformly with
replacement, scaled by :math:`\sqrt{m_{act}/k}`.  Because the gradient and the KKT check are
exact, the sketch changes the path (and cost) of Newton, not the returned solution.

The sketched system is ``[B, n, n]`` and solved by Cholesky, so it suits moderate ``n`` with a
large ``m`` (the regime of the paper).  ``A.rmatvec`` must accept an extra leading dimension
(all operators of this package do when unbatched; dense ones always).
"""
from __future__ import annotations

import torch


class HessianSketch:
    def __init__(self, kind: str, size: int, seed: int):
        self.kind, self.size = kind, size
        self.gen = torch.Generator().manual_seed(seed)

    def _rows(self, prob, wA):
        """``S W^{1/2}`` as a dense ``[k, B, m]``."""
        k, B, m = self.size, prob.B, prob.m
        if self.kind == "gaussian":
            S = torch.randn(k, B, m, generator=self.gen, dtype=prob.dtype) / k ** 0.5
            return S.to(prob.device) * wA
        counts = wA.sum(-1)                                    # [B]
        u = torch.rand(k, B, generator=self.gen, dtype=prob.dtype).to(prob.device)
        # the j-th violated row of instance b, j uniform: invert the cumulative count
        csum = wA.cumsum(-1)                                   # [B, m]
        target = (u * counts).floor() + 1                      # [k, B] in 1..count
        idx = torch.searchsorted(csum.contiguous(), target.T.contiguous()).T.clamp_max(m - 1)
        S = torch.zeros(k, B, m, dtype=prob.dtype, device=prob.device)
        scale = (counts / k).sqrt().expand(k, B)
        return S.scatter(-1, idx.unsqueeze(-1), scale.unsqueeze(-1))

    def solve(self, prob, wA, wz, delta, grad):
        SA = prob.A.rmatvec(self._rows(prob, wA))             # [k, B, n] = rows of S W A
        SA = SA.expand(self.size, prob.B, prob.n).permute(1, 0, 2)
        H = SA.transpose(-1, -2) @ SA + torch.diag_embed(wz + delta.unsqueeze(-1))
        if prob.A_eq is not None:
            ones = torch.ones(prob.B, prob.p, dtype=H.dtype, device=H.device)
            H = H + prob.A_eq.gram(ones).expand_as(H)
        L, info = torch.linalg.cholesky_ex(H)
        if bool((info > 0).any()):
            L = torch.linalg.cholesky(H + torch.diag_embed(
                (1e3 * delta).unsqueeze(-1).expand_as(wz)))
        return torch.cholesky_solve(grad.unsqueeze(-1), L).squeeze(-1)


def make_sketch(prob, opts):
    if opts.sketch is None:
        return None
    return HessianSketch(opts.sketch, opts.sketch_size or 4 * prob.n, opts.sketch_seed)
