"""Packed ``.npz`` datasets (format: ``../shared/data/README.md``), decoded once and cached.

A pack holds each split's JPEG files concatenated (``{split}_buf``, offsets ``{split}_off``,
labels ``{split}_y``) plus ``class_names``. Decoding CIFAR-10 takes seconds, so the decoded
uint8 arrays are saved as ``.npy`` (already ``[N, C, H, W]``) in a cache folder, keyed by the
pack's SHA-256 so a changed pack never reuses a stale cache. Cache folder: ``cache_dir`` if given,
else ``<root>/.cache`` when the data root is writable (by its permission bits: a folder marked
read-only is left alone even when running as root), else ``$XDG_CACHE_HOME/lpnd`` (default
``~/.cache/lpnd``). Writes go to a temporary file and are renamed into place, so concurrent runs
(Hydra multirun) never read a half-written cache.
"""
from __future__ import annotations

import hashlib
import io
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image


def default_cache_dir(root: str | os.PathLike) -> Path:
    """``<root>/.cache`` if ``root`` is writable by permission bits, else the user cache."""
    root = Path(root)
    try:
        mode = root.stat().st_mode
        if mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) and os.access(root, os.W_OK):
            return root / ".cache"
    except OSError:
        pass
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lpnd"


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def decode_images(buf: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Decode concatenated image files to uint8 ``[N, C, H, W]`` (RGB) with Pillow."""
    raw = buf.tobytes()
    first = np.asarray(Image.open(io.BytesIO(raw[off[0]:off[1]])).convert("RGB"))
    out = np.empty((len(off) - 1, 3) + first.shape[:2], dtype=np.uint8)
    for i in range(len(off) - 1):
        img = np.asarray(Image.open(io.BytesIO(raw[off[i]:off[i + 1]])).convert("RGB"))
        out[i] = img.transpose(2, 0, 1)
    return out


def _save_atomic(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npy")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a shared cache should be readable
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_pack(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> dict:
    """Return ``{"train_x", "train_y", "test_x", "test_y", "class_names"}`` of a pack.

    ``*_x`` are uint8 ``[N, 3, H, W]`` (memory-mapped from the cache), ``*_y`` int64 ``[N]``.
    The first call decodes and writes the cache; later calls only read it. A cache folder that
    cannot be written is skipped (the arrays are still returned).
    """
    path = Path(path)
    cache = Path(cache_dir) if cache_dir else default_cache_dir(path.parent)
    key = f"{path.stem}-{_sha256(path)[:16]}"
    out: dict = {}
    with np.load(path, allow_pickle=False) as pack:
        out["class_names"] = [str(c) for c in pack["class_names"]]
        for split in ("train", "test"):
            out[f"{split}_y"] = pack[f"{split}_y"].astype(np.int64)
            cached = cache / f"{key}.{split}_x_nchw.npy"
            if cached.exists():
                out[f"{split}_x"] = np.load(cached, mmap_mode="r")
                continue
            images = decode_images(pack[f"{split}_buf"], pack[f"{split}_off"])
            try:
                _save_atomic(cached, images)
            except OSError:
                pass  # read-only cache: decode again next time rather than fail the run
            out[f"{split}_x"] = images
    return out
