"""Typed, actionable errors of the LP layer.

``LPSolverError`` is raised when the LP itself is the problem (infeasible, unbounded) or the
solver did not converge; ``LPInputError`` (also a ``ValueError``) when the call is malformed
(shapes, dtypes, non-finite numbers, an empty problem).  Both carry ``stats`` (the solver
diagnostics, when a solve ran) and ``kind``.
"""
from __future__ import annotations

from typing import Any, Mapping


class LPSolverError(RuntimeError):
    """The LP could not be solved.

    Attributes:
        kind: ``"infeasible"``, ``"unbounded"``, ``"not_converged"``, ``"time_limit"`` or
            ``"invalid_input"``.
        stats: the solver diagnostics (same keys as :attr:`LPSolution.stats`) or ``{}``.
        instances: batch indices (flattened) of the offending LPs, where known.
    """

    def __init__(self, message: str, *, kind: str = "not_converged",
                 stats: Mapping[str, Any] | None = None, instances: list[int] | None = None):
        super().__init__(message)
        self.kind = kind
        self.stats = dict(stats or {})
        self.instances = list(instances or [])


class LPInputError(LPSolverError, ValueError):
    """Malformed call: wrong shapes, non-finite data, empty problem, unknown option."""

    def __init__(self, message: str):
        super().__init__(message, kind="invalid_input")


class LPTimeLimitError(LPSolverError):
    """The solve ran past ``max_seconds`` (``kind="time_limit"``).  The message names what had
    not converged (KKT residual, Newton steps, eps) and the options to try; ``stats`` holds
    the diagnostics at the moment the clock ran out."""

    def __init__(self, message: str, *, stats: Mapping[str, Any] | None = None,
                 instances: list[int] | None = None):
        super().__init__(message, kind="time_limit", stats=stats, instances=instances)


class MPSFormatError(LPInputError):
    """An MPS file that does not parse; the message names the file, the line number and the
    line (raised by the MPS reader of the public-LP benchmark, ``scripts/solver/netlib/mps.py``;
    part of the LP layer's API so that a caller's ``except`` clauses keep working)."""

    def __init__(self, message: str, *, path: str = "", line: int = 0):
        super().__init__(message)
        self.path, self.line = path, line


class LPNotConvergedWarning(RuntimeWarning):
    """Issued instead of raising when ``on_fail="warn"``."""
