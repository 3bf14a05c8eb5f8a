r"""Perturbed LP optimizer (Berthet et al. 2020, "Learning with Differentiable Perturbed
Optimizers", NeurIPS), the third column of Meng et al. 2021, Table 3: an LP solved by HiGHS on
Gaussian perturbations of its cost vector.

For fixed data :math:`(A, b, A_{eq}, b_{eq})` and the vertex map
:math:`z^*(c) = \arg\min_{z\ge0} c^\top z` s.t. :math:`Az \le b,\ A_{eq}z = b_{eq}`, the perturbed
optimizer is the smooth function

.. math::

    z_\sigma(c) = \mathbb E_{Z \sim \mathcal N(0, I)}\bigl[z^*(c + \sigma Z)\bigr],
    \qquad
    J_c z_\sigma(c) = \frac{1}{\sigma}\,\mathbb E\bigl[z^*(c + \sigma Z)\, Z^\top\bigr]

(Berthet et al., §3, with :math:`\nabla\nu(Z) = Z` for the Gaussian; the sign is the same
for a minimiser since :math:`Z` and :math:`-Z` are equal in law).  Both expectations are
estimated with the same :math:`N` samples :math:`Z_1..Z_N` (``n_samples``): the forward returns
:math:`\bar z = \tfrac1N\sum_k z^*(c + \sigma Z_k)` and the backward, for incoming
:math:`g = \partial L/\partial z`,

.. math::

    \nabla_c = \frac{1}{N\sigma}\sum_k \bigl(g^\top z^*(c + \sigma Z_k)\bigr) Z_k .

Cost: :math:`N` LP solves per instance in the forward (Table 3: ":math:`N` times" the time), none
in the backward.  Deviations: Gaussian noise only (no Gumbel); no control variate (the estimator
is the paper's, unbiased but noisy for small :math:`N`); gradients flow to ``c`` only.
No training objective is built on it: on the AUC cost LP (:func:`baselines.blackbox.auc_cost_lp`,
~1000 pairs at batch 64) every coordinate of the estimate carries the noise of the scalar
:math:`g^\top z^*(c + \sigma Z_k)` times :math:`Z_k`, and its signal-to-noise ratio measured
at :math:`N = 10` was about 0.002 (gradients of order 3 where the true one is of order 0.01).

Example::

    >>> A = torch.tensor([[1.0, 1.0]]); b = torch.tensor([1.0])
    >>> layer = PerturbedLP(A, b, sigma=0.5, n_samples=100, seed=0)
    >>> c = torch.tensor([-1.0, -0.8], requires_grad=True)
    >>> z = layer(c)          # ~[0.61, 0.39]: a probability over the vertices
    >>> z[0].backward()       # c.grad ~ d z_sigma[0] / dc
"""
from __future__ import annotations

import torch
from torch import nn

from lpmetrics.baselines.blackbox import HighsLP


class _PerturbedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, c, lp: HighsLP, sigma: float, noise: torch.Tensor):
        # noise [N, *c.shape]; every perturbed cost solved by HiGHS
        zs = lp(c.unsqueeze(0) + sigma * noise)
        ctx.sigma = sigma
        ctx.save_for_backward(noise, zs)
        return zs.mean(0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_z):
        noise, zs = ctx.saved_tensors
        weights = (zs * grad_z.unsqueeze(0)).sum(-1, keepdim=True)   # g^T z*(c + sigma Z_k)
        return (weights * noise).mean(0) / ctx.sigma, None, None, None


class PerturbedLP(nn.Module):
    """LP layer ``c -> z_sigma(c)`` (Monte-Carlo mean of perturbed vertices), module docstring.

    Args:
        A, b, A_eq, b_eq: LP data (as :class:`baselines.blackbox.BlackboxLP`).
        sigma: noise scale (> 0), in cost units: the smoothing width of ``z_sigma``.
        n_samples: perturbations ``N`` per instance and call (Table 3's ``N``).
        seed: seeds a private generator (reproducible noise); ``None`` uses torch's global RNG.
        method: scipy's HiGHS variant.

    ``forward(c, noise=None)``: ``c [n]`` or ``[B, n]``; ``noise [N, *c.shape]`` overrides the
    draw (common random numbers, e.g. for finite differences).
    """

    def __init__(self, A, b, A_eq=None, b_eq=None, *, sigma: float = 0.1, n_samples: int = 10,
                 seed: int | None = None, method: str = "highs") -> None:
        super().__init__()
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0 (the perturbation scale); got {sigma}")
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1; got {n_samples}")
        self.lp = HighsLP(A, b, A_eq, b_eq, method=method)
        self.sigma, self.n_samples = float(sigma), int(n_samples)
        self.generator = None if seed is None else torch.Generator().manual_seed(int(seed))

    def sample_noise(self, c: torch.Tensor) -> torch.Tensor:
        noise = torch.randn((self.n_samples, *c.shape), generator=self.generator,
                            dtype=torch.float64)
        return noise.to(device=c.device, dtype=c.dtype)

    def forward(self, c: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        if c.shape[-1] != self.lp.n or c.dim() > 2:
            raise ValueError(f"c must be [n] or [B, n] with n = {self.lp.n}; got {tuple(c.shape)}")
        if noise is None:
            noise = self.sample_noise(c)
        elif noise.shape[1:] != c.shape:
            raise ValueError(f"noise must be [N, *c.shape] = [N, {', '.join(map(str, c.shape))}];"
                             f" got {tuple(noise.shape)}")
        return _PerturbedFn.apply(c, self.lp, self.sigma, noise.to(c))

    def extra_repr(self) -> str:
        return f"n={self.lp.n}, sigma={self.sigma}, n_samples={self.n_samples}"

