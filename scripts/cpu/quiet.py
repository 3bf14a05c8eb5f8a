"""A quiet machine for a CPU measurement without losing the lane's work: :func:`paused_lane` stops
the CPU lane's trainings (``SIGSTOP`` to each one's process group: they keep their memory, their
step and their open files) for the span of a ``with`` block and continues them (``SIGCONT``) when
it ends, by return, exception, ``SIGTERM``, ``SIGINT`` or ``SIGHUP``. A ``SIGKILL`` of the
measuring process cannot be caught: the trainings then stay stopped until ``continue_lane`` (or
``python -m scripts.cpu.quiet --continue``) sends them ``SIGCONT``; ``cpu status`` keeps showing
them as training meanwhile, with no step moving.

Why: on a 2-vCPU machine the lane's two trainings (``nice 19``) still share the caches and the
memory bandwidth with the measurement: float32 GEMMs ran up to 5x slower beside them
(``results/cpu_step/``). Stopping the lane (``cpu stop``) costs each training the steps since its
last checkpoint (up to 1,000) and a restart; pausing costs only the seconds it lasts.

Not covered: a training the lane starts during the pause (another finished meanwhile) runs
unpaused; and a ``cpu stop`` during a pause cannot end the stopped trainings by ``SIGTERM``, so
the lane kills them after its grace period and they lose the steps since their last checkpoint,
as a killed training does. Pause for minutes, not hours.

``python -m scripts.cpu.quiet -- CMD ...`` runs one command with the lane paused.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from scripts.campaign import lane

SETTLE_S = 2.0   # seconds for the stopped trainings' caches to drain before a measurement


def lane_pid(lane_dir: Path) -> int | None:
    """Pid of the lane supervising ``lane_dir``, or ``None`` where none runs."""
    holder = lane.lane_holder(lane_dir)
    match = holder and re.search(r"pid (\d+)", holder)
    return int(match.group(1)) if match else None


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (``/proc``; empty where it is not readable)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return sorted(out)


def trainings(lane_dir: Path) -> list[int]:
    """The lane's trainings: its children that lead their own process group (the lane starts each
    in a session of its own). Its other children (the convolution-path choice, ``git``) share the
    lane's group, which may be a shell's job or the caller's own: never signalled."""
    pid = lane_pid(Path(lane_dir).expanduser())
    out = []
    for child in children(pid) if pid else []:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(child) == child != os.getpgrp():
                out.append(child)
    return out


def _signal_groups(groups: list[int], sig: int) -> None:
    """``sig`` to each process group (a training's pid is its group's id: a pid is not reused while
    a group of that id lives)."""
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


def continue_lane(lane_dir: Path = lane.DEFAULT_LANE_DIR) -> list[int]:
    """``SIGCONT`` to every training of the lane (harmless on running ones); their pids."""
    pids = trainings(lane_dir)
    _signal_groups(pids, signal.SIGCONT)
    return pids


class _Interrupted(BaseException):
    """Raised by the handlers below so that ``finally`` continues the trainings."""


@contextlib.contextmanager
def paused_lane(lane_dir: Path = lane.DEFAULT_LANE_DIR, settle_s: float = SETTLE_S) -> Iterator[list[int]]:
    """Stop the lane's trainings for the ``with`` block; yields their pids (empty: no lane runs).
    A signal that arrives while they are being continued is held until all are, then raised."""
    pids = trainings(lane_dir)
    if not pids:
        yield []
        return
    continuing, held = False, []   # a signal while continuing is held: raised once every training runs

    def interrupt(signum, frame):
        if not continuing:
            raise _Interrupted(signal.Signals(signum).name)
        held.append(signum)

    saved = {}
    try:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            saved[s] = signal.signal(s, interrupt)
        _signal_groups(pids, signal.SIGSTOP)
        time.sleep(settle_s)
        yield pids
    finally:
        continuing = True
        _signal_groups(pids, signal.SIGCONT)
        for s, handler in saved.items():
            signal.signal(s, handler)
    if held:
        raise _Interrupted(signal.Signals(held[0]).name)


def add_pause_flag(ap: argparse.ArgumentParser) -> None:
    """The benchmarks' ``--pause-lane`` flag (read by :func:`pause_if`)."""
    ap.add_argument("--pause-lane", action="store_true",
                    help="stop the CPU lane's trainings while measuring and continue them after "
                         "(scripts/cpu/quiet.py): a quiet machine without losing their steps")


def pause_if(asked: bool) -> contextlib.AbstractContextManager[list[int]]:
    """:func:`paused_lane` where ``asked``, else a block that pauses nothing (yields ``[]``)."""
    return paused_lane() if asked else contextlib.nullcontext([])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lane-dir", type=Path, default=lane.DEFAULT_LANE_DIR)
    ap.add_argument("--continue", dest="cont", action="store_true",
                    help="only send SIGCONT to the lane's trainings (after a SIGKILLed measurement)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...: the command to run paused")
    args = ap.parse_args(argv)
    if args.cont:
        print(f"quiet: SIGCONT to {continue_lane(args.lane_dir) or 'no training'}")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give a command after --, or --continue")
    try:
        with paused_lane(args.lane_dir) as pids:
            print(f"quiet: lane trainings paused: {pids or 'none running'}", file=sys.stderr, flush=True)
            return subprocess.call(command)
    except _Interrupted as exc:
        print(f"quiet: {exc}; the lane's trainings continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
