r"""Learned set-wise surrogate losses (Grabocka, Scholz, Schmidt-Thieme 2019).

Seed: ``../shared/seeds/004_*.txt`` (eq. (2)-(5), Algorithm 1, §4.1-4.2).  A permutation-invariant
network approximates any true set loss :math:`\ell` (``surrogate_targets.py``):

.. math::

    \hat\ell(y, \hat y; \beta) = h\Big(\frac1N \sum_{i=1}^N g(y_i, \hat y_i)\Big),
    \qquad g: \mathbb R^2 \to \mathbb R^{30} \;[30, 30], \quad h: \mathbb R^{30} \to \mathbb R
    \;[10, 10, 1].

Bilevel training (Algorithm 1): the model takes :math:`K_\alpha` steps on :math:`\hat\ell`
(eq. (4): the trainer's ordinary steps, since ``forward`` returns :math:`\hat\ell`), then the
surrogate takes :math:`K_\beta` steps of its own Adam on the meta-loss (eq. (5))
:math:`\lvert \ell(y, \hat y) - \hat\ell(y, \hat y; \beta) \rvert` inside :meth:`on_step_end`.
Modes (§4.2): ``universal`` (SL-U: pre-train :math:`\beta` on eq. (3),
:math:`y \sim \mathrm{Bernoulli}(0.5)`, :math:`\hat y \sim \mathcal N(0, 1)`, then freeze it),
``scratch`` (SL-S: random :math:`\beta`, bilevel), ``refined`` (SL-R: pre-train, then bilevel;
the paper's recommendation and our default).

Deliberate deviations (and choices the paper leaves open):

* :math:`\hat y` is the logit margin :math:`l_1 - l_0` (an unbounded real score, matching the
  :math:`\mathcal N(0, 1)` pre-training draws and the threshold :math:`\hat y \ge \tau`).
* The :math:`K_\beta` surrogate steps reuse the scores of the last :math:`K_\alpha` training
  batches (detached from their forward pass), cycling through them, instead of drawing new
  batches at the updated :math:`\alpha`: no extra forward passes, no BatchNorm side effects;
  the scores are at most :math:`K_\alpha` steps stale.
* Step sizes: the paper uses Adam with :math:`10^{-5}` for 300k iterations and clips gradients
  at norm :math:`10^{-5}`; our runs are 40k steps, so the surrogate's Adam uses ``lr_beta`` =
  1e-3 and no clipping (the trainer's ``max_grad_norm`` still applies to the model).
* Batches are the trainer's (not stratified 50/50 as in the paper), and the model's optimizer
  is the run's ``optimizer=`` (the paper uses Adam for the model too).
* SL-U's budget is ours (the paper gives none): ``pretrain_steps`` x ``pretrain_sets`` random
  sets of ``pretrain_set_size``, run on CPU when the objective is built (a few seconds).
* Activations: LeakyReLU in :math:`g` and :math:`h` (the paper names only the prediction
  model's); ``pretrain_max_shift > 0`` optionally adds per-set class shifts
  :math:`\hat y_i \sim \mathcal N(\mu y_i, 1)`, :math:`\mu \sim U(-m, m)`, so SL-U also sees
  AUCs far from 1/2 (0 = the paper's eq. (3)).
* The surrogate Adam's state travels in ``state_dict`` (``_extra_state``) for resumes.

Example::

    >>> obj = LearnedSurrogate(target="auc", mode="scratch")
    >>> loss = obj(torch.randn(8, 2), torch.tensor([0, 1] * 4))
    >>> loss.shape
    torch.Size([])
"""
from __future__ import annotations

import torch
from torch import nn

from baselines.surrogate_targets import target_loss
from objectives.base import Objective
from objectives.common import binary_scores, check_labels

MODES = ("universal", "scratch", "refined")


def mlp(sizes: list[int], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if last_activation or k < len(sizes) - 2:
            layers.append(nn.LeakyReLU(0.01))
    return nn.Sequential(*layers)


class SetSurrogate(nn.Module):
    """:math:`\\hat\\ell(y, \\hat y) = h(\\mathrm{mean}_i\\, g(y_i, \\hat y_i))` on ``[..., N]``."""

    def __init__(self, g_sizes=(30, 30), h_sizes=(10, 10, 1)) -> None:
        super().__init__()
        if h_sizes[-1] != 1:
            raise ValueError(f"h must end in one output unit; got h_sizes={list(h_sizes)}")
        self.g = mlp([2, *g_sizes], last_activation=True)
        self.h = mlp([g_sizes[-1], *h_sizes], last_activation=False)

    def forward(self, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        z = torch.stack([y.to(s.dtype), s], dim=-1)
        return self.h(self.g(z).mean(dim=-2)).squeeze(-1)


def pretrain_universal(net: SetSurrogate, loss_fn, *, steps: int, sets: int, set_size: int,
                       lr: float, seed: int, max_shift: float = 0.0, threshold: float = 0.0
                       ) -> float:
    """Eq. (3): fit ``net`` to ``loss_fn`` on random sets; returns the last 10 steps' mean L1."""
    gen = torch.Generator().manual_seed(seed)
    device = next(net.parameters()).device
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    recent: list[float] = []
    for _ in range(steps):
        y = (torch.rand(sets, set_size, generator=gen) < 0.5).float()
        mu = (2 * torch.rand(sets, 1, generator=gen) - 1) * max_shift
        s = torch.randn(sets, set_size, generator=gen) + mu * y
        y, s = y.to(device), s.to(device)
        true = loss_fn(y, s, threshold).float()
        keep = ~torch.isnan(true)
        meta = (net(y[keep], s[keep]) - true[keep]).abs().mean()
        opt.zero_grad()
        meta.backward()
        opt.step()
        recent = (recent + [meta.item()])[-10:]
    opt.zero_grad(set_to_none=True)
    return sum(recent) / max(len(recent), 1)


class LearnedSurrogate(Objective):
    """Learned surrogate :math:`\\hat\\ell` of a true set loss, trained bilevel (module docstring).

    Args:
        target: true loss ``auc | ap | f1 | mcr | jaccard | mcc | eer`` (1 - x for metrics).
        mode: ``universal`` (SL-U), ``scratch`` (SL-S) or ``refined`` (SL-R).
        threshold: :math:`\\tau` of the thresholded losses (F1, MCR, Jaccard, MCC).
        k_alpha, k_beta: model steps per round, surrogate steps per round (paper: 3, 10).
        lr_beta: the surrogate's Adam step size.
        pretrain_*: SL-U pre-training budget (steps x sets of ``pretrain_set_size`` examples).
        g_sizes, h_sizes: hidden sizes of :math:`g` and :math:`h` (paper: [30, 30], [10, 10, 1]).
    """

    def __init__(self, target: str = "auc", mode: str = "refined", threshold: float = 0.0,
                 k_alpha: int = 3, k_beta: int = 10, lr_beta: float = 1e-3,
                 pretrain_steps: int = 1000, pretrain_sets: int = 32, pretrain_set_size: int = 100,
                 pretrain_lr: float = 3e-3, pretrain_seed: int = 0, pretrain_max_shift: float = 0.0,
                 g_sizes=(30, 30), h_sizes=(10, 10, 1)) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES} (SL-U, SL-S, SL-R); got {mode!r}")
        if k_alpha < 1 or k_beta < 0:
            raise ValueError(f"need k_alpha >= 1 and k_beta >= 0; got {k_alpha}, {k_beta}")
        self.target, self.mode, self.threshold = target, mode, float(threshold)
        self.loss_fn = target_loss(target)
        self.k_alpha, self.k_beta = int(k_alpha), int(k_beta)
        self.pretrain_mae = float("nan")
        if mode == "scratch":
            self.net = SetSurrogate(tuple(g_sizes), tuple(h_sizes))  # the run's seed decides
        else:  # a pure function of the config: every run seed refines the same SL-U surrogate
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(pretrain_seed)
                self.net = SetSurrogate(tuple(g_sizes), tuple(h_sizes))
            self.pretrain_mae = pretrain_universal(
                self.net, self.loss_fn, steps=pretrain_steps, sets=pretrain_sets,
                set_size=pretrain_set_size, lr=pretrain_lr, seed=pretrain_seed,
                max_shift=pretrain_max_shift, threshold=self.threshold)
            self.record(surrogate_pretrain_mae=self.pretrain_mae)
        if mode == "universal":
            self.net.requires_grad_(False)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr_beta)
        self._recent: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._model_steps = 0

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        labels = check_labels(logits, labels)
        s = binary_scores(logits, "margin")
        loss = self.net(labels, s)
        with torch.no_grad():
            true = self.loss_fn(labels, s.detach(), self.threshold)
        if self.mode != "universal" and self.training:
            self._recent = (self._recent + [(s.detach(), labels.detach())])[-self.k_alpha:]
        self.record(surrogate_hat=loss.item())
        if not torch.isnan(true):
            self.record(surrogate_true=true.item(), surrogate_gap=abs(true.item() - loss.item()))
        return loss

    def on_step_end(self, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._model_steps += 1
        if self.mode == "universal" or self._model_steps % self.k_alpha or not self._recent:
            return
        self.fit_surrogate(self._recent, self.k_beta)

    def fit_surrogate(self, scored: list[tuple[torch.Tensor, torch.Tensor]], steps: int) -> float:
        """Eq. (5): ``steps`` Adam steps on :math:`|\\ell - \\hat\\ell|`, cycling over
        ``(scores, labels)`` sets; returns the mean meta-loss (NaN if every set was degenerate)."""
        metas = []
        targets = [self.loss_fn(y, s, self.threshold) for s, y in scored]
        for k in range(steps):
            (s, y), true = scored[k % len(scored)], targets[k % len(scored)]
            if torch.isnan(true):
                continue
            meta = (self.net(y, s) - true.to(s.dtype)).abs()
            self.opt.zero_grad(set_to_none=True)
            meta.backward()
            self.opt.step()
            metas.append(meta.item())
        self.opt.zero_grad(set_to_none=True)  # leave no surrogate gradients behind
        mean = sum(metas) / len(metas) if metas else float("nan")
        if metas:
            self.record(surrogate_meta=mean)
        return mean

    def get_extra_state(self) -> dict:
        return {"opt": self.opt.state_dict(), "model_steps": self._model_steps}

    def set_extra_state(self, state: dict) -> None:
        self.opt.load_state_dict(state["opt"])
        self._model_steps = state["model_steps"]
