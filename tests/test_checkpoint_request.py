"""A checkpoint asked for between two evaluations (``SIGUSR1``: ``lpmetrics/run/request.py``):
the run goes on unchanged, and a run stopped right after it resumes to the uninterrupted run bit
for bit (metrics.csv bytes, results.json, checkpoints: ``tests.test_faults.assert_same_run``)."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lpmetrics.objectives.base import Objective
from lpmetrics.run import job, loop, request
from tests.test_faults import KILL_RUN, assert_same_run, run_in_process

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="the platform has no SIGUSR1")
ROOT = Path(__file__).resolve().parents[1]
#: :func:`request.listening_pid` reads a process's command line from /proc (Linux)
NEEDS_PROC = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads command lines in /proc")
ASK_AT = 13   # between the evaluations at 10 and 15 (KILL_RUN: eval_every 5)


class Stopped(Exception):
    """Stands for the process ending right after the requested checkpoint."""


def ask_at(monkeypatch, at: int, stop: bool) -> list[int]:
    """Send this process ``SIGUSR1`` in step ``at`` (from the objective's step-end hook, as a signal
    arrives mid-step); with ``stop``, end the run right after the requested checkpoint. Returns
    the steps at which a requested checkpoint was written."""
    save, written = job.Run.save_checkpoint, []

    class Timer(loop.Timer):   # the last phase of a step: the signal lands before the step ends
        def lap(self, phase):
            super().lap(phase)
            if phase == "optimizer" and len(self.samples["optimizer"]) == at:
                os.kill(os.getpid(), signal.SIGUSR1)

    def save_checkpoint(self, step, timings, rng=None, losses=None):
        save(self, step, timings, rng, losses)
        if losses is not None:
            written.append(step)
            if stop:
                raise Stopped
    monkeypatch.setattr(loop, "Timer", Timer)
    monkeypatch.setattr(job.Run, "save_checkpoint", save_checkpoint)
    return written


@pytest.mark.parametrize("objective", ["auc_lp", "ppd_sg", "ce"])
def test_a_requested_checkpoint_changes_nothing_and_resumes_bit_identical(tmp_path, monkeypatch, objective):
    overrides = [o for o in KILL_RUN if not o.startswith("objective=")] + [f"objective={objective}"]
    ref = run_in_process(tmp_path / "ref", overrides)
    with monkeypatch.context() as m:
        written = ask_at(m, ASK_AT, stop=False)
        asked = run_in_process(tmp_path / "asked", overrides)
    assert written == [ASK_AT]
    assert_same_run(ref, asked)   # asking does not move the run
    with monkeypatch.context() as m:
        written = ask_at(m, ASK_AT, stop=True)
        with pytest.raises(Stopped):
            run_in_process(tmp_path / "stopped", overrides)
    ckpt = torch.load(tmp_path / "stopped" / "last.pt", weights_only=True)
    assert ckpt["step"] == ASK_AT and len(ckpt["interval"]["losses"]) == ASK_AT - 10
    assert not (tmp_path / "stopped" / request.PID_FILE).exists()   # removed however the run ends
    run_in_process(tmp_path / "stopped", [*overrides, "resume=true"])
    assert_same_run(ref, tmp_path / "stopped")


def test_a_request_during_an_evaluation_is_answered_by_its_checkpoint(tmp_path, monkeypatch):
    written = ask_at(monkeypatch, 10, stop=False)   # step 10 ends in an evaluation, which writes last.pt
    run_in_process(tmp_path / "run", KILL_RUN)
    assert written == []


def test_pending_diagnostics_survive_the_checkpoint_exactly():
    """Host and device sums (``record`` of floats and of 0-dim tensors, ``record_where``) restored
    into a fresh objective go on to the same means, to the bit."""
    gen = torch.Generator().manual_seed(0)
    values = torch.rand(40, generator=gen, dtype=torch.float64) * 1e3

    def feed(obj, part):
        for v in part:
            obj.record(host=float(v) / 7, device=v / 3)
            obj.record_where(v > 500, rare=v)
    whole, first = Objective(), Objective()
    feed(whole, values)
    feed(first, values[:17])
    state = first.pending_stats()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    second = Objective()
    second.restore_pending_stats(torch.load(buf, weights_only=True), "cpu")
    feed(second, values[17:])
    assert second.pop_stats() == whole.pop_stats()
    assert first.pop_stats() != {}   # pending_stats read nothing off


@NEEDS_PROC
def test_the_pid_file_names_only_a_training_of_that_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    assert request.listening_pid(folder) is None
    (folder / request.PID_FILE).write_text("not a pid\n")
    assert request.listening_pid(folder) is None
    (folder / request.PID_FILE).write_text(f"{os.getpid()}\n")   # pytest's command line names no such folder
    assert request.listening_pid(folder) is None
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(folder)])
    try:
        (folder / request.PID_FILE).write_text(f"{other.pid}\n")
        assert request.listening_pid(folder) == other.pid
    finally:
        other.kill()
        other.wait()
    assert request.listening_pid(folder) is None   # gone: a stale file names nobody


@NEEDS_PROC
def test_train_py_answers_sigusr1_and_goes_on(tmp_path):
    """The real signal from another process: ``train.py`` writes ``last.pt`` between evaluations,
    says so in its log, keeps training to the end, and removes its pid file."""
    run = tmp_path / "run"
    cmd = [sys.executable, "train.py", *[o.replace("max_steps=40", "max_steps=400") for o in KILL_RUN],
           "logger=csv", "trainer.eval_every=400", f"hydra.run.dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while request.listening_pid(run) != proc.pid and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert request.listening_pid(run) == proc.pid
        os.kill(proc.pid, signal.SIGUSR1)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    asked = [int(line.split("checkpoint at step ")[1].split()[0]) for line in out.splitlines()
             if "(requested: SIGUSR1)" in line]
    assert len(asked) == 1 and 0 < asked[0] < 400, out[-3000:]
    assert not (run / request.PID_FILE).exists()
    assert torch.load(run / "last.pt", weights_only=True)["step"] == 400
