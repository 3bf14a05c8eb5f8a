r"""F1, F-beta, Jaccard and precision@recall as LP losses (Meng et al., ICLR 2021 version,
§2.4 and A.2; Meng et al. 2021 §3.4).  The LP construction (Charnes-Cooper, box constraints tying
:math:`\hat Y` to :math:`\phi(f(x))`, the LICQ safeguard) lives in :mod:`objectives.fractional`;
this module only says which ratio each metric is, with :math:`Y` the labels and
:math:`P = \mathbb 1^\top Y`:

* F1 (eq. 11): :math:`2Y^\top\hat Y / (\mathbb 1^\top\hat Y + P)`;
* F-beta (eq. 14): :math:`(1+\beta^2)Y^\top\hat Y / (\mathbb 1^\top\hat Y + \beta^2 P)`;
* Jaccard (eq. 13): :math:`Y^\top\hat Y / ((\mathbb 1 - Y)^\top\hat Y + P)`;
* P@R (eq. 15-16): :math:`Y^\top\hat Y / \mathbb 1^\top\hat Y` with the row
  :math:`Y^\top\hat Y \ge \alpha P`.

The loss is :math:`-\mathrm{OPT}` (minimising it maximises the relaxed metric).  Because the
relaxation only moves :math:`\hat Y_i` inside :math:`[\max(0,\phi_i), \min(1, 1+\phi_i)]`, the
optimum puts positives at the top and negatives at the bottom of their boxes, so the gradient
raises :math:`\phi` of positives with :math:`\phi_i < 0` and lowers :math:`\phi` of negatives with
:math:`\phi_i > 0`; with :math:`\phi = \pm 1` the LP value is the metric of the thresholded
predictions.  :math:`\phi = 2\,\mathrm{softmax}_1 - 1 = \tanh((l_1 - l_0)/2)` by default.

Knobs: ``phi`` (score transform, below), ``bound``, ``margin``, ``safeguard`` (LICQ, see
:mod:`objectives.fractional`), ``backward`` / ``solver`` options; ``beta`` (F-beta), ``alpha`` and
``recall_penalty`` (P@R).  A batch without positives has no defined ratio: zero loss,
``degenerate_batches`` counts it.

**Why the paper's relaxation needs help, and the recipe the configs use.**  The class defaults are
the paper's LP as written (``phi="softmax"``, ``bound="upper"``, ``margin=0``).  Two facts make it
a poor training loss on its own:

1. *Its optimum rewards uncertainty.*  At :math:`\phi \equiv 0` (every probability 0.5) every box
   is :math:`[0, 1]`, :math:`\hat Y = Y` is feasible and the LP value is 1, the best possible
   (test: ``test_paper_relaxation_is_maximal_at_the_constant_score``).  Maximising an *upper*
   bound of the metric rewards loose boxes; only misclassified samples get a gradient (a
   perceptron without margin), so margins stay tiny and eval-mode predictions flip.
2. *F1's gradient favours positives, and softmax saturates.*  :math:`\partial F_1/\partial\hat Y_i
   = 2(FP + P)/(S + P)^2` for a positive but :math:`-2\,TP/(S+P)^2` for a negative
   (:math:`S = \mathbb 1^\top \hat Y`), so for an uninformed network the shared bias drifts up;
   once :math:`|l_1 - l_0|` is large, :math:`\tanh'` kills the gradient and the network stays at
   "all positive" (F1 = 2/3 on balanced data, the local optimum the paper reports for CVXPY-SCS
   and AP-Perf).

Measured on Cat&Dog, ResNet-18, 2,000 steps (``results/f1_catdog/README.md``): the paper's
relaxation ends all-positive (test accuracy 0.50) at lr 0.1 and 0.01; so do ``bound="mid"``
and ``margin`` without straight-through scores, and a hard ``phi="sign"`` ends at chance;
straight-through scores without a margin reach 0.61 at lr 0.01 (0.50 at lr 0.1).  What trains
is both fixes (at commit 89b6da9, lr 0.01, seeds 0 / 1: test F1 0.672 / 0.803, accuracy
0.737 / 0.786; cross-entropy at lr 0.01: 0.745 / 0.820 and 0.781 / 0.819, so the recipe trains
but is not shown to beat cross-entropy):

* ``margin`` :math:`\mu`: the boxes are built from :math:`\phi_i - \mu(2Y_i - 1)`, so a sample
  counts fully only beyond :math:`\pm\mu` on its own side (the role :math:`\epsilon` plays in the
  AUC LP); the value at :math:`\phi \equiv 0` drops to :math:`2P(1-\mu)/(P(1-\mu) + N\mu + P)`.
* ``phi="softmax_st"``: :math:`\tanh(m/2)` forward, straight-through backward
  :math:`\partial\phi/\partial m = 1/2`, so a saturated wrong score keeps its gradient.

``configs/objective/{f1,fbeta,jaccard}_lp.yaml`` use ``phi=softmax_st``, ``margin=0.5`` and
``optimizer.lr=0.01`` (at 0.1, in a float32 run: test accuracy 0.666 after 2,000 steps); set
``objective.phi=softmax objective.margin=0 optimizer.lr=0.1`` for the paper's relaxation.
Other knobs kept for study: ``bound="lower"`` (min over the boxes: a certified lower bound of
the thresholded metric, but no gradient for misclassified samples), ``bound="mid"`` (mean of
both, one batched solve), ``phi="sign"`` (hard scores: the LP value is then exactly the batch
metric).

Caveat: a positive with :math:`\phi_i` slightly below its threshold still counts
:math:`\hat Y_i \approx 1` in the upper bound, so the relaxed metric can be near its maximum while
thresholded predictions are not; P@R is the most exposed (precision rises as all scores fall),
hence its recall penalty (its config keeps the paper's relaxation: the recipe above was not
measured on P@R).

Capture-safe form (``solver.capture_safe``; :meth:`RatioLPLoss.capture_safe_form`, what the packed
launcher trains on CUDA): the same LP with shapes fixed by the batch size (the dropped lower rows
kept as rows that are never tight, :func:`objectives.fractional.charnes_cooper_lp` with
``static=True``), its closed-form vertex certified on the device (:mod:`solver.capture.guess`),
a batch without positives zeroed on the device: the same loss and gradient wherever the vertex
certifies, and ``lp_converged`` < 1 recorded where it does not.  P@R has none (its recall clamp
reads the host, and its guess often needs Newton).

Example::

    >>> loss_fn = F1LPLoss()
    >>> logits = torch.randn(64, 2, requires_grad=True)
    >>> loss = loss_fn(logits, torch.randint(0, 2, (64,))); loss.backward()
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from lpmetrics.objectives.base import Objective
from lpmetrics.objectives.common import (capture_twin, check_backward, check_labels, check_positive_class,
                               check_solver_options, device_solver_stats, finite_positive, lp_logits,
                               solve, solver_stats, zero_loss)
from lpmetrics.objectives.fractional import SAFEGUARDS, box_bounds, charnes_cooper_lp

PHI = ("softmax", "tanh", "softmax_st", "sign")
BOUNDS = {"upper": ("max",), "lower": ("min",), "mid": ("max", "min")}
PHI_MARGIN = 1e-6  # distance kept from +-1 by the LICQ safeguard


def phi_of_logits(logits: torch.Tensor, phi: str = "softmax") -> torch.Tensor:
    """``phi(f(x)) in [-1, 1]`` from the logit margin ``m = l_1 - l_0``:

    * ``softmax``: ``2 p_1 - 1 = tanh(m / 2)`` (the paper's softmax scores);
    * ``tanh``: ``tanh(m)``;
    * ``softmax_st``: ``tanh(m / 2)`` forward, straight-through backward ``d phi / d m = 1/2``
      (the slope of ``tanh(m / 2)`` at 0), so saturated scores keep their gradient;
    * ``sign``: ``+1`` if ``m > 0`` else ``-1`` forward (the paper's "phi in {-1, 1}": the LP
      value is then the metric of the thresholded predictions), the same straight-through
      backward.
    """
    if phi not in PHI:
        raise ValueError(f"phi must be one of {PHI}; got {phi!r}")
    if logits.dim() != 2 or logits.shape[1] not in (1, 2):
        raise ValueError(f"ratio objectives are binary: logits [B, 2] (or [B, 1]); got {tuple(logits.shape)}")
    # m / 2 = (l_1 - l_0) / 2.  On the CPU as one product, one graph node: the same value as
    # the division (x * 0.5 is exact and the sum is rounded once, as l_1 - l_0 is).  Not on a
    # GPU, where a float32 matmul may run in TF32 (torch.set_float32_matmul_precision).
    if logits.shape[1] == 1:
        half = logits[:, 0] / 2
    elif logits.device.type == "cpu":
        half = logits @ _half_diff(logits)
    else:
        half = (logits[:, 1] - logits[:, 0]) / 2
    if phi == "tanh":
        return torch.tanh(2 * half)
    soft = torch.tanh(half)
    if phi == "softmax":
        return soft
    # sign: m > 0 -> +1 else -1, the same tie rule as the argmax prediction (class 0 on a tie)
    forward = soft if phi == "softmax_st" else torch.where(half > 0, 1.0, -1.0).to(soft.dtype)
    return (forward - half).detach() + half


_HALF_DIFF: dict[tuple, torch.Tensor] = {}


def _half_diff(logits: torch.Tensor) -> torch.Tensor:
    """``[-1/2, 1/2]`` in the logits' dtype (CPU; made once per dtype)."""
    key = (logits.dtype, logits.device)
    if key not in _HALF_DIFF:
        # a normal tensor even when the first call runs under torch.inference_mode (an
        # inference tensor cannot be saved for a later call's backward)
        with torch.inference_mode(False):
            _HALF_DIFF[key] = torch.tensor([-0.5, 0.5], dtype=logits.dtype, device=logits.device)
    return _HALF_DIFF[key]


class RatioLPLoss(Objective):
    """Base class: subclasses implement :meth:`ratio`; see the module docstring.

    Labels are checked as cross-entropy checks them (integers in 0..1, else a ``ValueError``).
    """

    tasks = ("binary",)
    min_batch_size = 2

    def __init__(self, phi: str = "softmax", safeguard: str = "drop_redundant",
                 backward: str = "active_set", positive_class: int = 1,
                 solver: Mapping[str, Any] | None = None, bound: str = "upper",
                 margin: float = 0.0) -> None:
        super().__init__()
        if phi not in PHI:
            raise ValueError(f"phi must be one of {PHI}; got {phi!r}")
        if safeguard not in SAFEGUARDS:
            raise ValueError(f"safeguard must be one of {SAFEGUARDS}; got {safeguard!r}")
        if bound not in BOUNDS:
            raise ValueError(f"bound must be one of {tuple(BOUNDS)}; got {bound!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1) (phi lies in [-1, 1]); got {margin}")
        self.phi, self.safeguard, self.bound = phi, safeguard, bound
        self.backward = check_backward(backward)
        self.margin = float(margin)
        self.positive_class = check_positive_class(positive_class)
        self.solver_options = check_solver_options(solver)

    def ratio(self, y: torch.Tensor) -> dict[str, Any]:
        """``num``, ``den``, ``den0`` (and optionally ``recall_rows``) for labels ``y`` in {0, 1}."""
        raise NotImplementedError

    def ratio_lp(self, phi: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        return self.ratio(y)

    @property
    def capturable(self) -> bool:
        """With ``solver.capture_safe``: fixed shapes and no host sync in forward and backward
        (the LP built with ``static=True``, its closed-form vertex certified on the device by
        :mod:`solver.capture.guess`; ``tests/test_objectives_capture_f1.py``)."""
        return bool(self.solver_options.get("capture_safe"))

    def capture_safe_form(self) -> "RatioLPLoss | None":
        """This loss with the capture-safe solver (the LP built with fixed shapes, its
        closed-form vertex certified on the device): the same loss and gradient wherever the
        vertex certifies, which is where the default path certifies it too and runs no Newton
        step.  Where it does not certify, ``lp_converged`` < 1 is recorded on the device (the
        default path would run Newton there; this form keeps the snapped guess).

        ``None`` where that cannot be promised: solver options that need the host
        (``backward="unrolled"``, ``forward="highs"``, a sketch, ...: the solver refuses them,
        tried here on a two-sample batch) and ``safeguard="none"``, whose redundant rows make
        the certified active system singular at saturated scores (``phi = +-1``); the default
        path then takes the pseudo-inverse of ``K_T`` from an eigendecomposition, which has no
        kernel without a host check, and the capture-safe Cholesky flags those batches instead
        (7 of 120 random batches).

        Coverage measured: the default path certified the closed-form vertex (0 Newton steps)
        and so did this form (``lp_converged`` 1) in all of 3,000 random batches (F1 as
        configured and as in the paper, tanh / sign scores, lower and mid bounds, F-beta 2 and
        0.5, Jaccard; B 2-96, ties, saturated and exactly-zero scores, no / one / only
        positives); loss and gradient agreed to 1.5e-15 (``pytest
        tests/test_objectives_capture_f1.py -k coverage -s`` reruns 600 of them)."""
        if self.capturable:
            return self
        if self.safeguard == "none":
            return None
        return capture_twin(self, torch.zeros(2, 2), torch.tensor([0, 1]))

    def build_lp(self, phi: torch.Tensor, y: torch.Tensor):
        return charnes_cooper_lp(phi=phi, safeguard=self.safeguard, senses=BOUNDS[self.bound],
                                 static=self.capturable, **self.ratio_lp(phi, y))

    def lp_value(self, phi: torch.Tensor, y: torch.Tensor, backward: str | None = None):
        """The relaxed metric (differentiable in ``phi``) and the solver's solution: the LP
        optimum, or for ``bound="mid"`` the mean of the two optima (one batched solve)."""
        lp = self.build_lp(phi, y)
        # the closed-form vertex (objectives.fractional.box_vertex), certified by the solver:
        # one active-set solve instead of the eps loop when it is the optimum
        options = {"vertex_guess": lp.guess, **self.solver_options}
        sol = solve(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq, backward=backward or self.backward,
                    options=options)
        value = lp.value(sol.z)
        return (value.mean() if value.dim() else value), sol

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = lp_logits(logits)
        labels = check_labels(logits, labels, 2)
        y = (labels == self.positive_class).to(logits.dtype)
        phi = phi_of_logits(logits, self.phi)
        if self.margin:
            # a score counts fully only beyond the margin on its own side: positives need
            # phi >= margin, negatives phi <= -margin (the role epsilon plays in the AUC LP)
            phi = phi - self.margin * (2 * y - 1)
        # [-1, 1] keeps the boxes feasible (a margin can push phi beyond); with the safeguard a
        # saturated phi = +-1 would pin Y_hat_i (l_i = u_i): two active rows for one variable, a
        # degenerate vertex, so phi stays inside (-1, 1), leaving one row per sample.  The clamp
        # is straight-through, so it never zeroes a gradient itself.
        limit = 1.0 if self.safeguard == "none" else 1 - PHI_MARGIN
        phi = phi + (phi.clamp(-limit, limit) - phi).detach()
        if self.capturable:
            return self._capture_forward(logits, phi, y)
        if y.sum() == 0:
            self.record(degenerate_batches=1.0, empty_batches=1.0)
            return zero_loss(logits)
        # The LP is solved in float64 whatever the network's dtype: a clamped score leaves a box
        # 1e-6 wide, too narrow for float32's active-set test (the gradient of such samples came
        # out halved; test_float32_logits_get_the_float64_gradient).  n ~ batch: cheap.
        if phi.dtype != torch.float64:
            phi, y = phi.to(torch.float64), y.to(torch.float64)
        value, sol = self.lp_value(phi, y)
        self.record(**solver_stats(sol), degenerate_batches=0.0, empty_batches=0.0)
        penalty = self.penalty(phi, y)
        loss = -value if isinstance(penalty, float) and penalty == 0.0 else -value + penalty
        return loss if loss.dtype == logits.dtype else loss.to(logits.dtype)

    def _capture_forward(self, logits: torch.Tensor, phi: torch.Tensor, y: torch.Tensor):
        """:meth:`forward`'s loss with no value read on the host: a batch without positives is
        solved as if its first sample were one (a well-posed LP of the same shape, whose finite
        gradient is then multiplied by zero) and gets the zero loss on the device, not by a
        branch; the statistics are :meth:`forward`'s, recorded on the device."""
        has = y.sum() > 0
        self.record(degenerate_batches=~has, empty_batches=~has)
        if phi.dtype != torch.float64:
            phi, y = phi.to(torch.float64), y.to(torch.float64)
        first = (torch.arange(y.shape[0], device=y.device) == 0).to(y.dtype)
        y = torch.where(has, y, first)
        value, sol = self.lp_value(phi, y)
        self.record_where(has, **device_solver_stats(sol))
        penalty = self.penalty(phi, y)
        loss = -value if isinstance(penalty, float) and penalty == 0.0 else -value + penalty
        return torch.where(has, loss.to(logits.dtype), zero_loss(logits))

    def extra_repr(self) -> str:
        return (f"phi={self.phi!r}, bound={self.bound!r}, margin={self.margin}, "
                f"safeguard={self.safeguard!r}, backward={self.backward!r}")

    def penalty(self, phi: torch.Tensor, y: torch.Tensor) -> torch.Tensor | float:
        """A term added to ``-OPT`` (zero except where the LP alone cannot express the metric)."""
        return 0.0


class F1LPLoss(RatioLPLoss):
    """F1 = 2TP / (2TP + FP + FN) as an LP (Meng et al., ICLR 2021 version, eq. 11-12)."""

    def ratio(self, y):
        return {"num": 2 * y, "den": torch.ones_like(y), "den0": y.sum()}


class FBetaLPLoss(RatioLPLoss):
    """F-beta = (1 + b^2) TP / ((1 + b^2) TP + b^2 FN + FP) as an LP (Meng et al., ICLR 2021
    version, eq. 14).

    ``beta`` > 1 weighs recall more, < 1 precision more."""

    def __init__(self, beta: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.beta = finite_positive("beta", beta)

    def ratio(self, y):
        b2 = self.beta ** 2
        return {"num": (1 + b2) * y, "den": torch.ones_like(y), "den0": b2 * y.sum()}


class JaccardLPLoss(RatioLPLoss):
    """Jaccard = TP / (TP + FP + FN) as an LP (Meng et al., ICLR 2021 version, eq. 13)."""

    def ratio(self, y):
        return {"num": y, "den": 1 - y, "den0": y.sum()}


class PrecisionAtRecallLPLoss(RatioLPLoss):
    r"""Precision at recall >= alpha as an LP (Meng et al., ICLR 2021 version, eq. 15-16).

    When the boxes cannot reach recall ``alpha`` (positives scored too low) the LP is
    infeasible.  Then ``alpha`` is lowered to the reachable recall
    :math:`\rho = \sum_{y_i=1} u_i / P` for the LP (counted in ``recall_clamped``) and the
    shortfall is priced outside it, ``loss = -OPT + recall_penalty * relu(alpha - rho)``: without
    that term precision alone is maximised by pushing every score below zero (the LP value tends
    to 1 with no positive predicted), which is the collapse the recall row exists to prevent.

    Args:
        alpha: the minimum recall.
        recall_penalty: price per unit of recall shortfall (1 = one unit of precision).
    """

    def __init__(self, alpha: float = 0.8, recall_penalty: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha (the minimum recall) must be in [0, 1]; got {alpha}")
        if not (math.isfinite(recall_penalty) and recall_penalty >= 0):
            raise ValueError(f"recall_penalty must be a finite number >= 0; got {recall_penalty}")
        self.alpha, self.recall_penalty = float(alpha), float(recall_penalty)
        if self.solver_options.get("capture_safe"):
            raise ValueError("precision@recall has no capture-safe form (solver.capture_safe): "
                             "lowering alpha to the reachable recall reads it on the host, and "
                             "at that recall the closed-form vertex is often not the optimum, so "
                             "the solver runs Newton on the coupled LP; drop capture_safe")

    @property
    def capturable(self) -> bool:
        return False

    def capture_safe_form(self) -> None:
        """``None``: see the error :class:`PrecisionAtRecallLPLoss` raises for
        ``solver.capture_safe``."""
        return None

    def ratio(self, y):
        return {"num": y, "den": torch.ones_like(y), "den0": 0.0, "recall_rows": (y, self.alpha)}

    def reachable_recall(self, phi, y):
        return (y * box_bounds(phi)[1]).sum() / y.sum()

    def ratio_lp(self, phi, y):
        reachable = float(self.reachable_recall(phi.detach(), y))
        self.record(recall_clamped=float(reachable < self.alpha))
        return {**self.ratio(y), "recall_rows": (y, min(self.alpha, reachable))}

    def penalty(self, phi, y):
        return self.recall_penalty * torch.relu(self.alpha - self.reachable_recall(phi, y))
