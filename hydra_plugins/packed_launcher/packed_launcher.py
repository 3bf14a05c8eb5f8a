"""Hydra launcher plugin ``packed``: ``python train.py -m ... hydra/launcher=packed``.

Hydra finds it in the ``hydra_plugins`` namespace package (no ``__init__.py`` in
``hydra_plugins/``), as it finds ``hydra-joblib-launcher``. For every job the launcher composes
the job's config and lets Hydra's ``run_job`` make its run folder (``.hydra/``, the job log,
callbacks) with a task that only records the job; then :func:`packed.launch.train_packed` trains
all recorded jobs as packs and each job's return value becomes its final validation metric (as
``train.py``'s ``main`` returns; NaN for a run that diverged before its first evaluation).

It runs ``train.py``'s training whatever the decorated task function is: it is ``train.py``'s
launcher, not a general one. Heavy imports (torch, the project) wait until :meth:`launch`, since
Hydra imports every plugin at start-up.

No ``from __future__ import annotations`` here: Hydra execs plugin modules outside
``sys.modules``, where dataclasses cannot resolve string annotations.

Options: ``hydra.launcher.max_pack`` (default null = no limit): at most this many runs per pack;
``hydra.launcher.cuda_graph`` (default false): replay capturable packs from a CUDA graph
(:mod:`packed.graph`; packs that cannot be captured run eagerly and the log says why).
"""

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


@dataclass
class PackedLauncherConf:
    _target_: str = "hydra_plugins.packed_launcher.packed_launcher.PackedLauncher"
    max_pack: Optional[int] = None   # null: one pack per compatible group, however large
    cuda_graph: bool = False         # true: CUDA-graph replay of capturable packs (packed/graph.py)


ConfigStore.instance().store(group="hydra/launcher", name="packed", node=PackedLauncherConf,
                             provider="packed_launcher")


class PackedLauncher(Launcher):
    def __init__(self, max_pack: Optional[int] = None, cuda_graph: bool = False) -> None:
        if max_pack is not None and max_pack < 1:
            raise ValueError(f"hydra.launcher.max_pack={max_pack}: give a positive pack size or null")
        self.max_pack, self.cuda_graph = max_pack, bool(cuda_graph)
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from lpmetrics.packed.launch import Job, train_packed   # torch and the project: only when launching

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Packed launcher: preparing {len(job_overrides)} jobs")
        jobs, returns = [], []
        # jobs are named by the overrides that vary between them (the shared ones say nothing)
        shared = set.intersection(*(set(filter_overrides(o)) for o in job_overrides)) \
            if len(job_overrides) > 1 else set()
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            name = " ".join([f"#{idx}"] + [o for o in filter_overrides(overrides) if o not in shared])
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            recorded: dict[str, Any] = {}

            def record(cfg: DictConfig) -> None:
                runtime = HydraConfig.get().runtime
                recorded["job"] = Job(cfg=cfg, run_dir=Path(runtime.output_dir), name=name,
                                      choices={k: v for k, v in runtime.choices.items()
                                               if not k.startswith("hydra")})

            returns.append(run_job(hydra_context=self.hydra_context, task_function=record,
                                   config=sweep_config, job_dir_key="hydra.sweep.dir",
                                   job_subdir_key="hydra.sweep.subdir"))
            jobs.append(recorded.get("job"))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        ready = [i for i, job in enumerate(jobs) if job is not None]   # others failed in run_job
        outcomes = train_packed([jobs[i] for i in ready], max_pack=self.max_pack, cuda_graph=self.cuda_graph)
        for i, outcome in zip(ready, outcomes):
            if isinstance(outcome, Exception):
                returns[i].status, returns[i].return_value = JobStatus.FAILED, outcome
            else:
                final = outcome["final"]
                returns[i].return_value = (float(final[f"val_{outcome['primary_metric']}"])
                                           if final else math.nan)
        return returns
