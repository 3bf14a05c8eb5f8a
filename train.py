"""Train a network on a (non-decomposable) objective: ``python train.py objective=auc_lp dataset=cifar10``.

The command-line entry: Hydra composes the config, :func:`lpmetrics.run.loop.train` runs the
loop (a plain, iteration-based one; every component from the config through ``_target_``, no
branch on which objective runs), and :func:`main` reports a user's error as one message. The run
layer (:mod:`lpmetrics.run`) holds everything else, shared with the packed launcher
(``hydra/launcher=packed``); nothing imports this file.

Writes into Hydra's run folder (:mod:`lpmetrics.run.runfolder`; every file atomically, so a killed
run never leaves a half-written one): ``metrics.csv`` (one row per evaluation; test in both
BatchNorm modes, :func:`lpmetrics.run.evaluation.evaluate`), ``results.json`` (final and best-val
metrics, split statistics, step timings, degenerate-batch fraction, launches, portable config,
code version and machine: :mod:`lpmetrics.run.provenance`), ``last.pt`` (checkpoint at every
evaluation, the previous one kept as ``last.prev.pt``; ``resume=true`` continues from it if the
config matches, ``resume=force`` even if not: :mod:`lpmetrics.run.resume`) and ``best.pt``
(weights of the best validation evaluation).

Bad input stops early with a message naming the key, the value and a fix
(:mod:`lpmetrics.run.validate`), and :func:`main` reports these errors without a traceback.
During training a non-finite score or loss stops with
:class:`~lpmetrics.run.guards.NonFiniteLossError` (step, batch summary, lr hint) before the
objective's solver sees it; an evaluation interval whose batches were all empty for the objective
(nothing to compare: a zero loss) stops with :class:`~lpmetrics.run.guards.DegenerateBatchesError`,
and more than 10 % degenerate batches warn.
"""
from __future__ import annotations

import math
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from omegaconf import DictConfig

from lpmetrics.data.errors import DamagedDatasetError, DatasetNotFoundError, SplitError
from lpmetrics.errors import ConfigError
from lpmetrics.run import runfolder
from lpmetrics.run.guards import DegenerateBatchesError, NonFiniteLossError
from lpmetrics.run.loop import train


class RunError(CompactHydraException):
    """A user error (bad config, missing or damaged data, refused resume, divergence): Hydra
    prints its message alone, without a traceback (``HYDRA_FULL_ERROR=1`` shows it)."""


USER_ERRORS = (ConfigError, runfolder.ResumeConfigError, runfolder.CheckpointError,
               DatasetNotFoundError, DamagedDatasetError, SplitError, NonFiniteLossError,
               DegenerateBatchesError)


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the final validation metric so sweepers can optimise it (NaN
    for a split without validation data, ``dataset.split=authors``: never the test metric).

    User errors (:data:`USER_ERRORS`) reach Hydra as :class:`RunError`, which it prints as one
    message without a traceback."""
    hydra_cfg = HydraConfig.get()
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra")}
    try:
        results = train(cfg, Path(hydra_cfg.runtime.output_dir), choices=choices)
    except USER_ERRORS as err:
        raise RunError(f"{type(err).__name__}: {err}") from err
    return float(results["final"].get(f"val_{results['primary_metric']}", math.nan))


if __name__ == "__main__":
    main()
