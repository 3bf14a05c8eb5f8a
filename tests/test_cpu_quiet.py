"""``scripts.cpu.quiet``: the lane's trainings are stopped for a measurement and continued after
it, however it ends (a fake lane: a process holding ``lane.lock`` with one child in its own
process group, as the lane starts its trainings)."""
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
    child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.01)"],
                             start_new_session=True)
    open(os.path.join(lane_dir, "child"), "w").write(str(child.pid))
    time.sleep(120)
""")


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def fake_lane(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", FAKE_LANE, str(tmp_path)])
    for _ in range(200):
        if (tmp_path / "child").is_file() and (tmp_path / "child").read_text():
            break
        time.sleep(0.05)
    child = int((tmp_path / "child").read_text())
    yield tmp_path, proc, child
    os.killpg(os.getpgid(child), signal.SIGKILL)
    proc.kill()
    proc.wait()


def test_paused_lane_stops_and_continues_the_trainings(fake_lane):
    lane_dir, proc, child = fake_lane
    assert quiet.lane_pid(lane_dir) == proc.pid
    assert quiet.children(proc.pid) == [child]
    assert state(child) != "T"
    with quiet.paused_lane(lane_dir, settle_s=0.1) as pids:
        assert pids == [child]
        assert state(child) == "T"
    time.sleep(0.1)
    assert state(child) != "T"


def test_paused_lane_continues_after_an_exception(fake_lane):
    lane_dir, _, child = fake_lane
    with pytest.raises(RuntimeError):
        with quiet.paused_lane(lane_dir, settle_s=0.1):
            assert state(child) == "T"
            raise RuntimeError("measurement failed")
    time.sleep(0.1)
    assert state(child) != "T"


def test_a_terminated_measurement_continues_the_trainings(fake_lane):
    lane_dir, _, child = fake_lane
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
