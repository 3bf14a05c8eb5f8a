"""``_target_`` names before and after the code became the ``lpmetrics`` package.

Runs made before the package existed name their classes by the repository's top-level folders
(``objectives.auc.AUCLoss``, ``loggers.CSVLogger``); runs made since name them inside the package
(``lpmetrics.objectives.auc.AUCLoss``, ``lpmetrics.run.loggers.CSVLogger``). Both name the same
code, so:

* a protocol, a resume check or a hash compares the **short** form (:func:`short_target`): a run
  of either age pools with the other, and the campaign's committed hashes stay what they were;
* instantiating an old run's stored config (``eval.py``) first rewrites it to the **package**
  form (:func:`upgrade_targets`), so its classes load from the one installed package.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, read_write

PACKAGE = "lpmetrics"

#: top-level module of the old layout -> its module in the package
LEGACY_ROOTS = {
    "solver": f"{PACKAGE}.solver",
    "objectives": f"{PACKAGE}.objectives",
    "baselines": f"{PACKAGE}.baselines",
    "data": f"{PACKAGE}.data",
    "models": f"{PACKAGE}.models",
    "metrics": f"{PACKAGE}.metrics",
    "packed": f"{PACKAGE}.packed",
    "loggers": f"{PACKAGE}.run.loggers",
}
_SHORT = {package: legacy for legacy, package in LEGACY_ROOTS.items()}


def _split(name: str, table: dict[str, str]) -> tuple[str, str] | None:
    """(root, rest) where ``name`` is ``root`` or starts with ``root.``, the longest root first."""
    for root in sorted(table, key=len, reverse=True):
        if name == root or name.startswith(root + "."):
            return root, name[len(root):]
    return None


def package_target(name: Any) -> Any:
    """``objectives.auc.AUCLoss`` -> ``lpmetrics.objectives.auc.AUCLoss``; anything else as given
    (``torch.optim.SGD``, a name already in the package, a non-string)."""
    if not isinstance(name, str):
        return name
    hit = _split(name, LEGACY_ROOTS)
    return LEGACY_ROOTS[hit[0]] + hit[1] if hit else name


def short_target(name: Any) -> Any:
    """``lpmetrics.objectives.auc.AUCLoss`` -> ``objectives.auc.AUCLoss``: the inverse of
    :func:`package_target` on the names it makes; anything else as given."""
    if not isinstance(name, str):
        return name
    hit = _split(name, _SHORT)
    return _SHORT[hit[0]] + hit[1] if hit else name


def is_target_key(key: str) -> bool:
    """Whether a (dotted, flattened) config key names a ``_target_``."""
    return key == "_target_" or key.endswith("._target_")


def short_targets(flat: dict[str, Any]) -> dict[str, Any]:
    """A flattened config (dotted keys) with every ``_target_`` value in the short form: what a
    protocol, a hash or a resume check compares."""
    return {k: short_target(v) if is_target_key(k) else v for k, v in flat.items()}


def upgrade_targets(cfg: Any) -> Any:
    """Rewrite every ``_target_`` of a config tree (dict, list, ``DictConfig``) to the package form,
    in place where the tree is mutable (``DictConfig`` stays struct- and readonly-aware); returns it."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        with read_write(cfg):
            _upgrade(cfg)
        return cfg
    _upgrade(cfg)
    return cfg


def _upgrade(node: Any) -> None:
    if isinstance(node, (dict, DictConfig)):
        for key in list(node.keys()):
            if isinstance(node, DictConfig) and (OmegaConf.is_missing(node, key)
                                                 or OmegaConf.is_interpolation(node, key)):
                continue   # ``???`` or ``${...}``: no class name to rewrite, nothing to resolve
            value = node[key]
            if key == "_target_" and isinstance(value, str):
                node[key] = package_target(value)
            else:
                _upgrade(value)
    elif isinstance(node, (list, ListConfig)):
        for item in node:
            _upgrade(item)
