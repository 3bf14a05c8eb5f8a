"""The global random number generators of a run: seeding, and their state in a checkpoint.

A run seeds python's, numpy's and torch's generators from ``cfg.seed`` before it builds its split
and model (:func:`seed_everything`), and each checkpoint holds their states
(:func:`rng_state`) so a resumed run draws what the uninterrupted one would
(:func:`set_rng_state`). The states are stored as a ``weights_only`` load reads them
(:func:`lpmetrics.run.runfolder.torch_load`): tensors, ints and tuples, no numpy objects.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The global RNGs' states as a ``weights_only`` load reads them (:mod:`runfolder`): numpy's
    MT19937 key, a uint32 array, as an int64 tensor; python's is a tuple of ints already."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (kind, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(gauss))}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`'s states (an older checkpoint's numpy key array as well).  The
    generators take CPU byte tensors, whatever device the checkpoint was mapped to."""
    torch.set_rng_state(state["torch"].cpu())
    kind, key, *rest = state["numpy"]
    key = key.cpu() if torch.is_tensor(key) else key
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), *rest))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
