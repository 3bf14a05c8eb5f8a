"""Shared plumbing of the LP objectives: score transforms, the solver call, degenerate batches.

Nothing here knows a metric.  Each LP family (``auc.py``, ``auc_mu.py``, ``auc_ova.py``,
``ratio.py``, ``nmf.py``) builds its ``(c, A, b[, A_eq, b_eq])`` and calls :func:`solve` so
every objective logs the same solver diagnostics under the same names.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

BINARY_TRANSFORMS = ("softmax", "sigmoid", "margin")
_LABELS_CHECKED = contextvars.ContextVar("labels_checked", default=False)


@contextlib.contextmanager
def labels_checked() -> Iterator[None]:
    """Inside, :func:`check_labels` skips its value-range check (``aminmax``: a host sync per
    call): for a caller that has checked every label it will pass, e.g. the packed launcher's
    sync-free step, which checks each run's train split once. Shape and dtype are still checked."""
    token = _LABELS_CHECKED.set(True)
    try:
        yield
    finally:
        _LABELS_CHECKED.reset(token)

CLASS_TRANSFORMS = ("softmax", "logits")


def binary_scores(logits: torch.Tensor, transform: str = "softmax") -> torch.Tensor:
    """Scores ``[B]`` of the positive class from logits ``[B, 2]`` (or ``[B, 1]`` / ``[B]``).

    * ``softmax`` -- probability of class 1 (what Meng et al. trained on); for a single logit
      column it is the sigmoid of that logit.
    * ``sigmoid`` -- ``sigmoid(l_1 - l_0)``; identical to ``softmax`` for two logits, kept as a
      name for configs written for one-logit heads.
    * ``margin`` -- the raw logit margin ``l_1 - l_0`` (unbounded: pick ``epsilon`` accordingly).
    """
    if transform not in BINARY_TRANSFORMS:
        raise ValueError(f"unknown score transform {transform!r}; choose one of {BINARY_TRANSFORMS}")
    if logits.dim() == 1:
        margin = logits
    elif logits.dim() == 2 and logits.shape[1] == 1:
        margin = logits[:, 0]
    elif logits.dim() == 2 and logits.shape[1] == 2:
        margin = logits[:, 1] - logits[:, 0]
    else:
        raise ValueError(f"binary objectives need logits [B, 2] (or [B, 1]); got {tuple(logits.shape)}."
                         " For K > 2 classes use objective=auc_ova_lp or auc_mu_lp")
    if transform == "margin":
        return margin
    return torch.sigmoid(margin)


def class_scores(logits: torch.Tensor, transform: str = "softmax") -> torch.Tensor:
    """Class-specific scores ``f(x_i, k)`` ``[B, K]``: softmax probabilities or raw logits."""
    if transform not in CLASS_TRANSFORMS:
        raise ValueError(f"unknown score transform {transform!r}; choose one of {CLASS_TRANSFORMS}")
    if logits.dim() != 2:
        raise ValueError(f"multi-class objectives need logits [B, K]; got {tuple(logits.shape)}")
    return torch.softmax(logits, dim=1) if transform == "softmax" else logits


def check_labels(logits: torch.Tensor, labels: torch.Tensor,
                 num_classes: int | None = None) -> torch.Tensor:
    """Labels as int64 ``[B]``, checked like cross-entropy checks them: one integer class index
    per row of ``logits``, in ``0..K-1`` (``K = num_classes``, else the logit columns, at least 2).

    Soft / one-hot / float labels and out-of-range values (``-1``, ``2`` in a binary task) raise a
    ``ValueError`` instead of silently turning into negatives or vanishing from every pair.
    """
    if labels.dim() != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels must be [B] with B = logits.shape[0] = {logits.shape[0]}; "
                         f"got {tuple(labels.shape)} (one integer class index per sample; "
                         "one-hot or soft labels are not supported: pass labels.argmax(-1))")
    if labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be integer class indices (int64), got dtype {labels.dtype}; "
                         "soft labels are not supported by the LP objectives: pass hard labels "
                         "(labels.round().long() if they are 0./1. floats)")
    labels = labels.long()
    if num_classes is None:
        num_classes = logits.shape[1] if logits.dim() == 2 and logits.shape[1] > 2 else 2
    if labels.numel() and not _LABELS_CHECKED.get():
        lo, hi = torch.aminmax(labels)
        lo, hi = int(lo), int(hi)
        if lo < 0 or hi >= num_classes:
            raise ValueError(f"labels must lie in 0..{num_classes - 1} ({num_classes} classes); got "
                             f"values in {lo}..{hi}. Relabel the data (binary tasks: 0 = negative, "
                             "1 = positive) or set the objective's num_classes")
    return labels


def lp_logits(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits (fp16 / bf16, e.g. under autocast) as float32 for the LP: the solver
    takes float32 / float64 only, and 8-11 mantissa bits cannot resolve a ramp of width 0.01."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        return logits.float()
    return logits


def check_backward(backward: str) -> str:
    """``backward`` if ``solver.solve_lp`` has it (``active_set`` | ``unrolled``), else a
    ``ValueError`` at construction rather than at the first solve."""
    from lpmetrics.solver.solve import BACKWARDS
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}; got {backward!r}")
    return backward


def check_positive_class(positive_class: Any) -> int:
    """The positive label of a binary objective as an int, or a ``ValueError`` unless 0 or 1."""
    if positive_class not in (0, 1):
        raise ValueError(f"positive_class must be 0 or 1 (binary labels); got {positive_class!r}")
    return int(positive_class)


def finite_positive(name: str, value: Any, hint: str = "") -> float:
    """``float(value)``, or a ``ValueError`` naming the argument unless it is finite and > 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0{hint}; got {value!r}")
    return v


def check_solver_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The objective's ``solver`` options as a dict, validated now (at construction) rather than
    at the first training step: ``objective.solver.tol=-1`` fails before any data is built."""
    from lpmetrics.solver import SolverOptions
    options = dict(options or {})
    SolverOptions.from_kwargs(options)
    return options


def zero_loss(logits: torch.Tensor) -> torch.Tensor:
    """A finite zero loss connected to the graph (zero gradient), for degenerate batches."""
    return logits.sum() * 0.0


def _scalar(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean()) if value.numel() else 0.0
    return float(value)


def solver_stats(sol) -> dict[str, float]:
    """The solver diagnostics every LP objective logs (means over a batch of LPs)."""
    st = sol.stats
    get = (lambda k: st[k]) if isinstance(st, Mapping) else (lambda k: getattr(st, k))
    return {"lp_iterations": _scalar(get("iterations")),
            "lp_kkt_residual": _scalar(get("kkt_residual")),
            "lp_active": _scalar(get("active_count")),
            "lp_converged": _scalar(get("converged"))}


# solver_stats' names of the diagnostics kept on the device with solver.capture_safe
DEVICE_STATS = (("lp_iterations", "iterations"), ("lp_kkt_residual", "kkt_residual"),
                ("lp_active", "active_count"), ("lp_converged", "converged"))


def device_solver_stats(sol) -> dict[str, torch.Tensor]:
    """:func:`solver_stats` of a capture-safe solve as 0-dim device tensors (no host read;
    :meth:`objectives.base.Objective.record` sums them on the device)."""
    return {name: sol.stats[key].float().mean() for name, key in DEVICE_STATS}


def capture_twin(objective, logits: torch.Tensor, labels: torch.Tensor, *, solver: bool = True,
                 **attrs: Any):
    """A copy of ``objective`` with the attributes ``attrs`` set and, with ``solver``, its
    ``solver_options`` on the capture-safe path (``capture_safe=True``; ``forward="auto"``
    becomes ``"newton"``, since "auto" may route to HiGHS on the CPU), tried on the batch
    ``(logits, labels)``; ``None`` where the solver refuses its options (each needs the host:
    ``backward="unrolled"``, ``forward="highs"``, a warm start, a sketch, ...).  The trial's
    statistics are dropped."""
    import copy
    from lpmetrics.solver.errors import LPInputError
    twin = copy.deepcopy(objective)
    for name, value in attrs.items():
        setattr(twin, name, value)
    if solver:
        from lpmetrics.solver import SolverOptions
        forward = SolverOptions.from_kwargs(twin.solver_options).forward   # unset: the typed default
        twin.solver_options = {**twin.solver_options, "capture_safe": True,
                               "forward": "newton" if forward == "auto" else forward}
    try:
        twin(logits, labels)
    except LPInputError:
        return None
    twin.pop_stats()   # the trial batch is no training batch
    return twin


def solve(c, A, b, A_eq=None, b_eq=None, *, backward: str = "active_set",
          options: Mapping[str, Any] | None = None):
    """``solver.solve_lp`` with the objective's ``solver`` options (imported late so the LP
    constructions stay importable and testable while ``solver/`` is being built)."""
    from lpmetrics.solver import solve_lp
    return solve_lp(c, A, b, A_eq, b_eq, backward=backward, **dict(options or {}))
