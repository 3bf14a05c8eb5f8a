r"""Learned set-wise surrogate losses (Grabocka, Scholz, Schmidt-Thieme 2019).

Paper: eq. (2)-(5), Algorithm 1, §4.1-4.2.  A permutation-invariant
network approximates any true set loss :math:`\ell` (``surrogate_targets.py``):

.. math::

    \hat\ell(y, \hat y; \beta) = h\Big(\frac1N \sum_{i=1}^N g(y_i, \hat y_i)\Big),
    \qquad g: \mathbb R^2 \to \mathbb R^{30} \;[30, 30], \quad h: \mathbb R^{30} \to \mathbb R
    \;[10, 10, 1].

Bilevel training (Algorithm 1): the model takes :math:`K_\alpha` steps on :math:`\hat\ell`
(eq. (4), lines 4-7: the trainer's ordinary steps, since ``forward`` returns :math:`\hat\ell`),
then, in :meth:`on_step_end` after every :math:`K_\alpha`-th step, the surrogate takes
:math:`K_\beta` steps of its own Adam on the meta-loss (eq. (5), lines 9-12)
:math:`\lvert \ell(y, \hat y(x; \alpha)) - \hat\ell(y, \hat y(x; \alpha); \beta) \rvert` at the
*updated* model :math:`\alpha = \alpha^{(K_\alpha)}`. Modes (§4.2): ``universal`` (SL-U:
pre-train :math:`\beta` on eq. (3), :math:`y \sim \mathrm{Bernoulli}(0.5)`,
:math:`\hat y \sim \mathcal N(0, 1)`, then freeze it), ``scratch`` (SL-S: random :math:`\beta`,
bilevel), ``refined`` (SL-R: pre-train, then bilevel; the paper's recommendation and our default).

As in the paper (the defaults):

* ``beta_scores=fresh``: every surrogate step scores its batch with the model as it is after the
  :math:`K_\alpha` model steps (line 10's :math:`\hat y(x; \alpha)`), one forward pass per step,
  in training mode (``rescore_mode=train``: the scores the model step feeds :math:`\hat\ell`;
  BatchNorm statistics and every other buffer are put back afterwards, so the re-scoring leaves
  no trace on the model).
* Step size and clipping: the surrogate's Adam uses :math:`\eta_\beta = 10^{-5}` (``lr_beta``)
  and its gradient is clipped to norm :math:`10^{-5}` (``clip_beta``), §4.1. The model's side of
  §4.1 (Adam, :math:`\eta_\alpha = 10^{-5}`, the same clipping) belongs to the run's optimizer and
  ``trainer.max_grad_norm=1e-5``, which this objective does not own.

Batches of the surrogate steps: as Algorithm 1 (line 9), each of the :math:`K_\beta` steps draws
a new batch, through the ``draw_batch`` callable the training loop passes to :meth:`on_step_end`:
the next batch of a second, independently seeded stream of the training split
(:data:`lpmetrics.run.loop.SIDE_STREAM_SEED_OFFSET`), so the model's own batches are those of any other objective's run
with the same seed, and the stream's position is checkpointed (a resumed run draws the same
batches). Without ``draw_batch`` (a caller of the hook that has no second stream; the packed
launcher refuses these runs) the steps cycle through the inputs of the round's :math:`K_\alpha`
training batches, re-scored at the updated model: fresh scores, reused inputs.

Departures (ours):

* ``beta_scores=stale``: the steps reuse the scores the :math:`K_\alpha` training forward passes
  produced (detached), up to :math:`K_\alpha` model steps old: no extra forward pass, no BatchNorm
  handling.
* ``lr_beta=1e-3 clip_beta=null``: a larger, unclipped step for short runs: the paper's
  :math:`10^{-5}` is tuned for 300k iterations and our runs are 40k (or a few thousand on a CPU):
  at :math:`10^{-5}` a surrogate from scratch (SL-S) barely moves in such a budget.
* :math:`\hat y` is the logit margin :math:`l_1 - l_0` (an unbounded real score, matching the
  :math:`\mathcal N(0, 1)` pre-training draws and the threshold :math:`\hat y \ge \tau`).
* Batches are the trainer's (not stratified 50/50 as in the paper), and the model's optimizer
  is the run's ``optimizer=`` (the paper uses Adam for the model too).
* SL-U's budget is ours (the paper gives none): ``pretrain_steps`` x ``pretrain_sets`` random
  sets of ``pretrain_set_size``, run on CPU when the objective is built (a few seconds).
* Activations: LeakyReLU in :math:`g` and :math:`h` (the paper names only the prediction
  model's); ``pretrain_max_shift > 0`` optionally adds per-set class shifts
  :math:`\hat y_i \sim \mathcal N(\mu y_i, 1)`, :math:`\mu \sim U(-m, m)`, so SL-U also sees
  AUCs far from 1/2 (0 = the paper's eq. (3)).
* The surrogate Adam's state travels in ``state_dict`` (``_extra_state``) for resumes; the
  round's cached batches do not, so under ``beta_scores=stale`` (or without ``draw_batch``) a run
  resumed mid-round fits its first round on fewer batches (with ``draw_batch`` the cache is not
  read, and a resumed run is bit-identical to an uninterrupted one).

Example::

    >>> obj = LearnedSurrogate(target="auc", mode="scratch")
    >>> loss = obj(torch.randn(8, 2), torch.tensor([0, 1] * 4))
    >>> loss.shape
    torch.Size([])
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from lpmetrics.baselines.surrogate_targets import target_loss
from lpmetrics.objectives.base import Objective
from lpmetrics.objectives.common import binary_scores, check_labels

MODES = ("universal", "scratch", "refined")
BETA_SCORES = ("fresh", "stale")
RESCORE_MODES = ("train", "eval")


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


@contextmanager
def scoring(model: nn.Module, mode: str) -> Iterator[None]:
    """No-grad scoring by ``model`` in ``mode`` (``train`` | ``eval``) that leaves no trace: the
    train/eval flag and every buffer (BatchNorm running statistics, ``num_batches_tracked``) are
    as before afterwards. Dropout still draws from torch's global RNG (seeded, so reproducible)."""
    saved = [b.detach().clone() for b in model.buffers()]
    was_training = model.training
    model.train(mode == "train")
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
        with torch.no_grad():
            for buf, old in zip(model.buffers(), saved):
                buf.copy_(old)


class LearnedSurrogate(Objective):
    """Learned surrogate :math:`\\hat\\ell` of a true set loss, trained bilevel (module docstring).

    Args:
        target: true loss ``auc | ap | f1 | mcr | jaccard | mcc | eer`` (1 - x for metrics).
        mode: ``universal`` (SL-U), ``scratch`` (SL-S) or ``refined`` (SL-R).
        threshold: :math:`\\tau` of the thresholded losses (F1, MCR, Jaccard, MCC).
        k_alpha, k_beta: model steps per round, surrogate steps per round (paper: 3, 10).
        beta_scores: ``fresh`` (Algorithm 1: the surrogate steps score their batches with the
            updated model) or ``stale`` (reuse the round's training scores).
        rescore_mode: the model's mode for ``fresh`` scores: ``train`` (as the model step sees
            them; buffers restored) or ``eval``.
        lr_beta: the surrogate's Adam step size (paper: 1e-5).
        clip_beta: max norm of the surrogate's gradient before each step (paper: 1e-5; None = off).
        pretrain_*: SL-U pre-training budget (steps x sets of ``pretrain_set_size`` examples).
        g_sizes, h_sizes: hidden sizes of :math:`g` and :math:`h` (paper: [30, 30], [10, 10, 1]).
    """

    def __init__(self, target: str = "auc", mode: str = "refined", threshold: float = 0.0,
                 k_alpha: int = 3, k_beta: int = 10, beta_scores: str = "fresh",
                 rescore_mode: str = "train", lr_beta: float = 1e-5, clip_beta: float | None = 1e-5,
                 pretrain_steps: int = 1000, pretrain_sets: int = 32, pretrain_set_size: int = 100,
                 pretrain_lr: float = 3e-3, pretrain_seed: int = 0, pretrain_max_shift: float = 0.0,
                 g_sizes=(30, 30), h_sizes=(10, 10, 1)) -> None:
        super().__init__()
        for name, value, allowed in (("mode", mode, MODES), ("beta_scores", beta_scores, BETA_SCORES),
                                     ("rescore_mode", rescore_mode, RESCORE_MODES)):
            if value not in allowed:
                hint = " (SL-U, SL-S, SL-R)" if name == "mode" else ""
                raise ValueError(f"objective.{name} must be one of {allowed}{hint}; got {value!r}")
        if k_alpha < 1 or k_beta < 0:
            raise ValueError(f"need k_alpha >= 1 and k_beta >= 0; got {k_alpha}, {k_beta}")
        if not lr_beta > 0 or (clip_beta is not None and not clip_beta > 0):
            raise ValueError(f"need lr_beta > 0 and clip_beta > 0 or null; got {lr_beta}, {clip_beta}"
                             " (the paper's values: 1e-5 and 1e-5)")
        self.target, self.mode, self.threshold = target, mode, float(threshold)
        self.loss_fn = target_loss(target)
        self.k_alpha, self.k_beta = int(k_alpha), int(k_beta)
        self.beta_scores, self.rescore_mode = beta_scores, rescore_mode
        self.clip_beta = None if clip_beta is None else float(clip_beta)
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
        # this round's K_alpha training batches: (scores, labels) for stale, (inputs, labels) for fresh
        self._recent: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._model_steps = 0

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        labels = check_labels(logits, labels)
        s = binary_scores(logits, "margin")
        loss = self.net(labels, s)
        with torch.no_grad():
            true = self.loss_fn(labels, s.detach(), self.threshold)
        if self.mode != "universal" and self.training and self.beta_scores == "stale":
            self._recent = (self._recent + [(s.detach(), labels.detach())])[-self.k_alpha:]
        self.record(surrogate_hat=loss.item())
        if not torch.isnan(true):
            self.record(surrogate_true=true.item(), surrogate_gap=abs(true.item() - loss.item()))
        return loss

    def on_step_end(self, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    batch: tuple[torch.Tensor, torch.Tensor],
                    draw_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """Count the model step; after every ``k_alpha``-th, the ``k_beta`` surrogate steps.

        ``draw_batch`` (``train.py`` passes it: :func:`objectives.base.draws_batches`) returns a
        new training batch ``(x, y)`` for each surrogate step, as Algorithm 1, line 9 samples one;
        without it the steps reuse the round's inputs. ``beta_scores=stale`` never calls it."""
        self._model_steps += 1
        if self.mode == "universal":
            return
        if self.beta_scores == "fresh":
            x, y = batch
            self._recent = (self._recent + [(x.detach(), y.detach())])[-self.k_alpha:]
        if self._model_steps % self.k_alpha or not self._recent:
            return
        if self.beta_scores == "stale":
            sets = (self._recent[k % len(self._recent)] for k in range(self.k_beta))
        else:
            sets = self._fresh_sets(model, draw_batch)
        self.fit_surrogate(sets)
        self._recent = []   # the next round collects its own K_alpha batches

    def _fresh_sets(self, model: nn.Module, draw_batch) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``k_beta`` (scores, labels) at the current model, one forward pass each, lazily (the
        model does not change during the surrogate steps, so scoring on demand is exact)."""
        for k in range(self.k_beta):
            x, y = draw_batch() if draw_batch is not None else self._recent[k % len(self._recent)]
            with scoring(model, self.rescore_mode):
                s = binary_scores(model(x).float(), "margin")
            yield s, check_labels(s, y.to(s.device))

    def fit_surrogate(self, sets) -> float:
        """Eq. (5): one Adam step on :math:`|\\ell - \\hat\\ell|` per ``(scores, labels)`` set
        (gradient clipped to ``clip_beta``); a set whose true loss is undefined (NaN: one class
        for AUC / EER) is skipped. Returns the mean meta-loss (NaN if every set was skipped)."""
        metas = []
        for s, y in sets:
            true = self.loss_fn(y, s, self.threshold)
            if torch.isnan(true):
                continue
            meta = (self.net(y, s) - true.to(s.dtype)).abs()
            self.opt.zero_grad(set_to_none=True)
            meta.backward()
            if self.clip_beta is not None:
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.clip_beta)
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
