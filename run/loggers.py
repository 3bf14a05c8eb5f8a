"""Run loggers. ``metrics.csv`` / ``results.json`` are always written by the trainer; a logger
mirrors each evaluation row elsewhere (wandb) and is closed in a ``finally``."""
from __future__ import annotations

from typing import Any


class CSVLogger:
    """No-op: the trainer's own CSV/JSON files are the record."""

    def __init__(self, run_dir: str | None = None, config: dict | None = None) -> None:
        pass

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def summary(self, results: dict[str, Any]) -> None:
        pass

    def finish(self) -> None:
        pass


class WandbLogger(CSVLogger):
    """Weights & Biases, offline by default (``mode=online`` needs ``wandb login``)."""

    def __init__(self, run_dir: str, config: dict, project: str = "lp-nondecomposable",
                 entity: str | None = None, mode: str = "offline", tags: list | None = None) -> None:
        import wandb

        self._wandb = wandb
        self.run = wandb.init(project=project, entity=entity, mode=mode, dir=run_dir,
                              config=config, tags=list(tags or []), reinit="finish_previous")

    def log(self, row: dict[str, Any], step: int) -> None:
        self.run.log(row, step=step)

    def summary(self, results: dict[str, Any]) -> None:
        for key, value in results.items():
            if isinstance(value, (int, float, str)):
                self.run.summary[key] = value

    def finish(self) -> None:
        self.run.finish()
