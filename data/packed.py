"""Packed ``.npz`` datasets (format: ``../shared/data/README.md``), decoded once and cached.

A pack holds each split's JPEG files concatenated (``{split}_buf``, offsets ``{split}_off``,
labels ``{split}_y``) plus ``class_names``. Decoding CIFAR-10 takes seconds, so the decoded
uint8 arrays are saved as ``.npy`` (already ``[N, C, H, W]``) in a cache folder, keyed by the
pack's SHA-256 so a changed pack never reuses a stale cache. Cache folder: ``cache_dir`` if given,
else ``<root>/.cache`` when the data root is writable (by its permission bits: a folder marked
read-only is left alone even when running as root), else ``$XDG_CACHE_HOME/lpnd`` (default
``~/.cache/lpnd``). Writes go through :func:`atomic.atomic_write` (temporary file, fsync,
rename), so concurrent runs (Hydra multirun) never read a half-written cache.

Every pack is checked before use (:func:`check_pack`): its SHA-256 against the one the data
README beside it lists (``README.md`` in the pack's folder, full or abbreviated ``3a9bcc7e…38537``,
as ``../shared/data/README.md`` writes it), and its zip structure and arrays on opening. A
truncated or altered pack raises :class:`data.errors.DamagedDatasetError` naming the file and how
to replace it, instead of ``zipfile.BadZipFile`` twenty frames deep.
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from lpmetrics.atomic import atomic_write
from lpmetrics.data.errors import DamagedDatasetError

PACK_KEYS = ("class_names", "train_buf", "train_off", "train_y", "test_buf", "test_off", "test_y")


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
    atomic_write(path, lambda f: np.save(f, array))


def listed_sha256(path: Path) -> str | None:
    """The SHA-256 that the ``README.md`` beside ``path`` lists for it (``None`` if none):
    64 hex digits, or an abbreviation ``prefix…suffix`` (``...`` also accepted)."""
    readme = path.parent / "README.md"
    try:
        text = readme.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if f"`{path.name}`" not in line:
            continue
        found = re.search(r"`([0-9a-f]{64}|[0-9a-f]{4,}(?:…|\.\.\.)[0-9a-f]{4,})`", line)
        if found:
            return found.group(1)
    return None


def _replace_hint(path: Path) -> str:
    return (f"Replace {path} with a fresh copy of the pack (the README beside it lists its sha256; "
            f"check with `sha256sum {path}`), or delete it and point DATA_ROOT / dataset.root at "
            "torchvision's folder (dataset.download=true where a network exists)")


def check_pack(path: Path, digest: str) -> None:
    """Raise :class:`DamagedDatasetError` when ``path`` is empty or its SHA-256 ``digest`` does
    not match the README's entry for it."""
    size = path.stat().st_size
    if size == 0:
        raise DamagedDatasetError(f"pack {path} is empty (0 bytes). {_replace_hint(path)}.")
    want = listed_sha256(path)
    if want is None:
        return
    head, _, tail = want.replace("...", "…").partition("…")
    if not (digest.startswith(head) and digest.endswith(tail)):
        raise DamagedDatasetError(
            f"pack {path} is damaged: its sha256 is {digest[:8]}…{digest[-5:]} ({size:,} bytes) "
            f"but {path.parent / 'README.md'} lists {want} (a truncated copy or an interrupted "
            f"download). {_replace_hint(path)}.")


def load_pack(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> dict:
    """Return ``{"train_x", "train_y", "test_x", "test_y", "class_names"}`` of a pack.

    ``*_x`` are uint8 ``[N, 3, H, W]`` (memory-mapped from the cache), ``*_y`` int64 ``[N]``.
    The first call decodes and writes the cache; later calls only read it. A cache folder that
    cannot be written is skipped (the arrays are still returned).
    """
    path = Path(path)
    cache = Path(cache_dir) if cache_dir else default_cache_dir(path.parent)
    digest = _sha256(path)
    check_pack(path, digest)
    key = f"{path.stem}-{digest[:16]}"
    try:
        return _read_pack(path, cache, key)
    except (zipfile.BadZipFile, EOFError, KeyError, ValueError, OSError) as err:
        if isinstance(err, (FileNotFoundError, DamagedDatasetError)):
            raise
        raise DamagedDatasetError(f"pack {path} cannot be read ({type(err).__name__}: {err}); "
                                  f"{_replace_hint(path)}.") from err


def _read_pack(path: Path, cache: Path, key: str) -> dict:
    out: dict = {}
    with np.load(path, allow_pickle=False) as pack:
        missing = [k for k in PACK_KEYS if k not in pack.files]
        if missing:
            raise KeyError(f"arrays {missing} missing (format: shared/data/README.md)")
        out["class_names"] = [str(c) for c in pack["class_names"]]
        for split in ("train", "test"):
            out[f"{split}_y"] = pack[f"{split}_y"].astype(np.int64)
            cached = cache / f"{key}.{split}_x_nchw.npy"
            if cached.exists():
                try:
                    out[f"{split}_x"] = np.load(cached, mmap_mode="r")
                    continue
                except (ValueError, OSError):
                    pass  # an unreadable cache entry is rebuilt below, never blamed on the pack
            images = decode_images(pack[f"{split}_buf"], pack[f"{split}_off"])
            try:
                _save_atomic(cached, images)
            except OSError:
                pass  # read-only cache: decode again next time rather than fail the run
            out[f"{split}_x"] = images
    return out
