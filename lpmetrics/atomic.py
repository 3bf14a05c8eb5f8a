"""Crash-safe file writes: a reader (or a resumed run) sees the old file or the new one, never half.

:func:`atomic_write` writes into a temporary file in the target's folder (same filesystem, so the
rename is atomic), flushes and ``fsync`` s it, renames it over the target and ``fsync`` s the
folder so the rename itself survives a power cut (POSIX: ``rename(2)`` replaces atomically).
A process killed at any point (SIGKILL, OOM, pre-emption) leaves at worst a stray
``.<name>.*.tmp`` file that nothing reads.

``keep_previous=PATH`` also keeps the file being replaced as ``PATH`` (hard-linked, so at every
instant both the target and ``PATH`` are complete files): the trainer keeps its previous
checkpoint as ``last.prev.pt`` and falls back to it when ``last.pt`` cannot be read.

Every run artifact goes through here (``last.pt``, ``best.pt``, ``metrics.csv``,
``results.json``, ``eval_*.json``, the decoded-pack cache): one piece of code for the logic.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Callable


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows, or a folder we may not open: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask  # mkstemp makes 0600; run files and caches should stay readable


def _link_previous(path: Path, previous: Path) -> None:
    """Make ``previous`` a complete copy of ``path`` without a moment where either is partial."""
    tmp = previous.with_name(f".{previous.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:  # no hard links on this filesystem: copy (the copy is atomic in turn)
        shutil.copyfile(path, tmp)
    os.replace(tmp, previous)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any], *,
                 keep_previous: str | os.PathLike | None = None) -> None:
    """Call ``write(f)`` on a temporary binary file, then atomically move it to ``path``.

    Args:
        path: the target file (its folder is created if missing).
        write: writes the content into the open binary file it is given.
        keep_previous: where to keep the file ``path`` held before (if any), e.g. ``last.prev.pt``.

    Example::

        >>> atomic_write("run/metrics.csv", lambda f: f.write(b"step,loss\\n1,0.5\\n"))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _default_mode())
        if keep_previous is not None and path.is_file():
            _link_previous(path, Path(keep_previous))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, **kwargs: Any) -> None:
    atomic_write(path, lambda f: f.write(data), **kwargs)


def atomic_write_text(path: str | os.PathLike, text: str, **kwargs: Any) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), **kwargs)


def atomic_write_json(path: str | os.PathLike, obj: Any, **kwargs: Any) -> None:
    """``json.dumps(obj, indent=2)`` (floats of numpy/torch scalars as plain floats), atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, default=float) + "\n", **kwargs)


def atomic_torch_save(obj: Any, path: str | os.PathLike, **kwargs: Any) -> None:
    """``torch.save`` atomically."""
    import torch

    atomic_write(path, lambda f: torch.save(obj, f), **kwargs)
