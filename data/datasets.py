"""In-memory ``torch.utils.data.Dataset`` s: one uint8 image tensor or one float feature matrix.

Items are ``(x, y)``: ``x`` float32 ``[C, H, W]`` normalised per channel (images) or ``[D]``
(tabular), ``y`` an int64 scalar tensor. ``labels`` (numpy int64) gives class counts without
iterating. Augmentation (train only) is random crop with zero padding + horizontal flip, done
with tensor ops on the uint8 item, so ``__getitem__`` costs a few microseconds and no PIL.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset


class ImageDataset(Dataset):
    """Images kept as one uint8 tensor ``[N, C, H, W]``; normalised per item.

    Args:
        images: uint8 ``[N, C, H, W]`` (numpy or torch).
        labels: int ``[N]`` (already relabelled to the task's groups).
        mean, std: per-channel constants on the [0, 1] scale.
        augment: random crop (``pad`` pixels of zero padding) + horizontal flip; uses torch's
            global RNG, which DataLoader seeds per worker.
    """

    def __init__(self, images, labels, mean: Sequence[float], std: Sequence[float],
                 augment: bool = False, pad: int = 4) -> None:
        self.images = torch.as_tensor(np.ascontiguousarray(images))
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise ValueError(f"images must be uint8 [N, C, H, W], got {self.images.dtype} "
                             f"{tuple(self.images.shape)}")
        self.labels = np.asarray(labels, dtype=np.int64)
        if len(self.labels) != len(self.images):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")
        self._y = torch.from_numpy(self.labels)
        std_t = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        # x_norm = (x/255 - mean)/std = x * scale - shift: one fused multiply-add per item.
        self._scale = 1.0 / (255.0 * std_t)
        self._shift = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1) / std_t
        self.augment, self.pad = bool(augment), int(pad)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[i]
        if self.augment:
            x = self._crop_flip(x)
        return torch.addcmul(-self._shift, x.float(), self._scale), self._y[i]

    def _crop_flip(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if self.pad > 0:
            dy, dx = torch.randint(0, 2 * self.pad + 1, (2,)).tolist()
            x = F.pad(x, (self.pad,) * 4)[:, dy:dy + h, dx:dx + w]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x


class TabularDataset(Dataset):
    """Feature vectors kept as one float32 tensor ``[N, D]`` (normalised once, at construction).

    Args:
        features: float ``[N, D]``.
        labels: int ``[N]``.
        mean, std: per-feature standardisation (broadcastable to ``[D]``); zero std -> 1.
    """

    def __init__(self, features, labels, mean=0.0, std=1.0) -> None:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"features must be [N, D], got shape {x.shape}")
        std = np.where(np.asarray(std, dtype=np.float64) > 0, std, 1.0)
        self.features = torch.from_numpy(((x - mean) / std).astype(np.float32))
        self.labels = np.asarray(labels, dtype=np.int64)
        if len(self.labels) != len(self.features):
            raise ValueError(f"{len(self.features)} rows but {len(self.labels)} labels")
        self._y = torch.from_numpy(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[i], self._y[i]
