r"""The pairwise ramp LP shared by binary AUC, AUC one-vs-all and AUC_mu (Meng et al. 2021, §3.2-3.3).

Every AUC-type objective reduces to margins :math:`d_{ij}` of ordered pairs (one sample that should
rank above another) and the LP

.. math::

    \min_{z \ge 0} \sum_{(i,j)} z_{ij} \quad \text{s.t.} \quad d_{ij} \ge \epsilon - z_{ij}
    \quad\Longleftrightarrow\quad \min_{z\ge0} \mathbb 1^\top z \ \text{ s.t. } -I z \le d - \epsilon,

whose optimum is :math:`z_{ij} = \max(0, \epsilon - d_{ij})`.  A pair counts as correctly ranked
when :math:`z_{ij} = 0`; the authors' count :math:`\epsilon^{-1}\mathrm{relu}(\epsilon - z_{ij})`
turns it into the ramp :math:`\mathrm{clip}(d_{ij}/\epsilon, 0, 1)`, and the loss is

.. math::

    \mathcal L = 1 - \sum_{(i,j)} w_{ij}\, \epsilon^{-1}\mathrm{relu}(\epsilon - z^*_{ij})
               = 1 - \sum_{(i,j)} w_{ij}\, \mathrm{clip}(d_{ij}/\epsilon, 0, 1),
    \qquad \textstyle\sum w_{ij} = 1,

which tends to ``1 - AUC`` (on tie-free scores) as :math:`\epsilon \to 0`.  The constraint matrix
is :math:`-I`, passed to the solver as its structured diagonal operator, so a batch of 4096
(4.2 M pairs) never builds a dense (or even sparse) matrix.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lpmetrics.objectives.base import Objective
from lpmetrics.objectives.common import (DEVICE_STATS, capture_twin, check_backward, check_solver_options,
                               device_solver_stats, finite_positive, lp_logits, solve, solver_stats,
                               zero_loss)

METHODS = ("lp", "closed_form")
#: ``masked``: the pairs that count, gathered by boolean masks (shapes depend on the labels: a
#: host sync per batch); ``dense``: all B x B ordered pairs, zero weight off the ones that count,
#: a fixed shape, no sync (with ``solver.capture_safe`` the whole loss is capturable)
PAIR_LAYOUTS = ("masked", "dense")


def check_pair_layout(pair_layout: str) -> str:
    """``pair_layout`` if it is one of :data:`PAIR_LAYOUTS`, else a ``ValueError``."""
    if pair_layout not in PAIR_LAYOUTS:
        raise ValueError(f"pair_layout must be one of {PAIR_LAYOUTS}; got {pair_layout!r}")
    return pair_layout


def neg_identity(m: int, like: torch.Tensor):
    """The constraint operator ``-I_m`` in the solver's structured diagonal form."""
    from lpmetrics.solver import DiagonalOperator
    return DiagonalOperator(-torch.ones(m, dtype=like.dtype, device=like.device))


def ramp_lp(d: torch.Tensor, epsilon: float | torch.Tensor, *, method: str = "lp",
            backward: str = "active_set", options: Mapping[str, Any] | None = None):
    """Solve the pairwise LP for margins ``d [M]`` (or a batch ``[k, M]`` of k such LPs, one solve;
    ``epsilon`` then a float or a ``[k, 1]`` tensor, one per LP); returns ``(z*`` of ``d``'s
    shape``, solution or None)``.

    ``method="closed_form"`` returns ``relu(epsilon - d)`` (the exact optimum; an oracle and a
    fast ablation), ``"lp"`` runs ``solver.solve_lp``.
    """
    if method == "closed_form":
        return torch.relu(epsilon - d), None
    c = torch.ones_like(d)
    sol = solve(c, neg_identity(d.shape[-1], d), d - epsilon, backward=backward, options=options)
    return sol.z, sol


class PairwiseRampLP(Objective):
    """Base class: subclasses implement :meth:`pairs`; this class solves the LP and forms the loss.

    Inputs are checked as cross-entropy checks them (integer labels in range, else a
    ``ValueError``); fp16 / bf16 logits are cast to float32 for the LP.

    Args:
        epsilon: ramp width of the LP (paper sweeps 0.1, 0.01, 0.001).
        method: ``"lp"`` (Newton LP solver, default) or ``"closed_form"`` (oracle / ablation).
        backward: the solver's backward mode, ``"active_set"`` or ``"unrolled"``.
        solver: extra keyword options for ``solver.solve_lp`` (tolerances, iterations, ...).
            ``solver={"capture_safe": True}`` takes the solver's capture-safe path (fixed
            iteration counts, no host sync: :mod:`solver.capture`); the solver diagnostics
            are then summed on the device and read once, by :meth:`pop_stats`
            (:meth:`objectives.base.Objective.record` of tensors).
    """

    min_batch_size = 2  # a pair needs two samples

    def __init__(self, epsilon: float = 0.01, method: str = "lp", backward: str = "active_set",
                 solver: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.epsilon = finite_positive("epsilon", epsilon, " (the ramp width, e.g. 0.01)")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}; got {method!r}")
        self.method = method
        self.backward = check_backward(backward)
        self.solver_options = check_solver_options(solver)

    def pairs(self, logits: torch.Tensor, labels: torch.Tensor):
        """Return ``(d [M], w [M])`` -- margins and weights summing to one -- or ``None`` when the
        batch has no pair to rank; may also return a third item, ``degenerate: bool``."""
        raise NotImplementedError

    def batch_pairs(self, logits: torch.Tensor, labels: torch.Tensor):
        """``(d, w)`` of the batch, or ``None`` when it has nothing to rank; records the
        degenerate-batch count and the number of pairs."""
        out = self.pairs(lp_logits(logits), labels)
        if out is None:
            self.record(degenerate_batches=1.0, empty_batches=1.0)
            return None
        d, w, degenerate = out if len(out) == 3 else (*out, False)
        self.record(degenerate_batches=float(degenerate), empty_batches=0.0,
                    lp_pairs=float(d.numel()))
        return d, w

    def dense_pairs(self, logits: torch.Tensor, labels: torch.Tensor):
        """``(d [M], w [M], has_pairs)`` with ``M`` fixed by the batch shape alone (no host sync):
        the pairs of :meth:`pairs` (in the same order, or permuted), interleaved with pairs of
        weight 0, and ``has_pairs`` a 0-dim bool tensor; a fourth item, a 0-dim bool
        ``degenerate``, where a batch with pairs can still be degenerate (default: ``~has_pairs``).
        Subclasses that support ``pair_layout="dense"`` implement it."""
        raise NotImplementedError(f"{type(self).__name__} has no pair_layout='dense'; use 'masked'")

    @property
    def capturable(self) -> bool:
        """Dense pairs with the capture-safe solver or the closed form: no host sync anywhere
        (``tests/test_auc_dense_pairs.py``, ``tests/test_objectives_capture_ova.py``)."""
        return getattr(self, "pair_layout", "masked") == "dense" and (
            self.method == "closed_form" or bool(self.solver_options.get("capture_safe")))

    def capture_safe_form(self) -> "PairwiseRampLP | None":
        """This loss with ``pair_layout="dense"`` and, for ``method="lp"``, the capture-safe
        solver: the same loss and gradient, no host sync.  ``None`` for a loss without a dense
        layout, and where the solver options need the host (e.g. ``backward="unrolled"``, a
        warm start): the solver refuses them, tried here on a two-sample batch."""
        if self.capturable:
            return self
        if type(self).dense_pairs is PairwiseRampLP.dense_pairs:
            return None
        k = max(2, getattr(self, "num_classes", 2))
        return capture_twin(self, torch.zeros(2, k), torch.tensor([0, 1]),
                            solver=self.method == "lp", pair_layout="dense")

    def _dense_batch(self, logits: torch.Tensor, labels: torch.Tensor):
        """``(d, w, has_pairs)`` of :meth:`dense_pairs`, with the degenerate-batch and pair-count
        statistics recorded as :meth:`batch_pairs` records them (on the device)."""
        d, w, has, *rest = self.dense_pairs(logits, labels)
        self.record(degenerate_batches=rest[0] if rest else ~has, empty_batches=~has)
        self.record_where(has, lp_pairs=(w > 0).sum())
        return d, w, has

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = lp_logits(logits)
        if getattr(self, "pair_layout", "masked") == "dense":
            return self._dense_forward(logits, labels)
        pairs = self.batch_pairs(logits, labels)
        if pairs is None:
            return zero_loss(logits)
        d, w = pairs
        z = self.solve_pairs(d)
        counted = torch.relu(self.epsilon - z) / self.epsilon
        return 1.0 - (w * counted).sum()

    def _dense_forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of :meth:`forward` from :meth:`dense_pairs`: every batch solves one LP of the
        same size, and a batch without pairs gets the zero loss on the device, not by a branch.
        The zero-weight pairs are LP rows of their own (the LP is separable), so the loss and its
        gradient are the masked layout's; the solver diagnostics cover all ``M`` rows."""
        d, w, has = self._dense_batch(logits, labels)
        z = self.solve_pairs(d, when=has)
        counted = torch.relu(self.epsilon - z) / self.epsilon
        return torch.where(has, 1.0 - (w * counted).sum(), zero_loss(logits))

    def pack_key(self):
        """Hashable where several runs of a pack can solve their LPs as one batch
        (:meth:`pack_forward`, called by :class:`packed.PackedStep`): the dense pair layout, whose
        LP size depends on the batch shape alone, with the capture-safe solver, whose per-LP
        masks keep the batched iterates equal to separate solves. Runs with equal keys solve
        the same kind of LP, whatever their ``epsilon`` (it enters the LP's data, ``b = d - eps``,
        one column per run: an ε sweep shares one batched LP); ``None``: this objective solves
        alone."""
        if (getattr(self, "pair_layout", "masked") != "dense" or self.method != "lp"
                or not self.solver_options.get("capture_safe")
                or any(getattr(type(self), f) is not getattr(PairwiseRampLP, f)   # a subclass that solves
                       for f in ("forward", "_dense_forward", "solve_pairs"))):   # or forms the loss its own way
            return None
        return (type(self), self.backward, repr(sorted(self.solver_options.items())))

    @staticmethod
    def pack_forward(objectives: list["PairwiseRampLP"], logits: list[torch.Tensor],
                     labels: list[torch.Tensor]) -> list[torch.Tensor]:
        """The losses of ``objectives[j](logits[j], labels[j])`` for runs with one
        :meth:`pack_key`, with their k LPs solved as one batch ``[k, M]``: each run's pairs and
        statistics as :meth:`_dense_forward` makes them (the solver's per-LP diagnostics go to
        each run's own statistics), one solve. Equal to the separate calls
        (``tests/test_packed_pack_forward.py``): the capture-safe solver masks each LP alone."""
        first = objectives[0]
        parts = []
        for obj, x, y in zip(objectives, logits, labels):
            x = lp_logits(x)
            d, w, has = obj._dense_batch(x, y)
            parts.append((x, d, w, has))
        d = torch.stack([p[1] for p in parts])
        eps = [obj.epsilon for obj in objectives]
        # each run's own epsilon, one per row (a python float where all agree): the same
        # subtraction, bit for bit, as a run's own call makes. Filled on the device, not copied
        # from the host: a host-to-device copy is not allowed inside a CUDA-graph capture
        epsilon = eps[0] if len(set(eps)) == 1 else \
            torch.cat([torch.full((1, 1), e, dtype=d.dtype, device=d.device) for e in eps])
        z, sol = ramp_lp(d, epsilon, method=first.method, backward=first.backward,
                         options=first.solver_options)
        losses = []
        for j, (obj, (x, _, w, has)) in enumerate(zip(objectives, parts)):
            obj.record_where(has, **{name: sol.instance_stats[key][j].float() for name, key in DEVICE_STATS})
            counted = torch.relu(obj.epsilon - z[j]) / obj.epsilon
            losses.append(torch.where(has, 1.0 - (w * counted).sum(), zero_loss(x)))
        return losses

    def solve_pairs(self, d: torch.Tensor, when: torch.Tensor | None = None) -> torch.Tensor:
        """``z*`` of the pairwise LP for margins ``d``; the one hook a different LP solver
        (e.g. :class:`baselines.cvxpy_lp.AUCCvxpyLoss`) overrides. ``when`` (0-dim bool
        tensor): record the solver's diagnostics only if it holds."""
        z, sol = ramp_lp(d, self.epsilon, method=self.method, backward=self.backward,
                         options=self.solver_options)
        if sol is None:
            return z
        # capture_safe: the device tensors themselves (Objective.record sums them in place on
        # the device, read once by pop_stats); else solver_stats' host floats
        stats = (device_solver_stats(sol) if self.solver_options.get("capture_safe")
                 else solver_stats(sol))
        if when is None:
            self.record(**stats)
        else:
            self.record_where(when, **stats)
        return z

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}, method={self.method!r}, backward={self.backward!r}"
