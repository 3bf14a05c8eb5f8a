"""Checkpoint on request: ``SIGUSR1`` asks a training for ``last.pt`` now, and it goes on training.

A training writes its checkpoint at every evaluation (``trainer.eval_every``); a process stopped
between two loses the steps since the last one. Sent ``SIGUSR1``, :func:`lpmetrics.run.loop.train`
finishes the step it is in, writes ``last.pt`` with what the interval has gathered so far (its
losses and the objective's pending diagnostics: :meth:`lpmetrics.run.job.Run.save_checkpoint`),
and goes on; a resume from that checkpoint repeats the uninterrupted run bit for bit
(``tests/test_checkpoint_request.py``). A request that arrives during an evaluation is answered by
that evaluation's checkpoint. With ``trainer.checkpoints=false`` a request is logged and ignored.

Who asks: the CPU lane before it stops its trainings, and ``python -m scripts.campaign cpu
checkpoint`` before a session ends (``scripts/campaign/lane.py``); a cluster job that asks SLURM for
the signal ahead of its time limit (``sbatch --signal=B:USR1@120`` with ``train.py`` run by
``exec`` in the batch script, so the signal reaches it).

While the handler is installed the run folder holds :data:`PID_FILE` with the training's process
id, so a sender signals only a process that handles the signal (``SIGUSR1``'s default action ends a
process): the file is written after the handler is installed and removed when the training ends.
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

#: in the run folder while a training answers ``SIGUSR1``: its process id
PID_FILE = ".checkpoint_request.pid"


class CheckpointRequests:
    """``SIGUSR1`` sets :attr:`pending`; :meth:`pop` reads and clears it. Installed only in the main
    thread of a platform that has the signal (elsewhere it never becomes pending); :meth:`close`
    puts the previous handler back and removes :data:`PID_FILE`."""

    def __init__(self, run_dir: Path) -> None:
        self.pending = False
        self._previous = None
        self._pid_file: Path | None = None
        if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGUSR1, self._handle)
            self._pid_file = Path(run_dir) / PID_FILE
            self._pid_file.write_text(f"{os.getpid()}\n")

    @property
    def installed(self) -> bool:
        return self._pid_file is not None

    def _handle(self, signum, frame) -> None:   # noqa: ARG002 -- the signal module's signature
        self.pending = True

    def pop(self) -> bool:
        pending, self.pending = self.pending, False
        return pending

    def close(self) -> None:
        if self._pid_file is None:
            return
        signal.signal(signal.SIGUSR1, self._previous if self._previous is not None else signal.SIG_DFL)
        self._pid_file.unlink(missing_ok=True)
        self._pid_file = None


def listening_pid(run_dir: Path) -> int | None:
    """The process id of the training that answers ``SIGUSR1`` in ``run_dir``, or ``None`` (also
    where there is no ``/proc`` to read a command line from): its
    :data:`PID_FILE` names a live process whose command line names ``run_dir`` (a file left behind
    by a killed training, its number since reused, names some other process)."""
    try:
        pid = int((Path(run_dir) / PID_FILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if str(run_dir) in cmdline else None
