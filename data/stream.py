"""The training batch stream: one definition for ``train.py`` and the packed launcher, on every device.

Batch ``k`` of a run is a pure function of ``(seed, k)``: epoch ``e = k // max(1, n // B)`` shuffles the
training split with a generator seeded ``seed * 100003 + e`` and draws that epoch's crops and flips
(:mod:`data.augment`) from a second generator seeded from ``(seed, e)``; the batch is the ``k``-th
slice of both. So a resumed run sees the batches it would have seen, a packed run sees the
batches of its ``train.py`` twin without sharing any RNG state, and the CPU and a GPU see the same
batches. The draws are made on the CPU once per epoch and copied to the data's device once per
epoch; every step is then a slice and a gather on the device (no per-image Python, no host
round trip). The data stay on the device the dataset was moved to (``DataBundle.to``).

History: runs committed before this module (their ``results.json`` has no ``"batch_stream"``
key) drew their augmentation per image from torch's global RNG; their shuffling order is the
same, their crops and flips are not.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: recorded in ``results.json`` so tables can tell which stream made a run
STREAM_VERSION = "seeded-epoch-v2"


def _epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 63-bit seed for the augmentation draws of ``epoch`` (independent of the
    shuffling generator, which is seeded ``seed * 100003 + epoch``)."""
    return int(np.random.SeedSequence([int(seed) % 2**32, int(epoch), 1]).generate_state(2, np.uint64)[0] >> 1)


def gather(dataset, idx: torch.Tensor, aug: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Items ``idx`` of ``dataset`` as one batch: our datasets gather on their own device
    (``dataset.batch``); any other map-style dataset is read item by item and stacked."""
    if hasattr(dataset, "batch"):
        return dataset.batch(idx, aug)
    items = [dataset[int(i)] for i in idx]
    return torch.stack([x for x, _ in items]), torch.stack([torch.as_tensor(y) for _, y in items])


class BatchStream:
    """Shuffled training minibatches of ``dataset``, from step ``start_step`` on (an iterator).

    Example::

        >>> from data.datasets import TabularDataset
        >>> ds = TabularDataset(np.arange(20.0).reshape(10, 2), np.arange(10) % 2)
        >>> a, b = BatchStream(ds, 4, seed=0), BatchStream(ds, 4, seed=0, start_step=1)
        >>> _ = next(a); torch.equal(next(a)[0], next(b)[0])
        True
    """

    def __init__(self, dataset, batch_size: int, seed: int, start_step: int = 0) -> None:
        self.dataset, self.batch_size, self.seed, self.step = dataset, int(batch_size), int(seed), int(start_step)
        self.n = len(dataset)
        self.per_epoch = max(1, self.n // self.batch_size)
        self._epoch: int | None = None

    def _load(self, epoch: int) -> None:
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
        draw = getattr(self.dataset, "draw_augment", None)
        aug = draw(self.per_epoch * self.batch_size, torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))) \
            if draw is not None else None
        device = getattr(self.dataset, "device", torch.device("cpu"))
        self._perm, self._aug = perm.to(device), aug.to(device) if aug is not None else None
        self._epoch = epoch

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, k = divmod(self.step, self.per_epoch)
        if epoch != self._epoch:
            self._load(epoch)
        part = slice(k * self.batch_size, (k + 1) * self.batch_size)
        idx = self._perm[part]
        aug = self._aug[k * self.batch_size:k * self.batch_size + len(idx)] if self._aug is not None else None
        self.step += 1
        return gather(self.dataset, idx, aug)

