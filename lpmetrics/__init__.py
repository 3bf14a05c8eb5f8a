"""lpmetrics: train networks on non-decomposable metrics through differentiable linear programs.

The repository's folders are this package's subpackages: ``lpmetrics/solver`` is a committed
link to ``solver/``, ``lpmetrics/objectives`` to ``objectives/``, and so on
(:data:`SUBPACKAGES`), so ``lpmetrics.solver`` is a folder of source files that an editor or an
import-graph tool follows with no import hook, while a reader still opens ``solver/`` at the top
of the repository. Installing only ``lpmetrics`` into site-packages keeps generic names such as
``data``, ``metrics`` or ``models`` out of a user's import namespace, and each subpackage refuses
to be imported under its bare folder name (``import solver``), so every class has one identity.
Why links and what they cost (Windows): ``docs/package.md``.

The front door (a loss for your own loop, the LP layer on its own)::

    from lpmetrics import AUCLoss, solve_lp

``import lpmetrics`` imports nothing heavy; the names below load on first use.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: The repository's folders that are this package's subpackages (each linked as ``lpmetrics/<name>``).
SUBPACKAGES = ("solver", "objectives", "baselines", "data", "models", "metrics", "run", "packed")

if TYPE_CHECKING:   # what editors and type checkers read for the lazy names below
    from lpmetrics.objectives.auc import AUCLoss
    from lpmetrics.objectives.auc_mu import AUCMuLoss
    from lpmetrics.objectives.auc_ova import AUCOneVsAllLoss
    from lpmetrics.objectives.ce import CrossEntropy
    from lpmetrics.objectives.nmf import NMFLayer
    from lpmetrics.objectives.ratio import F1LPLoss, FBetaLPLoss, JaccardLPLoss, PrecisionAtRecallLPLoss
    from lpmetrics.solver import LPLayer, LPSolution, solve_lp


#: The front door: public name -> module that defines it.
_EXPORTS = {
    "AUCLoss": "lpmetrics.objectives.auc",
    "AUCMuLoss": "lpmetrics.objectives.auc_mu",
    "AUCOneVsAllLoss": "lpmetrics.objectives.auc_ova",
    "F1LPLoss": "lpmetrics.objectives.ratio",
    "FBetaLPLoss": "lpmetrics.objectives.ratio",
    "JaccardLPLoss": "lpmetrics.objectives.ratio",
    "PrecisionAtRecallLPLoss": "lpmetrics.objectives.ratio",
    "CrossEntropy": "lpmetrics.objectives.ce",
    "NMFLayer": "lpmetrics.objectives.nmf",
    "solve_lp": "lpmetrics.solver",
    "LPLayer": "lpmetrics.solver",
    "LPSolution": "lpmetrics.solver",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lpmetrics' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
