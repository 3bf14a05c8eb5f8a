"""A checkpoint file that cannot be read, described from its bytes (train.py's resume and eval.py).

Torch's own message for a file that is neither its zip archive nor a pickle it can read advises
re-running ``torch.load`` with ``weights_only=False``: advice for a checkpoint of a trusted older
source, wrong for bytes that are simply corrupt (unpickling them in full reads nothing more and may
run code), so :func:`damage` never relays it.
"""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

ZIP_MAGIC = b"PK\x03\x04"   # torch.save's container since torch 1.6
PICKLE_MAGIC = b"\x80"       # a pickle's protocol opcode: the older torch.save format


def damage(path: Path, err: BaseException) -> str:
    """What is wrong with a checkpoint file that cannot be read, in plain words, judged from its
    bytes (``err`` is what the reader raised).

    Torch's own text for a file that is not a zip archive nor a pickle it reads advises re-running
    ``torch.load`` with ``weights_only=False``: advice for a checkpoint of a trusted older source,
    wrong for bytes that are simply corrupt (unpickling them in full reads nothing more and may run
    code), so it is never relayed."""
    if isinstance(err, (KeyError, ValueError)) and not isinstance(err, pickle.UnpicklingError):
        return f"not a run's checkpoint: it {err.args[0] if err.args else err}"   # read_checkpoint's
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as io_err:
        return f"cannot be read ({type(io_err).__name__}: {io_err.strerror or io_err})"
    if size == 0:
        return "empty (0 bytes)"
    if head == ZIP_MAGIC:
        if not zipfile.is_zipfile(path):
            return (f"a checkpoint archive cut short ({size} bytes, no zip directory at its end): "
                    "written or copied only in part")
        first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        return f"a checkpoint archive with a damaged record ({type(err).__name__}: {first})"
    if head[:1] == PICKLE_MAGIC:
        return (f"an old-format (pickle) checkpoint that cannot be read ({size} bytes; "
                f"{type(err).__name__}): cut short or corrupt")
    return f"not a checkpoint: its {size} bytes are neither torch's zip archive nor a pickle"
