"""``hydra/launcher=packed``: a packed multirun writes one complete run folder
per job whose first-step training loss is the one ``train.py`` logs for the same overrides;
incompatible jobs split into packs with a message; a diverging run is recorded, the others go on.

Losses are compared with a relative tolerance (1e-6 to 2e-5, as measured), not bitwise: a packed forward sums the
grouped convolutions in another order than the separate one (packed/model.py; on digits' MLP they
happen to agree bitwise).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.utils.data import Subset

from lpmetrics.packed.launch import Job, group, train_packed
from lpmetrics.run import evaluation, loop
from lpmetrics.run import job as run_job

ROOT = Path(__file__).resolve().parents[1]
RUN_FILES = ("metrics.csv", "results.json", "last.pt", "best.pt", ".hydra/config.yaml")


def first_loss(run_dir) -> float:
    return float(pd.read_csv(run_dir / "metrics.csv")["train_loss"].iloc[0])


def multirun(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "train.py", "-m", *overrides, "hydra/launcher=packed",
           f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_packed_multirun_equals_train_py_first_step(compose_cfg, tmp_path):
    sweep = ["dataset=digits", "objective=ce,auc_lp", "optimizer.lr=0.1,0.01", "seed=0,1",
             "trainer.max_steps=2", "trainer.eval_every=1"]
    proc = multirun(tmp_path / "sweep", *sweep)
    out = proc.stdout + proc.stderr
    assert "8 jobs in 1 pack(s)" in out
    assert ("on the CPU" in out) != torch.cuda.is_available()
    folders = sorted((tmp_path / "sweep").glob("[0-9]*"))
    assert len(folders) == 8
    keys = None
    for folder in folders:
        assert all((folder / f).is_file() for f in RUN_FILES), folder
        results = json.loads((folder / "results.json").read_text())
        assert results["diverged"] is None and results["packed"]["size"] == 8
        assert results["final"]["step"] == 2
        keys = keys or set(results)
        cfg = results["config"]
        overrides = ["dataset=digits", f"objective={results['choices']['objective']}",
                     f"optimizer.lr={cfg['optimizer']['lr']}", f"seed={cfg['seed']}",
                     "trainer.max_steps=1"]
        alone = loop.train(compose_cfg(overrides), tmp_path / "alone" / folder.name)
        assert set(alone) <= keys   # train.py's schema, plus "packed" and "diverged"
        assert math.isclose(first_loss(folder), alone["final"]["train_loss"], rel_tol=1e-6), folder.name


def test_incompatible_jobs_split_into_packs_with_the_key(tmp_path):
    proc = multirun(tmp_path, "dataset=digits", "dataset.task=binary,multiclass", "trainer.max_steps=1")
    out = proc.stdout + proc.stderr
    assert "2 jobs in 2 pack(s)" in out
    assert "split on: dataset.task (binary vs multiclass), num_classes (2 vs 3)" in out
    assert len(list(tmp_path.glob("*/results.json"))) == 2


def test_group_by_key_and_max_pack():
    keys = [{"model": "a"}, {"model": "b"}, {"model": "a"}, {"model": "a"}]
    assert group(keys) == ([[0, 2, 3], [1]], ["model"])
    assert group(keys, max_pack=2) == ([[0, 2], [3], [1]], ["model"])


def test_diverging_run_is_recorded_and_the_others_go_on(compose_cfg, tmp_path):
    short = ["dataset=digits", "trainer.max_steps=4", "trainer.eval_every=2"]
    jobs = [Job(compose_cfg(short), tmp_path / "ce", name="ce"),
            Job(compose_cfg([*short, "objective._target_=tests.test_train.ExplodingLoss",
                             "~objective.label_smoothing"]), tmp_path / "nan", name="nan")]
    ce, nan = train_packed(jobs)
    assert nan["diverged"]["step"] == 1 and "loss is nan" in nan["diverged"]["reason"]
    assert nan["final"] is None and (tmp_path / "nan" / "results.json").is_file()
    alone = loop.train(compose_cfg(short), tmp_path / "alone")
    assert ce["diverged"] is None
    assert pd.read_csv(tmp_path / "ce" / "metrics.csv")["train_loss"].tolist() == pytest.approx(
        pd.read_csv(tmp_path / "alone" / "metrics.csv")["train_loss"].tolist(), rel=1e-6)


def test_a_job_that_cannot_be_built_fails_alone(compose_cfg, tmp_path):
    short = ["dataset=digits", "trainer.max_steps=2"]
    good, bad = train_packed([Job(compose_cfg(short), tmp_path / "good", name="good"),
                              Job(compose_cfg([*short, "optimizer=pesg"]), tmp_path / "bad", name="bad")])
    assert isinstance(bad, TypeError) and "optimizer=pesg needs" in str(bad)
    assert good["final"]["step"] == 2 and good["packed"]["size"] == 1


def test_resume_is_refused_with_a_hint(compose_cfg, tmp_path):
    (outcome,) = train_packed([Job(compose_cfg(["dataset=digits", "resume=true"]), tmp_path, name="r")])
    assert isinstance(outcome, Exception) and "train.py resume=true" in str(outcome)


def test_a_compiled_optimizer_step_is_refused_with_a_hint(compose_cfg, tmp_path):
    (outcome,) = train_packed([Job(compose_cfg(["dataset=digits", "trainer.optimizer_impl=compiled"]),
                                   tmp_path, name="c")])
    assert isinstance(outcome, Exception) and "set trainer.optimizer_impl=eager" in str(outcome)


@pytest.mark.data
def test_cifar10_packed_first_step_equals_train_py(compose_cfg, data_root, tmp_path, monkeypatch):
    """CIFAR-10 / ResNet-18 with augmentation, two steps with an evaluation between them;
    evaluation on 64 images of each split keeps this under a minute."""
    evaluate = evaluation.evaluate

    def small_eval(model, bundle, split, cfg, device, predict_fn=None):
        data = getattr(bundle, split)
        few = Subset(data, range(0, len(data), len(data) // 64))   # strided: splits are label-sorted
        return evaluate(model, dataclasses.replace(bundle, **{split: few}), split, cfg, device, predict_fn)

    monkeypatch.setattr(run_job, "evaluate", small_eval)
    base = ["dataset=cifar10", f"dataset.root={data_root}", "trainer.max_steps=2",
            "trainer.eval_every=1", "trainer.eval_batch_size=64", "device=cpu",
            # at lr 0.1 the first steps blow up (loss 0.74 -> 10) and amplify the float32
            # rounding between vmapped and plain convolutions to ~1e-3 by step 2; at 0.001 the
            # step-2 losses agree to ~1e-6 (the float64 equivalence is tests/test_packed.py's)
            "optimizer.lr=0.001"]
    jobs = [Job(compose_cfg([*base, f"objective={o}", f"seed={s}"]), tmp_path / f"{o}{s}", name=o)
            for o, s in (("ce", 0), ("auc_lp", 1))]
    # run by run evaluation, the small one above (the pack's batched evaluation, compared with it in
    # tests/test_packed_evaluate.py, scores the whole splits: 134 s of this test's 159 in CI)
    for job, packed in zip(jobs, train_packed(jobs, batched_eval=False)):
        assert packed["diverged"] is None and packed["packed"]["size"] == 2
        alone_dir = tmp_path / "alone" / job.run_dir.name
        alone = loop.train(job.cfg, alone_dir)
        # same init, same first batch: float32 rounding of the vmapped net only (3e-6 measured)
        assert math.isclose(first_loss(job.run_dir), first_loss(alone_dir), rel_tol=2e-5)
        # step 2, after an evaluation: for ce the weights differ by float32 rounding only (4e-5
        # of the loss measured), while another batch (another crop / flip) changes it by ~1e-2.
        # The LP's active set can flip under such rounding (its step-2 loss moved by up to 3e-3),
        # so auc_lp is held to the first step here and to 1e-10 in float64 (tests/test_packed.py).
        if job.name == "ce":
            assert math.isclose(packed["final"]["train_loss"], alone["final"]["train_loss"], rel_tol=1e-4)


def test_deadline_stops_a_pack_and_records_it(compose_cfg, tmp_path, monkeypatch):
    """A pack past its deadline stops at a step boundary with a last evaluation there (one, not
    two, when the boundary is an evaluation step); a pack not started by the deadline is not run.
    A fake clock (one tick per reading) makes the stopping step deterministic."""
    import lpmetrics.packed.launch as launch

    class Clock:
        t = 0.0

        def monotonic(self):
            self.t += 1.0
            return self.t
        perf_counter = staticmethod(launch.time.perf_counter)
    clock = Clock()
    monkeypatch.setattr(launch, "time", clock)
    short = ["dataset=digits", "trainer.max_steps=1000", "trainer.eval_every=4"]
    jobs = [Job(compose_cfg([*short, f"seed={s}"]), tmp_path / f"s{s}", name=f"s{s}") for s in (0, 1)]
    # readings: 1 before the pack, then one per step from step 1 on (step 0 always runs)
    out = train_packed(jobs, deadline=9.0)
    for res, job in zip(out, jobs):
        assert res["stopped"] == {"step": 8, "reason": "deadline"}
        steps = pd.read_csv(job.run_dir / "metrics.csv")["step"].tolist()
        assert steps == [4, 8] and res["final"]["step"] == 8   # step 8: evaluated once
    clock.t = 0.0
    out = train_packed(jobs[:1], deadline=7.5)
    assert out[0]["stopped"]["step"] == 7
    assert pd.read_csv(jobs[0].run_dir / "metrics.csv")["step"].tolist() == [4, 7]
    late = train_packed([Job(compose_cfg(short), tmp_path / "late", name="late")], deadline=0.0)
    assert "not started" in str(late[0]) and not (tmp_path / "late" / "results.json").exists()


def test_out_of_memory_halves_the_pack_and_each_run_restarts_from_its_initial_state(
        compose_cfg, tmp_path, monkeypatch, caplog):
    """A pack over 2 runs 'does not fit' (the step raises OutOfMemoryError after a real step of
    the pack): 5 runs go 2 + 3 -> 1 + 2, and each run equals its train.py twin (digits' MLP packs
    bitwise), so the aborted packs left no trace in the runs."""
    from lpmetrics.packed.step import PackedStep
    real = PackedStep.step

    def step(self, x, y, i):
        out = real(self, x, y, i)   # updates the pack's weights first, as a late OOM would
        if self.packed.n > 2 and i == 1:   # after one full step: its loss was recorded
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return out
    monkeypatch.setattr(PackedStep, "step", step)
    short = ["dataset=digits", "trainer.max_steps=4", "trainer.eval_every=2"]
    jobs = [Job(compose_cfg([*short, f"seed={s}", f"optimizer.lr={lr}"]), tmp_path / f"j{s}", name=f"j{s}")
            for s, lr in zip(range(5), (0.1, 0.01, 0.1, 0.01, 0.1))]
    with caplog.at_level("WARNING"):
        out = train_packed(jobs)
    assert "a pack of 5 runs is out of memory; trying packs of 2 and 3" in caplog.text
    assert "a pack of 3 runs is out of memory; trying packs of 1 and 2" in caplog.text
    assert sorted(r["packed"]["size"] for r in out) == [1, 2, 2, 2, 2]
    for job, res in zip(jobs, out):
        alone = loop.train(job.cfg, tmp_path / "alone" / job.name)
        packed_rows = pd.read_csv(job.run_dir / "metrics.csv")
        alone_rows = pd.read_csv(tmp_path / "alone" / job.name / "metrics.csv")
        assert packed_rows["step"].tolist() == [2, 4]
        assert packed_rows.drop(columns=[]).equals(alone_rows)   # every row, train_loss included


def test_a_run_that_does_not_fit_alone_is_recorded(compose_cfg, tmp_path, monkeypatch):
    from lpmetrics.packed.step import PackedStep

    def step(self, x, y, i):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
    monkeypatch.setattr(PackedStep, "step", step)
    jobs = [Job(compose_cfg(["dataset=digits", "trainer.max_steps=2", f"seed={s}"]), tmp_path / f"j{s}",
                name=f"j{s}") for s in (0, 1)]
    out = train_packed(jobs)
    assert all(isinstance(o, Exception) and "does not fit the device memory even alone" in str(o) for o in out)


def test_a_pack_that_fails_while_training_fails_its_runs_and_the_next_pack_still_runs(
        compose_cfg, tmp_path, monkeypatch, caplog):
    """A pack's step raising (not out of memory; the second H100 window's pack of one died in
    batch norm under vmap) fails that pack's runs with its error; the other packs train and the
    launcher returns, so a campaign command still exports what was done."""
    from lpmetrics.packed.step import PackedStep
    real = PackedStep.step

    import weakref
    held = []

    def step(self, x, y, i):
        if any(o.__class__.__name__ == "AUCLoss" for o in self.objectives):
            held.append(weakref.ref(self.packed))
            raise RuntimeError("NYI: simulated")
        return real(self, x, y, i)
    monkeypatch.setattr(PackedStep, "step", step)
    short = ["dataset=digits", "trainer.max_steps=2"]
    jobs = [Job(compose_cfg([*short, "objective=ce"]), tmp_path / "ce", name="ce"),
            Job(compose_cfg([*short, "objective=auc_lp", "seed=1"]), tmp_path / "lp", name="lp")]
    with caplog.at_level("ERROR"):
        lp, ce = train_packed(jobs[::-1], max_pack=1)   # the failing pack first
    import gc
    gc.collect()
    assert held[0]() is None   # the failed pack's models are gone: its error keeps no frames
    assert ce["final"]["step"] == 2
    assert isinstance(lp, RuntimeError) and "NYI: simulated" in str(lp)
    assert "a pack of 1 run(s) failed: RuntimeError: NYI: simulated" in caplog.text


def test_pack_batches_are_contiguous_whatever_the_dataset_layout():
    """The image packs hand out channels-last views; the pack's input is the standard layout."""
    from lpmetrics.packed.launch import _draw

    class Member:
        def __init__(self):
            self.stream = iter([(torch.randn(4, 8, 8, 3).permute(0, 3, 1, 2), torch.zeros(4, dtype=torch.long))])
    for n in (1, 2):
        x, _ = _draw([Member() for _ in range(n)], torch.device("cpu"))
        assert x.shape == (n, 4, 3, 8, 8) and x.is_contiguous()
