"""Launchers for runs beyond one machine, on top of ``hydra-submitit-launcher`` (docs/scaling.md).

``hydra/launcher=submitit_slurm_resumable`` (and ``submitit_local_resumable``, the same on this
machine through submitit's local executor): Hydra's submitit launcher, one SLURM job per run,
whose jobs continue from their run folder's ``last.pt`` when SLURM preempts them or they reach
their time limit. submitit then calls the job's ``checkpoint()`` and requeues what it returns
(submitit's ``Checkpointable`` protocol); Hydra's own launcher returns the same job unchanged, so
a requeued ``train.py`` would start again from step 0. Here the requeued job gets ``resume=true``
and its run folder pinned (``hydra.sweep.dir`` / ``hydra.sweep.subdir``: the default subdir
names the job by its overrides, which now include ``resume=true``), so ``train.py`` resumes as
``python train.py resume=true hydra.run.dir=<the run folder>`` does, and the run ends with the
metrics an uninterrupted one has. A job interrupted before its first evaluation has no
checkpoint and starts again as it was.

``hydra/launcher=submitit_slurm_packed`` (and ``submitit_local_packed``): the whole multirun as
one submitit job, in which ``hydra/launcher=packed`` trains the runs as packs (one node, one GPU,
N runs); ``hydra.launcher.max_pack`` and ``hydra.launcher.cuda_graph`` are the packed launcher's
options. The job returns every run's final validation metric, so sweepers (Optuna) work as with
any launcher. A pack cannot resume (the packed launcher refuses ``resume=true``): a preempted pack
job is requeued and trains its runs again from step 0, and one that reaches its time limit is not
requeued (``max_num_timeout`` stays 0); its runs' folders still hold their ``last.pt``.

Missing plugins. Where ``hydra-submitit-launcher``, ``hydra-joblib-launcher`` or
``hydra-optuna-sweeper`` is not installed, their choices (``hydra/launcher=submitit_slurm``, ...,
``hydra/sweeper=optuna``) and the four above are registered as stand-ins that stop the launch with
a :class:`PluginNotInstalledError` naming the packages to install, pinned as in requirements.txt,
instead of Hydra's "Could not find 'hydra/launcher/submitit_slurm'".

Hydra imports every plugin module at start-up: submitit and the project are imported only when a
job is launched or checkpointed. No ``from __future__ import annotations`` here: Hydra execs
plugin modules outside ``sys.modules``, where dataclasses cannot resolve string annotations.
"""

import importlib.util
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

SUBMITIT = ("hydra_plugins.hydra_submitit_launcher", ("hydra-submitit-launcher", "submitit"))
#: ``(group, choice)`` -> (the module that registers it, the packages it needs)
PLUGINS = {
    ("hydra/launcher", "submitit_local"): SUBMITIT,
    ("hydra/launcher", "submitit_slurm"): SUBMITIT,
    ("hydra/launcher", "submitit_local_resumable"): SUBMITIT,
    ("hydra/launcher", "submitit_slurm_resumable"): SUBMITIT,
    ("hydra/launcher", "submitit_local_packed"): SUBMITIT,
    ("hydra/launcher", "submitit_slurm_packed"): SUBMITIT,
    ("hydra/launcher", "joblib"): ("hydra_plugins.hydra_joblib_launcher", ("hydra-joblib-launcher", "joblib")),
    ("hydra/sweeper", "optuna"): ("hydra_plugins.hydra_optuna_sweeper",
                                  ("hydra-optuna-sweeper", "optuna", "sqlalchemy", "alembic")),
}
REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements.txt"


class PluginNotInstalledError(RuntimeError):
    """A ``hydra/launcher`` or ``hydra/sweeper`` choice whose plugin is not installed."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a missing parent, or a module blocked in sys.modules
        return False


def install_command(packages: Sequence[str], requirements: Path = REQUIREMENTS) -> str:
    """``pip install`` of ``packages`` with requirements.txt's pins (bare names without it)."""
    pins = {}
    if requirements.is_file():
        for line in requirements.read_text().splitlines():
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                pins[name.strip().lower()] = f"{name.strip()}=={version.strip()}"
    return "pip install " + " ".join(pins.get(p.lower(), p) for p in packages)


def not_installed_message(group: str, choice: str) -> str:
    module, packages = PLUGINS[(group, choice)]
    return (f"{group}={choice} needs {packages[0]}, which is not installed here (no {module}). "
            f"Install the cluster and tuning extras: `{install_command(packages)}` (pinned in "
            "requirements.txt and environment.yml), or choose another "
            f"{group} (docs/scaling.md)")


class MissingLauncher(Launcher):
    """Stand-in for a launcher whose plugin is not installed: says what to install."""

    def __init__(self, group: str, choice: str, **_: Any) -> None:
        raise PluginNotInstalledError(not_installed_message(group, choice))

    def setup(self, **_: Any) -> None:   # never reached: __init__ raises
        raise NotImplementedError

    def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:
        raise NotImplementedError


class MissingSweeper(Sweeper):
    """Stand-in for a sweeper whose plugin is not installed: says what to install."""

    def __init__(self, group: str, choice: str, **_: Any) -> None:
        raise PluginNotInstalledError(not_installed_message(group, choice))

    def setup(self, **_: Any) -> None:
        raise NotImplementedError

    def sweep(self, arguments: List[str]) -> Any:
        raise NotImplementedError


def _register_stand_ins() -> None:
    stand_in = {"hydra/launcher": MissingLauncher, "hydra/sweeper": MissingSweeper}
    for (group, choice), (module, _) in PLUGINS.items():
        if not installed(module):
            node = OmegaConf.create({"_target_": f"{__name__}.{stand_in[group].__name__}",
                                     "group": group, "choice": choice})
            # open, so that the documented overrides (hydra.launcher.partition=gpu, ...) compose
            # and the launch reaches the message rather than a "key not in struct" error
            OmegaConf.set_struct(node, False)
            ConfigStore.instance().store(group=group, name=choice, node=node,
                                         provider="cluster_launchers")


# ---- requeue: the run continues from its last.pt ---------------------------------------------

RESUME_KEYS = ("resume", "hydra.sweep.dir", "hydra.sweep.subdir")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def quoted(value: str) -> str:
    """``value`` as one quoted string of Hydra's override grammar (``=``, ``,`` and spaces kept):
    a quote is escaped, and so are the backslashes before a quote or the end (the only ones the
    grammar reads as escapes); ``${`` is escaped so that OmegaConf reads it as text."""
    body = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return "'" + body.replace("${", "\\${") + "'"


def requeue_overrides(overrides: Sequence[str], run_dir: Path, sweep_dir: Path) -> List[str]:
    """The overrides a requeued job runs with: ``resume=true`` (a ``resume=force`` given is kept)
    and its run folder ``run_dir`` pinned, once the folder holds a checkpoint; unchanged before
    the first (the job then starts again from step 0)."""
    from lpmetrics.run.runfolder import LAST, PREVIOUS   # the project's names; torch is loaded in the job

    if not any((run_dir / name).is_file() for name in (LAST, PREVIOUS)):
        return list(overrides)
    resume = [o for o in overrides if _key(o) == "resume" and o.split("=", 1)[1] in ("true", "force")]
    kept = [o for o in overrides if _key(o) not in RESUME_KEYS]
    subdir = os.path.relpath(run_dir.absolute(), sweep_dir.absolute())
    return kept + [resume[0] if resume else "resume=true", f"hydra.sweep.dir={quoted(str(sweep_dir))}",
                   f"hydra.sweep.subdir={quoted(subdir)}"]


def _checkpointed(launcher: Any, sweep_overrides: List[str], *args: Any) -> Any:
    """The ``DelayedSubmission`` submitit requeues: the same job with :func:`requeue_overrides`."""
    import submitit
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():   # the job's own Hydra config: its run folder
        hydra_cfg = HydraConfig.get()
        sweep_overrides = requeue_overrides(sweep_overrides, Path(hydra_cfg.runtime.output_dir),
                                            Path(str(hydra_cfg.sweep.dir)))
    log.info(f"Requeued with overrides: {' '.join(sweep_overrides)}")
    return submitit.helpers.DelayedSubmission(launcher, sweep_overrides, *args)


# ---- a pack per submitit job ------------------------------------------------------------------

def _executor(launcher: Any) -> Any:
    """The executor ``BaseSubmititLauncher.launch`` builds (hydra-submitit-launcher 1.2.0), for a
    launcher that submits one job instead of one per run."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    cluster, params = launcher._EXECUTOR, dict(launcher.params)
    init = {"folder": params.pop("submitit_folder")}
    if "max_num_timeout" in params:
        init[f"{cluster}_max_num_timeout"] = params.pop("max_num_timeout")
    executor = submitit.AutoExecutor(cluster=cluster, **init)
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in shared else f"{cluster}_{k}": v for k, v in params.items()})
    return executor


if installed(SUBMITIT[0]):
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobReturn
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
    from hydra_plugins.packed_launcher.packed_launcher import PackedLauncher

    class ResumableLocalLauncher(LocalLauncher):
        def checkpoint(self, sweep_overrides: List[str], *args: Any) -> Any:
            return _checkpointed(self, sweep_overrides, *args)

    class ResumableSlurmLauncher(SlurmLauncher):
        def checkpoint(self, sweep_overrides: List[str], *args: Any) -> Any:
            return _checkpointed(self, sweep_overrides, *args)

    class _PackedJob:
        """One submitit job in which the packed launcher trains all the multirun's runs."""

        def __init__(self, max_pack: Optional[int] = None, cuda_graph: bool = False, **params: Any) -> None:
            super().__init__(**params)   # type: ignore[call-arg]
            self.packed = PackedLauncher(max_pack=max_pack, cuda_graph=cuda_graph)

        def __call__(self, job_overrides: List[List[str]], initial_job_idx: int,
                     singleton_state: Dict[Any, Any]) -> Sequence[JobReturn]:
            Singleton.set_state(singleton_state)
            self.packed.setup(hydra_context=self.hydra_context, task_function=self.task_function,
                              config=self.config)
            return self.packed.launch(job_overrides, initial_job_idx)

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
            job = _executor(self).submit(self, [list(o) for o in job_overrides], initial_job_idx,
                                         Singleton.get_state())
            log.info(f"Submitit '{self._EXECUTOR}' job {job.job_id}: {len(job_overrides)} runs as "
                     f"packs, sweep output dir {self.config.hydra.sweep.dir}")
            return job.results()[0]

    class PackedLocalLauncher(_PackedJob, LocalLauncher):
        pass

    class PackedSlurmLauncher(_PackedJob, SlurmLauncher):
        pass

    @dataclass
    class ResumableLocalConf(LocalQueueConf):
        _target_: str = f"{__name__}.ResumableLocalLauncher"

    @dataclass
    class ResumableSlurmConf(SlurmQueueConf):
        _target_: str = f"{__name__}.ResumableSlurmLauncher"
        # requeues after a time limit (preemptions do not count): each continues from the last
        # evaluation, so a job progresses when timeout_min covers one trainer.eval_every interval.
        # Our choice; Hydra's submitit_slurm has 0 (never requeue on a time limit)
        max_num_timeout: int = 10

    @dataclass
    class PackedLocalConf(LocalQueueConf):
        _target_: str = f"{__name__}.PackedLocalLauncher"
        max_pack: Optional[int] = None   # the packed launcher's options (hydra/launcher=packed)
        cuda_graph: bool = False

    @dataclass
    class PackedSlurmConf(SlurmQueueConf):
        _target_: str = f"{__name__}.PackedSlurmLauncher"
        max_pack: Optional[int] = None
        cuda_graph: bool = False

    for _name, _node in (("submitit_local_resumable", ResumableLocalConf),
                         ("submitit_slurm_resumable", ResumableSlurmConf),
                         ("submitit_local_packed", PackedLocalConf),
                         ("submitit_slurm_packed", PackedSlurmConf)):
        ConfigStore.instance().store(group="hydra/launcher", name=_name, node=_node,
                                     provider="cluster_launchers")

_register_stand_ins()
