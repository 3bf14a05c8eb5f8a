"""Fault suite: a killed run never loses its checkpoint, a resume never mixes two configs, and no
bad input trains silently.

* Bad inputs: each case is refused with a message naming the key, the value and a fix (asserted
  here, not just the exception type), before the data is built wherever it can be.
* Resume: a differing config is refused (listing the keys) unless ``resume=force``, which
  results.json records; a damaged ``last.pt`` falls back to ``last.prev.pt`` and says so.
* Kills: ``train.py`` runs in a subprocess (this file run as ``python -m tests.test_faults``,
  which installs the fault named by ``$FAULT`` and calls ``train.main``) and SIGKILLs itself at
  chosen points -- in the middle of writing ``last.pt`` / ``metrics.csv`` / ``results.json``,
  between keeping ``last.prev.pt`` and renaming the new ``last.pt`` into place, right after a
  checkpoint, between two steps -- then resumes; the run must end bit-identical to an
  uninterrupted one (same metrics.csv bytes, same checkpoint tensors).  The ``slow`` part adds
  kills at random wall-clock times and every (point, file) combination.
"""
from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import train
from lpmetrics import atomic
from lpmetrics.errors import ConfigError
from lpmetrics.objectives.base import Objective
from lpmetrics.objectives.common import zero_loss
from lpmetrics.run import loop, prepare
from lpmetrics.run import runfolder
from lpmetrics.run.guards import DegenerateBatchesError, DegenerateBatchesWarning, NonFiniteLossError
from lpmetrics.run.resume import CheckpointFallbackWarning

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["dataset=digits", "model=mlp", "trainer.max_steps=20", "trainer.eval_every=10",
         "trainer.batch_size=32", "device=cpu", "logger=csv"]


def _no_data(*args, **kwargs):
    raise AssertionError("the data were built before the config was checked")


# ---- bad inputs ---------------------------------------------------------------------------------

REFUSED_BEFORE_DATA = [
    (["trainer.max_steps=0"], r"trainer.max_steps=0 must be an integer >= 1, e.g. trainer.max_steps=1000"),
    (["trainer.eval_every=0"], r"trainer.eval_every=0 must be an integer >= 1"),
    (["trainer.batch_size=0"], r"trainer.batch_size=0 must be an integer >= 1"),
    (["trainer.log_every=0"], r"trainer.log_every=0 must be an integer >= 1"),
    (["trainer.eval_batch_size=-1"], r"trainer.eval_batch_size=-1 must be an integer >= 1"),
    (["objective=auc_lp", "trainer.batch_size=1"],
     r"trainer.batch_size=1 is too small for objective=AUCLoss: .* needs at least 2 .* use e.g. trainer.batch_size=64"),
    (["objective=f1_lp", "trainer.batch_size=1"], r"trainer.batch_size=1 is too small for objective=F1LPLoss"),
    (["objective=auc_lp", "dataset.task=multiclass"],
     r"objective=AUCLoss trains binary tasks only but dataset.task=multiclass; use a multi-class "
     r"objective \(objective=auc_ova_lp, auc_mu_lp or ce\) or dataset.task=binary"),
    (["dataset.task=ranking"], r"dataset.task='ranking' must be one of \('binary', 'multiclass'\)"),
    (["resume=maybe"], r"resume='maybe' must be false, true .* or force"),
    (["trainer.max_grad_norm=-1"], r"trainer.max_grad_norm=-1 must be null \(no clipping\) or a finite number > 0"),
    (["optimizer.lr=nan"], r"optimizer.lr=nan must be a finite number >= 0"),
    (["device=tpu9"], r"device='tpu9' is not a device name"),
    (["objective._target_=lpmetrics.objectives.common.zero_loss"],
     r"objective._target_='lpmetrics.objectives.common.zero_loss' is not an importable class .*non-class"),
    (["trainer.max_steps=0", "trainer.eval_every=0"], r"invalid config \(2 problems\):\n  - trainer.max_steps=0"),
    (["seed=abc"], r"seed='abc' must be an integer \(it seeds .*\), e.g. seed=0"),
    (["seed=1.5"], r"seed=1.5 must be an integer"),
    (["dataset.neg_keep=2"], r"dataset.neg_keep=2.0 must be in \(0, 1\]: .* use dataset.neg_keep=0.1, 0.2, 0.4 or 1.0"),
    (["dataset.neg_keep=many"], r"dataset.neg_keep='many' must be a number, e.g. dataset.neg_keep=0.1"),
    (["dataset.drop_rate=0.9"], r"dataset.drop_rate=0.9: drop_rate is the multiclass knob; for task=binary set "
                                r"dataset.drop_rate=0 and use dataset.neg_keep"),
    (["dataset.split=holdout"], r"dataset.split='holdout' must be one of paper, authors"),
    (["dataset.normalize=tf"], r"dataset.normalize='tf' must be one of per_channel, per_image"),
    (["scheduler.stages={first:2000,growth:3}"],
     r"scheduler.milestones=\[2000, 10000, 25000\] and scheduler.stages are both set; .* set scheduler.milestones=\[\]"),
    (["scheduler.stages={first:-5,growth:3}", "scheduler.milestones=[]"], r"scheduler.stages.first=-5 must be an integer >= 1"),
]


@pytest.mark.parametrize("overrides, message", REFUSED_BEFORE_DATA,
                         ids=[" ".join(o) for o, _ in REFUSED_BEFORE_DATA])
def test_bad_config_is_refused_before_any_data_is_built(compose_cfg, tmp_path, monkeypatch,
                                                        overrides, message):
    monkeypatch.setattr(prepare, "build_data", _no_data)
    with pytest.raises(ConfigError, match=message):
        loop.train(compose_cfg([*SHORT, *overrides]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_before_the_data(compose_cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "build_data", _no_data)
    with pytest.raises(ConfigError, match=r"device=cuda but this machine has no usable CUDA GPU "
                                                r".* use device=auto or device=cpu"):
        loop.train(compose_cfg([*SHORT, "device=cuda"]), tmp_path)


@pytest.mark.parametrize("overrides, message", [
    (["trainer.batch_size=5000"],
     r"trainer.batch_size=5000 is larger than the train split \(1077 samples of dataset=digits\); "
     r"every step would train on those 1077 while the results record 5000: use trainer.batch_size<=1077"),
    (["objective=auc_lp", "objective.epsilon=inf"],
     r"objective could not be built from the config \(objective._target_=lpmetrics.objectives.auc.AUCLoss\): "
     r"ValueError: epsilon must be a finite number > 0 \(the ramp width, e.g. 0.01\); got inf"),
    (["objective=auc_lp", "+objective.solver.tol=-1"],
     r"objective could not be built .*bad solver option\(s\): tol=-1 must be a finite number > 0"),
])
def test_bad_config_needing_the_data_is_refused_before_training(compose_cfg, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        loop.train(compose_cfg([*SHORT, *overrides]), tmp_path)
    assert not (tmp_path / "last.pt").exists() and not (tmp_path / "metrics.csv").exists()


class AlwaysEmpty(Objective):
    """Every batch is empty for it (as ``batch_size=1`` is for a pairwise loss): zero loss."""

    def forward(self, logits, labels):
        self.record(degenerate_batches=1.0, empty_batches=1.0)
        return zero_loss(logits)


def test_all_batches_empty_stops_with_an_error(compose_cfg, tmp_path):
    cfg = compose_cfg([*SHORT, "objective._target_=tests.test_faults.AlwaysEmpty",
                       "~objective.label_smoothing", "trainer.eval_every=5"])
    with pytest.raises(DegenerateBatchesError,
                       match=r"every batch of steps 1-5 was empty for the objective \(tests.test_faults.AlwaysEmpty\)"
                             r": nothing to compare .* the model did not train\. trainer.batch_size=32 with "
                             r"train class counts \[\d+, \d+\]: raise trainer.batch_size"):
        loop.train(cfg, tmp_path)
    assert not (tmp_path / "last.pt").exists()


def test_mostly_degenerate_batches_warn_and_are_recorded(compose_cfg, tmp_path):
    cfg = compose_cfg([*SHORT, "objective=auc_lp", "trainer.batch_size=2", "dataset.neg_keep=0.5"])
    with pytest.warns(DegenerateBatchesWarning,
                      match=r"\d+ % of the batches of steps 1-10 were degenerate for the objective .*"
                            r"consider a larger trainer.batch_size"):
        results = loop.train(cfg, tmp_path)
    summary = json.loads((tmp_path / "results.json").read_text())["degenerate_batches"]
    rows = results["final"], json.loads((tmp_path / "results.json").read_text())["final"]
    assert summary == results["degenerate_batches"] and rows[0] == rows[1]
    assert 0.1 < summary["fraction"] < 1.0 and summary["fraction"] == summary["empty_fraction"]
    assert summary["max_interval_fraction"] >= summary["fraction"]


class NaNAfter(torch.nn.Module):
    """Wraps a model; its scores turn NaN from the ``at``-th forward pass in training mode."""

    def __init__(self, model, at):
        super().__init__()
        self.model, self.at, self.calls = model, at, 0

    def forward(self, x):
        out = self.model(x)
        if self.training:
            self.calls += 1
            if self.calls >= self.at:
                out = out * float("nan")
        return out


def test_non_finite_scores_stop_before_the_lp_solver(compose_cfg, tmp_path, monkeypatch):
    from lpmetrics import solver
    build = prepare.build_model
    monkeypatch.setattr(prepare, "build_model", lambda cfg, bundle: NaNAfter(build(cfg, bundle), at=3))
    real_solve, seen = solver.solve_lp, []

    def solve_lp(c, A, b, *args, **kwargs):
        seen.append(bool(torch.isfinite(b).all()))
        return real_solve(c, A, b, *args, **kwargs)

    monkeypatch.setattr(solver, "solve_lp", solve_lp)
    cfg = compose_cfg([*SHORT, "objective=auc_lp", "trainer.eval_every=2"])
    with pytest.raises(NonFiniteLossError,
                       match=r"scores are non-finite \(64 of 64 NaN/inf\) at step 3; labels per class "
                             r"\[\d+, \d+\]; .* The last good checkpoint is .*last.pt \(step 2\): rerun with "
                             r"a smaller optimizer.lr \(now 0.1\) or trainer.max_grad_norm=5 and resume=force"):
        loop.train(cfg, tmp_path)
    assert seen == [True, True]   # the solver saw steps 1-2 only, never a NaN


def test_divergence_before_the_first_checkpoint_says_there_is_none(compose_cfg, tmp_path, monkeypatch):
    build = prepare.build_model
    monkeypatch.setattr(prepare, "build_model", lambda cfg, bundle: NaNAfter(build(cfg, bundle), at=1))
    with pytest.raises(NonFiniteLossError,
                       match=r"at step 1; .* No checkpoint was written yet \(the first comes at step 10\): "
                             r"rerun with a smaller optimizer.lr"):
        loop.train(compose_cfg(SHORT), tmp_path)


# ---- resume -------------------------------------------------------------------------------------

@pytest.mark.parametrize("changed, keys", [
    (["objective=f1_lp"], ["objective._target_", "objective.bound"]),
    (["optimizer.lr=0.01"], ["optimizer.lr"]),
    (["seed=1"], ["seed"]),
])
def test_resume_with_a_different_config_is_refused(compose_cfg, tmp_path, changed, keys):
    loop.train(compose_cfg([*SHORT, "trainer.max_steps=10"]), tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(runfolder.ResumeConfigError) as err:
        loop.train(compose_cfg([*SHORT, "resume=true", *changed]), tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"resume=true would continue the run in {tmp_path} with a different config (")
    for key in keys:
        assert f"{key}: " in msg
    assert "pass resume=force to continue anyway (recorded in results.json)" in msg
    assert "trainer.max_steps" in msg.split("Keys a resume may change:")[1]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before   # nothing touched


def test_config_differences_respect_the_allow_list_and_name_new_keys():
    old = {"seed": 0, "resume": False, "trainer": {"max_steps": 10, "eval_bn": "eval"},
           "logger": {"_target_": "loggers.CSVLogger"}, "dataset": {"root": "/a", "neg_keep": 0.1}}
    new = {"seed": 0, "resume": True, "trainer": {"max_steps": 20, "eval_bn": "train", "new": 1},
           "logger": {"_target_": "loggers.WandbLogger", "mode": "offline"},
           "dataset": {"root": "/b", "neg_keep": 0.2}}
    diffs = runfolder.config_differences(old, new)
    assert diffs == {"dataset.neg_keep": [0.1, 0.2], "trainer.eval_bn": ["eval", "train"],
                     "trainer.new": ["<absent>", 1]}
    assert "('<absent>': the key did not exist in that config)" in \
        runfolder.resume_mismatch_message(Path("run"), diffs)


def test_resume_force_continues_and_is_recorded(compose_cfg, tmp_path):
    loop.train(compose_cfg([*SHORT, "trainer.max_steps=10"]), tmp_path)
    results = loop.train(compose_cfg([*SHORT, "resume=force", "optimizer.lr=0.05"]), tmp_path)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["resume_forced"] is True and results["final"]["step"] == 20
    first = dict(on_disk["launches"][0])
    assert first.pop("git_commit")   # the code version of each launch
    assert first.pop("optimizer_impl") == {"requested": "eager", "impl": "eager", "optimizer": "SGD"}   # its step
    assert first == {"start_step": 0, "resume": False, "batch_stream": "seeded-epoch-v2"}
    assert on_disk["launches"][1]["forced_differences"] == {"optimizer.lr": [0.1, 0.05]}
    assert on_disk["launches"][1]["resume"] == "force" and on_disk["config"]["optimizer"]["lr"] == 0.05


def test_resume_may_extend_max_steps_and_equals_the_longer_run(compose_cfg, tmp_path):
    full = loop.train(compose_cfg(SHORT), tmp_path / "full")
    loop.train(compose_cfg([*SHORT, "trainer.max_steps=10"]), tmp_path / "split")
    resumed = loop.train(compose_cfg([*SHORT, "resume=true", "logger=csv"]), tmp_path / "split")
    assert resumed["resume_forced"] is False and resumed["launches"][1]["forced_differences"] is None
    assert_same_run(tmp_path / "full", tmp_path / "split")
    assert resumed["final"] == full["final"]


def test_refused_resume_restores_the_runs_hydra_files(compose_cfg, tmp_path):
    hydra = tmp_path / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "overrides.yaml").write_text("- trainer.max_steps=10\n")       # the first launch's
    loop.train(compose_cfg([*SHORT, "trainer.max_steps=10"]), tmp_path)
    (hydra / "overrides.yaml").write_text("- seed=3\n- resume=true\n")      # Hydra, at relaunch
    with pytest.raises(runfolder.ResumeConfigError, match="seed: 0 in the checkpoint, 3 now"):
        loop.train(compose_cfg([*SHORT, "resume=true", "seed=3"]), tmp_path)
    assert (hydra / "overrides.yaml").read_text() == "- trainer.max_steps=10\n"
    assert (hydra / "overrides.resume-step10.yaml").read_text() == "- seed=3\n- resume=true\n"


def test_damaged_last_pt_falls_back_to_the_previous_checkpoint(compose_cfg, tmp_path):
    cfg = [*SHORT, "trainer.eval_every=5"]
    loop.train(compose_cfg(cfg), tmp_path / "full")
    loop.train(compose_cfg([*cfg, "trainer.max_steps=15"]), tmp_path / "cut")
    last = tmp_path / "cut" / "last.pt"
    last.write_bytes(last.read_bytes()[:262_144 // 64])     # what a kill mid-torch.save used to leave
    with pytest.warns(CheckpointFallbackWarning,
                      match=r"last.pt is damaged \(a checkpoint archive cut short \(4096 bytes, no zip directory "
                            r"at its end\): written or copied only in part\); using the previous "
                            r"checkpoint .*last.prev.pt \(step 10\) instead: the steps after it are trained again"):
        resumed = loop.train(compose_cfg([*cfg, "resume=true"]), tmp_path / "cut")
    assert resumed["launches"][-1]["checkpoint"] == "last.prev.pt"
    assert resumed["launches"][-1]["fallback"].startswith("last.pt is damaged (a checkpoint archive cut short")
    assert str(tmp_path) not in (tmp_path / "cut" / "results.json").read_text()   # portable
    assert_same_run(tmp_path / "full", tmp_path / "cut")


def test_a_last_pt_of_text_is_named_so_without_advice_to_load_it_unsafely(compose_cfg, tmp_path):
    loop.train(compose_cfg([*SHORT, "trainer.max_steps=10", "trainer.eval_every=5"]), tmp_path)
    (tmp_path / "last.pt").write_bytes(b"not a ck")       # 8 bytes of text
    ckpt, path, note = runfolder.load_checkpoint(tmp_path)
    assert path.name == "last.prev.pt" and ckpt["step"] == 5
    assert "is damaged (not a checkpoint: its 8 bytes are neither torch's zip archive nor a pickle)" in note
    assert "weights_only" not in note and note.endswith("the steps after it are trained again")
    _, _, note = runfolder.load_checkpoint(tmp_path, consequence="the metrics are of that step")
    assert note.endswith("instead: the metrics are of that step")


def test_no_usable_checkpoint_names_both_files(compose_cfg, tmp_path):
    loop.train(compose_cfg([*SHORT, "trainer.max_steps=10", "trainer.eval_every=5"]), tmp_path)
    for name in ("last.pt", "last.prev.pt"):
        (tmp_path / name).write_bytes(b"PK\x03\x04 not a checkpoint")
    with pytest.raises(runfolder.CheckpointError,
                       match=r"no usable checkpoint in .*: .*last.pt is damaged \(.*\); .*last.prev.pt is "
                             r"damaged \(.*\)\. Start afresh \(resume=false, or a new hydra.run.dir\)"):
        loop.train(compose_cfg([*SHORT, "resume=true"]), tmp_path)


# ---- eval.py --------------------------------------------------------------------------------------

def test_eval_accepts_a_checkpoint_path_and_falls_back_from_a_damaged_last_pt(compose_cfg, tmp_path, capsys):
    import eval as ev
    loop.train(compose_cfg([*SHORT, "trainer.eval_every=5"]), tmp_path / "run")
    run = tmp_path / "run"
    record = ev.main([str(run / "last.pt"), "--device", "cpu", "--out", str(tmp_path / "a")])
    assert record["step"] == 20 and record["checkpoint"] == str(run / "last.pt")
    (run / "last.pt").write_bytes((run / "last.pt").read_bytes()[:4096])
    record = ev.evaluate_run(run, device="cpu", out_dir=tmp_path / "b")
    assert record["step"] == 15 and record["checkpoint"].endswith("last.prev.pt")
    assert "using the previous checkpoint" in capsys.readouterr().err
    with pytest.raises(runfolder.CheckpointError,
                       match=r"checkpoint .*last.pt is damaged .*; evaluate the previous one instead: "
                             r"--checkpoint .*last.prev.pt"):
        ev.evaluate_run(run, checkpoint="last.pt", device="cpu", out_dir=tmp_path / "c")


# ---- atomic writes --------------------------------------------------------------------------------

def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "metrics.csv"
    atomic.atomic_write_text(target, "old\n")

    def half_then_crash(f):
        f.write(b"new, half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic.atomic_write(target, half_then_crash)
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]


def test_keep_previous_holds_the_replaced_file(tmp_path):
    target, prev = tmp_path / "last.pt", tmp_path / "last.prev.pt"
    atomic.atomic_write_bytes(target, b"one", keep_previous=prev)
    assert not prev.exists()
    atomic.atomic_write_bytes(target, b"two", keep_previous=prev)
    assert (target.read_bytes(), prev.read_bytes()) == (b"two", b"one")
    assert oct(target.stat().st_mode & 0o777) != oct(0o600)   # readable like a normal file


# ---- kills ----------------------------------------------------------------------------------------

KILL_RUN = ["dataset=digits", "model=mlp", "objective=auc_lp", "dataset.neg_keep=0.5",
            "trainer.max_steps=40", "trainer.eval_every=5", "trainer.batch_size=32", "device=cpu"]
COMPARED = ("step", "model", "objective", "optimizer", "scheduler", "rows", "best", "rng", "timings")


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def assert_same_run(ref: Path, run: Path) -> None:
    """Bit-identical: metrics.csv bytes, results.json (less timings and launches), checkpoints."""
    assert (ref / "metrics.csv").read_bytes() == (run / "metrics.csv").read_bytes()
    skip = ("timing_ms_median", "launches", "resume_forced", "choices",
            "provenance")   # the last launch's code version: other sessions may commit meanwhile
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (ref, run))
    for r in (ra, rb):
        r["config"].pop("resume")   # false in an uninterrupted run, true in a resumed one
    assert {k: v for k, v in ra.items() if k not in skip} == {k: v for k, v in rb.items() if k not in skip}
    a, b = (torch.load(d / "last.pt", weights_only=False) for d in (ref, run))
    for key in COMPARED:
        if key != "timings":
            assert _same(a[key], b[key]), key
    a, b = (torch.load(d / "best.pt", weights_only=False) for d in (ref, run))
    assert a["step"] == b["step"] and _same(a["model"], b["model"])


def launch(run_dir: Path, overrides: list[str], fault: str = "", timeout: float = 180):
    """``train.py`` in a subprocess (through this file's ``__main__``), the ``fault`` installed."""
    env = {**os.environ, "FAULT": fault, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, "-m", "tests.test_faults", *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def run_in_process(run_dir: Path, overrides: list[str]) -> Path:
    """The uninterrupted run, in this process on one thread like the subprocesses (bit-identical
    to the same run through ``launch``: checked by the slow tests, which launch both)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    GlobalHydra.instance().clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loop.train(cfg, run_dir)
    finally:
        torch.set_num_threads(threads)
    return run_dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_in_process(tmp_path_factory.mktemp("reference"), KILL_RUN)


# (fault, expected checkpoint step afterwards): the chain resumes after each kill
KILL_CHAIN = [
    ("write:last.pt:2", 5),        # SIGKILL halfway through writing the 2nd last.pt (step 10)
    ("rename:last.pt:2", 10),      # after last.prev.pt is kept, before the new last.pt (step 15) lands
    ("write:metrics.csv:1", 10),   # halfway through metrics.csv (step 15)
    ("after:last.pt:1", 15),       # right after a checkpoint, before the next step
    ("step:7", 20),                # between two training steps (step 22)
    ("write:results.json:1", 40),  # halfway through the final results.json
]  # best.pt (written only on improvement) and every other point: the slow matrix below


def kill_chain_resumes_bit_identical(reference, tmp_path, chain):
    run, survived = tmp_path / "run", 0
    for n, (fault, ckpt_step) in enumerate(chain):
        proc = launch(run, KILL_RUN + (["resume=true"] if n else []), fault)
        assert proc.returncode == -signal.SIGKILL, (fault, proc.returncode, proc.stderr[-2000:])
        ckpt = torch.load(run / "last.pt", weights_only=False)  # always readable after a kill
        assert ckpt["step"] == ckpt_step, (fault, ckpt["step"])
        survived += 1
        if n == 2:   # a resume that changes the config is refused cleanly, the run untouched
            before = (run / "last.pt").read_bytes()
            bad = launch(run, KILL_RUN + ["resume=true", "seed=1"])
            assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
            assert ("ResumeConfigError: resume=true would continue the run in" in bad.stderr
                    and "seed: 0 in the checkpoint, 1 now" in bad.stderr), bad.stderr[-2000:]
            assert (run / "last.pt").read_bytes() == before
            assert "seed=1" not in (run / ".hydra" / "overrides.yaml").read_text()
            assert "seed=1" in (run / ".hydra" / "overrides.resume-step10.yaml").read_text()
    last = run / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 3])   # and then the disk ate last.pt
    proc = launch(run, KILL_RUN + ["resume=true"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "using the previous checkpoint" in proc.stderr
    assert_same_run(reference, run)
    assert survived == len(chain) and not list(run.glob("*.tmp")) and not list(run.glob(".*.tmp"))
    launches = json.loads((run / "results.json").read_text())["launches"]
    assert launches[0]["start_step"] == 0 and all(la["resume"] is True for la in launches[1:])


def test_kills_during_writes_resume_bit_identical(reference, tmp_path):
    """The chain's first four kills (mid-write and mid-rename of last.pt, mid-write of
    metrics.csv, right after a checkpoint), the refused resume with another config and the damaged
    last.pt: six launches (every launch starts torch, ~8 s here); the whole chain is the slow test
    below.  Not fewer kills: until a checkpoint lands after the rename-kill, last.prev.pt is a hard
    link of last.pt, and the test's in-place truncation would damage both."""
    kill_chain_resumes_bit_identical(reference, tmp_path, KILL_CHAIN[:4])


@pytest.mark.slow
def test_kills_during_writes_and_steps_resume_bit_identical(reference, tmp_path):
    kill_chain_resumes_bit_identical(reference, tmp_path, KILL_CHAIN)


SURROGATE_KILL_RUN = [*KILL_RUN, "objective=surrogate", "objective.mode=scratch", "trainer.max_steps=20",
                      "objective.lr_beta=1e-3", "objective.clip_beta=null"]   # a surrogate that moves


def test_surrogate_killed_mid_round_resumes_bit_identical(tmp_path):
    """The surrogate's K_beta steps draw from train.py's side stream: its position travels in
    last.pt, so a run killed after the step-10 checkpoint (mid-round: K_alpha = 3) and resumed
    draws the batches the uninterrupted run drew and ends bit-identical to it."""
    ref = run_in_process(tmp_path / "ref", SURROGATE_KILL_RUN)
    run = tmp_path / "run"
    proc = launch(run, SURROGATE_KILL_RUN, "after:last.pt:2")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert torch.load(run / "last.pt", weights_only=False)["side_stream_step"] == 30   # 3 rounds of 10
    proc = launch(run, SURROGATE_KILL_RUN + ["resume=true"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(ref, run)
    a, b = (torch.load(d / "last.pt", weights_only=False)["side_stream_step"] for d in (ref, run))
    assert a == b == 60


@pytest.mark.parametrize("override, message", [
    ("trainer.max_steps=0", "ConfigError: invalid config: trainer.max_steps=0 must be an integer >= 1"),
    # unchecked, the next two failed as a raw TypeError from np.random.seed and as a clear
    # message under a traceback
    ("seed=abc", "ConfigError: invalid config: seed='abc' must be an integer"),
    ("dataset.neg_keep=2", "ConfigError: invalid config: dataset.neg_keep=2.0 must be in (0, 1]"),
])
def test_user_errors_reach_the_shell_without_a_traceback(tmp_path, override, message):
    proc = launch(tmp_path / "run", [override, "device=cpu"])
    assert proc.returncode == 1
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "last.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fault", [f"{kind}:{name}:{k}" for k in (1, 3, 8)
                                   for kind in ("write", "rename", "after")
                                   for name in ("last.pt", "metrics.csv", "best.pt")]
                         + [f"rename:last.prev.pt:{k}" for k in (1, 3)]
                         + [f"{kind}:results.json:1" for kind in ("write", "rename", "after")]
                         + [f"step:{k}" for k in (1, 5, 13, 29, 40)])
def test_every_kill_point_resumes_bit_identical(reference, tmp_path, fault):
    run = tmp_path / "run"
    proc = launch(run, KILL_RUN, fault)
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-2000:]
    print(f"[faults] {fault}: {'killed' if proc.returncode else 'not reached'}")
    if proc.returncode:
        proc = launch(run, KILL_RUN + ["resume=true"]) if (run / "last.pt").exists() else launch(run, KILL_RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(reference, run)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_kills_at_random_times_resume_bit_identical(tmp_path, seed):
    """SIGKILL from outside at random wall-clock times (so also mid-import, mid-resume,
    mid-evaluation and mid-write): six launches killed at a uniform fraction of an uninterrupted
    launch's duration, each resuming the last, then one that runs to the end; the run must equal
    the uninterrupted one (which equals the in-process run: the fast test's reference)."""
    overrides = [*KILL_RUN, "trainer.max_steps=400", "trainer.eval_every=20"]
    ref, start = tmp_path / "ref", time.perf_counter()
    assert launch(ref, overrides).returncode == 0
    duration = time.perf_counter() - start
    assert_same_run(ref, run_in_process(tmp_path / "ref_in_process", overrides))
    rng, run, kills, attempts = random.Random(seed), tmp_path / "run", 0, 6
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAULT": ""}
    for n in range(attempts + 1):
        resume = ["resume=true"] if (run / "last.pt").exists() or (run / "last.prev.pt").exists() else []
        with open(tmp_path / f"launch{n}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tests.test_faults", *overrides, *resume,
                                     f"hydra.run.dir={run}"], cwd=ROOT, env=env,
                                    stdout=subprocess.DEVNULL, stderr=log)
            try:
                proc.wait(timeout=rng.uniform(0.1, 1.0) * duration if n < attempts else 600)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
        assert proc.returncode == 0, (tmp_path / f"launch{n}.log").read_text()[-3000:]
    print(f"[faults] random-time kills survived: {kills} of {attempts} launches killed")
    assert kills >= 1
    assert_same_run(ref, run)


# ---- the subprocess side: install a fault, then run train.py's Hydra entry point --------------------

def _install_fault(spec: str) -> None:
    """``kind:name:k`` -- SIGKILL this process at the ``k``-th write of the run file ``name``:
    ``write`` halfway through its bytes, ``rename`` just before its final rename, ``after`` just
    after it; ``step:k`` -- when the ``k``-th training batch is drawn."""
    if not spec:
        return
    parts = spec.split(":")
    kind, k = parts[0], int(parts[-1])
    name = parts[1] if len(parts) == 3 else None
    counts: dict[str, int] = {}

    def die():
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def hit(path) -> bool:
        if Path(path).name != name:
            return False
        counts[name] = counts.get(name, 0) + 1
        return counts[name] == k

    if kind == "step":
        stream = loop.BatchStream

        def batch_stream(*args, **kwargs):
            for i, batch in enumerate(stream(*args, **kwargs), 1):
                if i == k:
                    die()
                yield batch

        loop.BatchStream = batch_stream
        return
    if kind == "rename":
        replace = os.replace

        def os_replace(src, dst, *args, **kwargs):
            if hit(dst):
                die()
            return replace(src, dst, *args, **kwargs)

        os.replace = os_replace
        return
    real = atomic.atomic_write

    def atomic_write(path, write, **kwargs):
        if kind == "write" and hit(path):
            def half(f):
                buf = io.BytesIO()
                write(buf)
                f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                f.flush()
                os.fsync(f.fileno())
                time.sleep(0.01)
                die()
            return real(path, half, **kwargs)
        real(path, write, **kwargs)
        if kind == "after" and hit(path):
            die()

    atomic.atomic_write = atomic_write


if __name__ == "__main__":
    warnings.simplefilter("default")
    _install_fault(os.environ.get("FAULT", ""))
    # Hydra finds configs/ beside the file of a task function defined in __main__; train.main was
    # imported here, so point its module at __main__ (inspect.getfile then gives train.py)
    train.main.__wrapped__.__module__ = "__main__"
    train.main()
