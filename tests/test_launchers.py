"""Beyond one machine (docs/scaling.md): Hydra's submitit, joblib and Optuna plugins run
``train.py`` on digits, a preempted submitit job resumes from its ``last.pt``, a pack trains inside
one submitit job, SLURM commands compose, and a missing plugin says what to install.

Every multirun goes through ``train.py`` in a subprocess, as a user runs it, with submitit's real
local executor where SLURM would be (one process per job, the same pickles, signals and requeue
as on a cluster). ``main`` returns the final validation metric (``val_auc`` on binary digits), so
each test checks that the value a launcher hands back is the one the run folder's
``results.json`` holds.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.utils import instantiate

from hydra_plugins.cluster_launchers import cluster_launchers as cl

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["dataset=digits", "model=mlp", "trainer.max_steps=20", "trainer.eval_every=10",
         "trainer.batch_size=32", "device=cpu"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def train_py(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=ENV)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def run_folders(sweep: Path) -> list[Path]:
    return sorted(p.parent for p in sweep.glob("*/results.json"))


def final_val(folder: Path) -> float:
    return json.loads((folder / "results.json").read_text())["final"]["val_auc"]


def submitit_results(sweep: Path) -> list:
    """What each submitit job returned to the launcher (submitit's result pickle)."""
    out = []
    for path in sorted(sweep.glob(".submitit/*/*_result.pkl")):
        outcome, value = pickle.loads(path.read_bytes())
        assert outcome == "success", value
        out.append(value)
    return out


def test_submitit_local_runs_each_job_in_its_folder_and_returns_mains_value(tmp_path):
    train_py("-m", "hydra/launcher=submitit_local", *SHORT, "seed=0,1", f"hydra.sweep.dir={tmp_path}")
    folders = run_folders(tmp_path)
    assert [f.name[:2] for f in folders] == ["0_", "1_"]
    for folder in folders:
        assert all((folder / name).is_file() for name in ("metrics.csv", "results.json", "last.pt"))
    returns = submitit_results(tmp_path)   # one submitit job per run, each a JobReturn
    assert len(returns) == 2
    for ret in returns:
        folder = Path(ret.hydra_cfg.hydra.runtime.output_dir)
        assert ret.status == JobStatus.COMPLETED and ret.return_value == final_val(folder)
    assert {Path(r.hydra_cfg.hydra.runtime.output_dir) for r in returns} == set(folders)


def test_joblib_runs_the_jobs_in_worker_processes(tmp_path):
    proc = train_py("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *SHORT, "seed=0,1",
                    f"hydra.sweep.dir={tmp_path}",
                    # each job logs, in its own train.log, the value main returned; the driver's
                    # log and the jobs' name their process
                    "+hydra.callbacks.log_return._target_=hydra.experimental.callbacks.LogJobReturnCallback",
                    "hydra.job_logging.formatters.simple.format='[%(process)d] %(message)s'",
                    "hydra.hydra_logging.formatters.simple.format='[%(process)d] %(message)s'")
    driver = next(l for l in proc.stdout.splitlines() if "Joblib.Parallel(n_jobs=2" in l)
    driver_pid = int(driver[1:].split("]")[0])
    folders = run_folders(tmp_path)
    assert len(folders) == 2
    for folder in folders:
        line = next(l for l in (folder / "train.log").read_text().splitlines()
                    if "Succeeded with return value" in l)
        pid, value = int(line[1:].split("]")[0]), float(line.rsplit(":", 1)[1])
        assert pid != driver_pid   # a joblib worker ran the job
        assert value == final_val(folder)
        assert (folder / "metrics.csv").is_file()


def test_optuna_tunes_lr_on_the_validation_metric_main_returns(tmp_path):
    train_py("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1",
             "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=0",
             "optimizer.lr=tag(log,interval(0.001,0.1))", *SHORT, f"hydra.sweep.dir={tmp_path}")
    folders = run_folders(tmp_path)
    assert len(folders) == 3
    trials = {json.loads((f / "results.json").read_text())["config"]["optimizer"]["lr"]: final_val(f)
              for f in folders}
    assert len(trials) == 3 and all(0.001 <= lr <= 0.1 for lr in trials)
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert best["name"] == "optuna"
    assert best["best_value"] == max(trials.values())   # maximised: val_auc, as main returns it
    assert trials[best["best_params"]["optimizer.lr"]] == best["best_value"]


SLURM = ["hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=1", "hydra.launcher.timeout_min=600"]


def test_submitit_slurm_command_composes():
    # Hydra 1.3 takes --cfg without -m (together they stop with "Only one of --run, --multirun,
    # --cfg ..."); the launcher node it prints is the one the multirun would use
    proc = train_py("hydra/launcher=submitit_slurm", *SLURM, "--cfg", "hydra")
    launcher = yaml.safe_load(proc.stdout)["hydra"]["launcher"]
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert (launcher["partition"], launcher["gpus_per_node"], launcher["timeout_min"]) == ("gpu", 1, 600)


@pytest.mark.parametrize("choice, requeues", [("submitit_slurm", 0), ("submitit_slurm_resumable", 10),
                                              ("submitit_slurm_packed", 0)])
def test_slurm_launchers_write_the_sbatch_file(choice, requeues, tmp_path, monkeypatch):
    """The sbatch script each SLURM launcher would submit, rendered by submitit without a
    cluster (submitit only checks that an ``srun`` is on the PATH: a stub here)."""
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("config", overrides=[f"hydra/launcher={choice}", *SLURM, "hydra.job.name=train",
                                               f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          return_hydra_config=True)
        launcher = instantiate(cfg.hydra.launcher)
    finally:
        GlobalHydra.instance().clear()
    executor = cl._executor(launcher)._executor
    assert executor.max_num_timeout == requeues
    sbatch = executor._make_submission_file_text("python -u -m submitit.core._submit FOLDER", "uid")
    for line in ("--partition=gpu", "--gpus-per-node=1", "--time=600", "--signal=USR2@120",
                 f"--output={tmp_path / 'sweep'}/.submitit/%j/%j_0_log.out"):
        assert f"#SBATCH {line}\n" in sbatch, sbatch


@pytest.mark.parametrize("module, args, packages", [
    ("hydra_plugins.hydra_optuna_sweeper",
     ["hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "optimizer.lr=interval(0.001,0.1)"],
     "hydra-optuna-sweeper==1.3.0 optuna==2.10.1 sqlalchemy==1.4.54 alembic==1.19.2"),
    ("hydra_plugins.hydra_submitit_launcher", ["hydra/launcher=submitit_slurm", *SLURM, "seed=0,1"],
     "hydra-submitit-launcher==1.2.0 submitit==1.5.4"),
])
def test_a_missing_plugin_says_what_to_install(module, args, packages, tmp_path):
    """Without the plugin (hidden here from the import system), Hydra alone would stop with
    "Could not find 'hydra/sweeper/optuna'"; the project's stand-in names the pinned packages."""
    code = (f"import runpy, sys; sys.modules[{module!r}] = None; "
            f"sys.argv = ['train.py', '-m', *{args!r}, 'hydra.sweep.dir={tmp_path}']; "
            "runpy.run_path('train.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=ENV)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "PluginNotInstalledError" in err and f"pip install {packages}" in err, err[-3000:]
    assert not run_folders(tmp_path)   # stopped before any job


def test_install_command_reads_the_pins_of_requirements_txt(tmp_path):
    assert cl.install_command(["hydra-joblib-launcher", "joblib"]) == \
        "pip install hydra-joblib-launcher==1.2.0 joblib==1.6.0"
    assert cl.install_command(["optuna"], tmp_path / "absent.txt") == "pip install optuna"
    assert "docs/scaling.md" in cl.not_installed_message("hydra/launcher", "joblib")


def test_requeue_overrides_resume_in_the_same_folder(tmp_path):
    parse = OverridesParser.create().parse_override
    sweep = tmp_path / "sweep 'a' b\\c"   # a quote, a space and a backslash in the path
    run_dir = sweep / "0_seed=0,trainer.max_steps=9"
    run_dir.mkdir(parents=True)
    overrides = ["seed=0", "trainer.max_steps=9"]
    assert cl.requeue_overrides(overrides, run_dir, sweep) == overrides   # no checkpoint yet
    (run_dir / "last.prev.pt").write_bytes(b"")   # a checkpoint: last.pt or the previous one
    requeued = cl.requeue_overrides(overrides, run_dir, sweep)
    assert requeued[:3] == [*overrides, "resume=true"]
    pinned = {parse(o).key_or_group: parse(o).value() for o in requeued[3:]}
    assert pinned == {"hydra.sweep.dir": str(sweep), "hydra.sweep.subdir": run_dir.name}
    again = cl.requeue_overrides(["resume=force", *requeued], run_dir, sweep)
    assert [o for o in again if o.startswith("resume")] == ["resume=force"]
    assert len(again) == len(requeued)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the job's process in /proc")
def test_preempted_job_is_requeued_and_resumes_from_last_pt(tmp_path):
    """Job 0 gets SIGUSR2, the signal SLURM sends on preemption (``--signal=USR2@...``), once it
    has written a checkpoint; submitit calls the launcher's ``checkpoint()`` and requeues the job,
    which resumes from ``last.pt``. Job 1 is the same run uninterrupted (``trainer.log_every`` only
    paces the progress bar): the two ``metrics.csv`` must be identical."""
    short = [o.replace("max_steps=20", "max_steps=120") for o in SHORT]
    cmd = [sys.executable, "train.py", "-m", "hydra/launcher=submitit_local_resumable", *short,
           "trainer.log_every=50,51", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        deadline, task = time.monotonic() + 240, None
        while task is None and time.monotonic() < deadline and proc.poll() is None:
            first = [d for d in tmp_path.glob("0_*") if (d / "last.pt").is_file()]
            if first:
                hydra_yaml = yaml.safe_load((first[0] / ".hydra" / "hydra.yaml").read_text())
                # the local executor's job id is its controller's pid; the job runs in its child
                tasks = _children(int(hydra_yaml["hydra"]["job"]["id"]))
                assert len(tasks) == 1, tasks
                task = tasks[0]
                os.kill(task, signal.SIGUSR2)
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert task is not None and proc.returncode == 0, out[-3000:]
    interrupted, uninterrupted = run_folders(tmp_path)
    launches = json.loads((interrupted / "results.json").read_text())["launches"]
    assert [la["resume"] for la in launches] == [False, True] and launches[1]["start_step"] > 0
    log = "".join(p.read_text() for p in tmp_path.glob(".submitit/*/*_0_log.out"))
    assert "this job is preempted" in log and "Requeued job" in log
    metrics = (interrupted / "metrics.csv").read_text()
    assert metrics == (uninterrupted / "metrics.csv").read_text()
    assert len(metrics.splitlines()) == 1 + 12   # header and the evaluations at steps 10, ..., 120
    returns = {Path(r.hydra_cfg.hydra.runtime.output_dir): r.return_value for r in submitit_results(tmp_path)}
    assert returns[interrupted] == final_val(interrupted) == final_val(uninterrupted)


def test_a_pack_trains_inside_one_submitit_job(tmp_path):
    train_py("-m", "hydra/launcher=submitit_local_packed", *SHORT, "seed=0,1,2",
             f"hydra.sweep.dir={tmp_path}")
    (returns,) = submitit_results(tmp_path)   # one submitit job for the three runs
    folders = run_folders(tmp_path)
    assert len(folders) == 3 and len(returns) == 3
    for ret, folder in zip(returns, folders):
        results = json.loads((folder / "results.json").read_text())
        assert results["packed"]["size"] == 3 and results["final"]["step"] == 20
        assert ret.status == JobStatus.COMPLETED and ret.return_value == final_val(folder)
        assert not math.isnan(ret.return_value)


@pytest.mark.slow   # combines what the tests above cover; ~40 s on 2 busy cores
def test_optuna_batches_as_packs(tmp_path):
    """With a pack launcher, each batch of ``hydra.sweeper.n_jobs`` trials is one submitit job."""
    train_py("-m", "hydra/sweeper=optuna", "hydra/launcher=submitit_local_packed", "hydra.sweeper.n_trials=4",
             "hydra.sweeper.n_jobs=2", "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=0",
             "optimizer.lr=tag(log,interval(0.001,0.1))", *SHORT, f"hydra.sweep.dir={tmp_path}")
    batches = submitit_results(tmp_path)
    assert [len(b) for b in batches] == [2, 2]
    folders = run_folders(tmp_path)
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert best["best_value"] == max(final_val(f) for f in folders)
    assert all(json.loads((f / "results.json").read_text())["packed"]["size"] == 2 for f in folders)
