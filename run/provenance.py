"""The code version and the machine behind a run: ``results.json["provenance"]``.

A result whose code cannot be named cannot be rerun, so every run folder written
through :meth:`~lpmetrics.run.job.Run.results` -- ``train.py`` runs, packed and campaign runs alike -- records::

    {"git_commit": "3daf590...",   # full sha of HEAD, "unknown" outside a repository / without git
     "git_dirty": false,           # uncommitted changes to tracked or new files; null when unknown
     "torch": "2.5.1", "cuda": "12.4",          # torch.version.cuda; null for a CPU-only build
     "device_name": "NVIDIA H100 80GB HBM3",    # the GPU the run used, else the CPU model
     "cpu_count": 16, "python": "3.11.9"}

A copy of the code without its ``.git`` (the tree a lent GPU machine receives) names its commit
through a stamp written at the checkout's root before the copy leaves: ``python -m lpmetrics.run.provenance stamp``
writes ``.code_version.json`` (git-ignored; carry it into the device call). The stamp also holds a
fingerprint of the tracked files outside the output folders (their paths and contents); where the
files here still match it and the ``.git`` beside them (if any) has never seen the stamped commit,
the stamp names the code (a lent machine's copy of ``.git`` can lag the tree it received: the first
H100 campaign window's runs recorded an older commit, "dirty", for a tree that was a later commit,
clean); a checkout that has the stamped commit answers through git, so a stamp left behind by
later commits does not. A stamp whose files
no longer match is used only where git cannot answer, as its commit with changes (dirty). The repository is the one holding this file (the code that ran), not the working directory a
run was launched from. Untracked files under ``results/``, ``outputs/`` and ``multirun/`` do not
make the tree dirty: runs write there while the code is unchanged. The git part is read once per
process (a packed launcher writes hundreds of results.json), the device name once per device.

Example::

    >>> rec = record("cpu")
    >>> sorted(rec) == sorted(KEYS) and rec["cpu_count"] >= 1
    True
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

KEYS = ("git_commit", "git_dirty", "torch", "cuda", "device_name", "cpu_count", "python")
CODE_DIR = Path(__file__).resolve().parents[1]   # the checkout (this file is run/provenance.py)
UNKNOWN = "unknown"
#: untracked paths under these folders are run outputs, not code changes
OUTPUT_FOLDERS = ("results/", "outputs/", "multirun/")
STAMP = ".code_version.json"   # written by ``stamp``; a tree copied without .git (or a stale one) reads it


def _git(folder: Path, *args: str) -> str | None:
    """``git -C folder args`` stdout, or ``None`` when git is missing, fails or hangs."""
    try:
        proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              errors="surrogateescape", timeout=30, check=True)   # any file name
    except (OSError, subprocess.SubprocessError):   # no git binary, not a repository, timeout
        return None
    return proc.stdout


def is_dirty(porcelain_z: str) -> bool:
    """Whether ``git status --porcelain -z`` output shows a change that is not a run output.

    Entries are ``XY path`` separated by NUL; a rename or copy (``R``/``C``) is followed by one
    more entry, its source path."""
    entries = iter(porcelain_z.split("\0"))
    for entry in entries:
        if not entry:
            continue
        status, path = entry[:2], entry[3:]
        if "R" in status or "C" in status:
            next(entries, None)
        if status == "??" and (path.startswith(OUTPUT_FOLDERS) or path == STAMP):   # the stamp is no code
            continue
        return True
    return False


def _git_version(folder: Path) -> tuple[str, bool | None]:
    head = _git(folder, "rev-parse", "HEAD")
    if not head or not head.strip():
        return UNKNOWN, None
    status = _git(folder, "status", "--porcelain", "-z")
    return head.strip(), None if status is None else is_dirty(status)


def fingerprint(folder: Path, paths: list[str]) -> str | None:
    """sha256 over ``paths`` (relative to ``folder``) and their contents; ``None`` if one is missing."""
    h = hashlib.sha256()
    for rel in sorted(paths):
        try:
            data = (Path(folder) / rel).read_bytes()
        except OSError:
            return None
        h.update(os.fsencode(rel) + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _read_stamp(folder: Path) -> dict | None:
    """The stamp beside ``folder``'s code (``git_commit``, ``git_dirty``, and since the fingerprint
    ``paths``, ``fingerprint``); ``None`` without one; a damaged stamp names no commit."""
    path = Path(folder) / STAMP
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
        return {**saved, "git_commit": str(saved["git_commit"])}
    except (ValueError, KeyError, TypeError, AttributeError):   # a damaged stamp names nothing
        return {"git_commit": UNKNOWN}


def _git_has(folder: Path, commit: str) -> bool:
    """Whether the repository holding ``folder`` has ``commit`` (a checkout that has it is not stale)."""
    return _git(folder, "cat-file", "-e", f"{commit}^{{commit}}") is not None


@functools.lru_cache(maxsize=None)
def code_version(folder: Path = CODE_DIR) -> tuple[str, bool | None]:
    """``(commit, dirty)`` of the code in ``folder``: git, unless git cannot answer or its
    repository has never seen the stamped commit (a stale copy of ``.git``) while the files
    still match the stamp (``python -m lpmetrics.run.provenance stamp``): then the stamp; with no git and a
    stamp the files do not match, the stamp's commit with changes (an older stamp, without
    fingerprint: as it says); ``("unknown", None)`` when nothing answers. (Files added after the
    stamp are not seen where the stamp answers.) The files are hashed only where git alone
    cannot name the code."""
    if Path(folder) == CODE_DIR and not (CODE_DIR / "pyproject.toml").is_file():
        return UNKNOWN, None   # an installed wheel, not a checkout: git would name whatever repository holds the venv
    saved = _read_stamp(Path(folder))
    commit, dirty = _git_version(folder)
    if saved is None or saved["git_commit"] == UNKNOWN or (commit != UNKNOWN and _git_has(folder, saved["git_commit"])):
        return commit, dirty
    paths = saved.get("paths")
    if isinstance(paths, list) and fingerprint(folder, paths) == saved.get("fingerprint"):
        return saved["git_commit"], saved.get("git_dirty")   # no git, or a stale .git: the stamp
    if commit != UNKNOWN:
        return commit, dirty
    return saved["git_commit"], True if "fingerprint" in saved else saved.get("git_dirty")


def stamp(folder: Path = CODE_DIR) -> dict[str, Any]:
    """Write ``folder/.code_version.json`` from git, for a copy of the tree that travels without
    ``.git`` (or with a stale one): the commit, whether the tree is dirty, and the fingerprint of
    the tracked files outside the output folders; refuses outside a repository (a stamp of
    "unknown" would hide the problem)."""
    commit, dirty = _git_version(Path(folder))
    listed = _git(Path(folder), "ls-files", "-z")
    if commit == UNKNOWN or listed is None:
        raise RuntimeError(f"{folder} is not a git checkout (or git is missing): nothing to stamp")
    paths = sorted(p for p in listed.split("\0") if p and not p.startswith(OUTPUT_FOLDERS)
                   and (Path(folder) / p).is_file())
    saved = {"git_commit": commit, "git_dirty": dirty, "fingerprint": fingerprint(Path(folder), paths),
             "paths": paths}
    (Path(folder) / STAMP).write_text(json.dumps(saved) + "\n")
    return {"git_commit": commit, "git_dirty": dirty, "files": len(paths)}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:   # not Linux
        pass
    return platform.processor() or platform.machine() or UNKNOWN


@functools.lru_cache(maxsize=None)
def device_name(device: str) -> str:
    """The GPU's name for a ``cuda`` device, else the CPU model (``mps``: the Mac's CPU model)."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return cpu_model()


def record(device: torch.device | str = "cpu", folder: Path = CODE_DIR) -> dict[str, Any]:
    """The ``provenance`` dict of a run on ``device`` (keys :data:`KEYS`)."""
    commit, dirty = code_version(Path(folder))
    return {"git_commit": commit, "git_dirty": dirty, "torch": str(torch.__version__),
            "cuda": torch.version.cuda, "device_name": device_name(str(device)),
            "cpu_count": os.cpu_count(), "python": platform.python_version()}


if __name__ == "__main__":   # python -m lpmetrics.run.provenance stamp: before copying the tree to a lent machine
    import sys
    if sys.argv[1:] != ["stamp"]:
        sys.exit("usage: python -m lpmetrics.run.provenance stamp")
    print(json.dumps(stamp()))
