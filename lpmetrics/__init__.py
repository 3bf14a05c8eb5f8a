"""lpmetrics: train networks on non-decomposable metrics through differentiable linear programs.

The repository's folders are this package's subpackages: ``lpmetrics.solver`` is ``solver/``,
``lpmetrics.objectives`` is ``objectives/``, and so on (``pyproject.toml`` maps them). Installing
only ``lpmetrics`` into site-packages keeps generic names such as ``data``, ``metrics`` or
``models`` out of a user's import namespace: a project with its own ``data`` package is not
shadowed by ours, nor ours by it.

The front door (a loss for your own loop, the LP layer on its own)::

    from lpmetrics import AUCLoss, solve_lp

``import lpmetrics`` imports nothing heavy; the names below load on first use.
"""
from __future__ import annotations

import importlib
from pathlib import Path

#: The folders of a source checkout that are this package's subpackages (``pyproject.toml``
#: maps the same names for a built wheel).
SUBPACKAGES = ("solver", "objectives", "baselines", "data", "models", "metrics", "run", "packed")


def _checkout_root() -> Path | None:
    """The repository root when this file sits in a source checkout (the folder above holds
    ``pyproject.toml`` and the subpackage folders), else None (an installed wheel)."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and all((root / name).is_dir() for name in SUBPACKAGES):
        return root
    return None


# In a checkout (editable install, or the repository root on the path) the subpackages are the
# folders beside this one; a wheel carries them inside this folder.
_root = _checkout_root()
if _root is not None and str(_root) not in __path__:
    __path__.append(str(_root))

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
