"""``scripts.cpu.quiet``: the lane's trainings are stopped for a measurement and continued after
it, however it ends (a fake lane: a process holding ``lane.lock`` with two trainings, each in its
own process group as the lane starts them, and a helper in the lane's own group, as the lane runs
the convolution-path choice and ``git``: neither the lane nor the helper is ever stopped)."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scripts.cpu import quiet

ROOT = Path(__file__).resolve().parents[1]

FAKE_LANE = textwrap.dedent("""
    import fcntl, os, subprocess, sys, time
    lane_dir = sys.argv[1]
    lock = open(os.path.join(lane_dir, "lane.lock"), "a+")
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.truncate(0); lock.write(f"pid {os.getpid()} since now\\n"); lock.flush()
    loop = [sys.executable, "-c", "import time\\nwhile True: time.sleep(0.01)"]
    trainings = [subprocess.Popen(loop, start_new_session=True) for _ in range(2)]
    helper = subprocess.Popen(loop)
    open(os.path.join(lane_dir, "helper"), "w").write(str(helper.pid))
    open(os.path.join(lane_dir, "child"), "w").write(" ".join(str(t.pid) for t in trainings))
    time.sleep(120)
""")


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def fake_lane(tmp_path):
    # a session of its own, as `cpu start --background` runs the lane: its group is not pytest's
    proc = subprocess.Popen([sys.executable, "-c", FAKE_LANE, str(tmp_path)], start_new_session=True)
    for _ in range(200):
        if (tmp_path / "child").is_file() and (tmp_path / "child").read_text():
            break
        time.sleep(0.05)
    trainings = sorted(int(p) for p in (tmp_path / "child").read_text().split())
    yield tmp_path, proc, trainings
    for pid in trainings:
        os.killpg(pid, signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)   # the lane and its helper
    proc.wait()


def test_paused_lane_stops_and_continues_the_trainings(fake_lane):
    lane_dir, proc, trainings = fake_lane
    helper = int((lane_dir / "helper").read_text())
    assert quiet.lane_pid(lane_dir) == proc.pid
    assert quiet.children(proc.pid) == sorted([*trainings, helper])
    with quiet.paused_lane(lane_dir, settle_s=0.1) as pids:
        assert [state(t) for t in trainings] == ["T", "T"]
        assert state(proc.pid) != "T" and state(helper) != "T"   # the lane's own group runs on
        assert pids == trainings
    time.sleep(0.1)
    assert "T" not in [state(t) for t in trainings]


def test_a_signal_while_continuing_continues_every_training(fake_lane, monkeypatch):
    """A second SIGTERM that lands between two trainings' SIGCONT is held until both run."""
    lane_dir, _, trainings = fake_lane
    killpg, seen = os.killpg, []

    def killpg_then_terminated(group, sig):
        killpg(group, sig)
        if sig == signal.SIGCONT and group == trainings[0]:
            os.kill(os.getpid(), signal.SIGTERM)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with pytest.raises(quiet._Interrupted, match="SIGTERM"):
            with quiet.paused_lane(lane_dir, settle_s=0.1):
                monkeypatch.setattr(quiet.os, "killpg", killpg_then_terminated)
        time.sleep(0.1)
        assert "T" not in [state(t) for t in trainings]
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGTERM, previous)
        for pid in trainings:
            os.killpg(pid, signal.SIGCONT)
    assert seen == []   # the measurement's own handler, restored after, was not called


def test_paused_lane_continues_after_an_exception(fake_lane):
    lane_dir, _, (child, _) = fake_lane
    with pytest.raises(RuntimeError):
        with quiet.paused_lane(lane_dir, settle_s=0.1):
            assert state(child) == "T"
            raise RuntimeError("measurement failed")
    time.sleep(0.1)
    assert state(child) != "T"


def test_a_terminated_measurement_continues_the_trainings(fake_lane):
    lane_dir, _, (child, _) = fake_lane
    cmd = [sys.executable, "-m", "scripts.cpu.quiet", "--lane-dir", str(lane_dir), "--", "sleep", "30"]
    bench = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    for _ in range(200):
        if state(child) == "T":
            break
        time.sleep(0.05)
    assert state(child) == "T"
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=20) == 130
    time.sleep(0.1)
    assert state(child) != "T"


def test_no_lane_pauses_nothing(tmp_path):
    with quiet.paused_lane(tmp_path) as pids:
        assert pids == []
    assert quiet.main(["--lane-dir", str(tmp_path), "--continue"]) == 0
