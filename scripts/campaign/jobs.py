"""The jobs of a paper table as Hydra composes them: shared by ``scripts/campaign/gpu_tables.py`` (one
dataset's Table-1 block in one GPU command) and ``scripts/campaign/cli.py`` (every table, window by
window).

A job is ``{"name", "overrides"}``: the overrides that ``train.py -m experiment=E ...`` would give
that job, and a name built from them (``cifar10_nk0.1_ce_lr0.1_s0``) that is also its run folder.
"""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name parts: (override key, prefix), in the order a name spells them; keys not listed are not named
NAME_PARTS = (("dataset", ""), ("dataset.neg_keep", "nk"), ("dataset.drop_rate", "dr"), ("regime", ""), ("objective", ""),
              ("objective.epsilon", "eps"), ("optimizer.lr", "lr"), ("seed", "s"))


def job_name(values: dict) -> str:
    """``{"dataset": "cifar10", "dataset.neg_keep": 0.1, ...}`` -> ``cifar10_nk0.1_..._s0``."""
    return "_".join(f"{prefix}{values[key]}" for key, prefix in NAME_PARTS if key in values)


def grid(axes: dict[str, list]) -> list[dict]:
    """Every combination of ``axes`` (``{override key: values}``), the first axis outermost."""
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def jobs(axes: dict[str, list], fixed: dict | None = None) -> list[dict]:
    """``grid(axes)`` as jobs, each with ``fixed`` values (``{key: value}``) named and overridden too."""
    out = []
    for values in grid(axes):
        values = {**(fixed or {}), **values}
        out.append({"name": job_name(values), "overrides": [f"{k}={v}" for k, v in values.items()],
                    "values": values})
    return out


@contextlib.contextmanager
def composer(configs: Path | None = None) -> Iterator[Callable[..., object]]:
    """``compose(overrides, experiment=None, hydra=False)`` inside one Hydra initialisation
    (initialising costs as much as a compose; a queue composes hundreds of jobs), from
    ``configs`` (default: this checkout's ``configs/``)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    GlobalHydra.instance().clear()   # a caller's (or a test's) earlier initialisation

    def _compose(overrides: list[str], experiment: str | None = None, hydra: bool = False):
        pre = [f"experiment={experiment}"] if experiment else []
        return compose("config", overrides=[*pre, *overrides], return_hydra_config=hydra)
    try:
        with initialize_config_dir(config_dir=str(configs or ROOT / "configs"), version_base="1.3"):
            yield _compose
    finally:
        GlobalHydra.instance().clear()


def compose_job(overrides: list[str], experiment: str = "table1_binary"):
    """One job's config, composed as ``train.py experiment=<experiment> <overrides>`` composes it."""
    with composer() as compose:
        return compose(overrides, experiment)


def sweep_axes(experiment: str, compose: Callable[..., object] | None = None) -> dict[str, list[str]]:
    """The multirun axes an experiment file declares (``hydra.sweeper.params``), values as typed
    (``compose``: a :func:`composer`'s, when the caller holds one open)."""
    from omegaconf import OmegaConf
    if compose is None:
        with composer() as own:
            return sweep_axes(experiment, own)
    params = compose([], experiment, hydra=True).hydra.sweeper.params
    return {k: [v.strip() for v in str(spec).split(",")] for k, spec in OmegaConf.to_container(params).items()}
