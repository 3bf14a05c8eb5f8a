"""In-memory ``torch.utils.data.Dataset`` s: one uint8 image tensor or one float feature matrix.

Items are ``(x, y)``: ``x`` float32 ``[C, H, W]`` (images) or ``[D]`` (tabular), ``y`` an int64
scalar tensor. ``x`` is normalised by ``dataset.normalize`` (:data:`NORMALIZATIONS`):
``per_channel`` (the default) with the source's constants -- per-channel train-set mean/std for
images, per-feature train statistics for tabular sources; ``per_image`` standardises each sample
by its own statistics, as TensorFlow's ``per_image_standardization`` (:func:`per_image`; the
authors' ``cifar_input.py``). ``labels`` (numpy int64) gives class counts without
iterating. Augmentation (train only) is random crop with zero padding + horizontal flip
(:mod:`data.augment`). Both datasets also gather whole batches on their own device
(``batch(idx, aug)``; ``to(device)`` moves the data there once): that is how the training stream
(:mod:`data.stream`) and evaluation read them. ``__getitem__`` (one item, augmentation drawn from
torch's global RNG) serves plain ``DataLoader`` use.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from lpmetrics.data.augment import CropFlip, crop_flip, draw_crop_flip

NORMALIZATIONS = ("per_channel", "per_image")


def per_image(x: torch.Tensor) -> torch.Tensor:
    r"""TensorFlow's per-image standardisation of a batch ``[B, ...]``, sample by sample:

    .. math:: x' = (x - \mu) / \max(\sigma, 1/\sqrt{N})

    with :math:`\mu, \sigma` the mean and population standard deviation of the sample's
    :math:`N` values (all channels and pixels together); the floor keeps a constant image finite.
    The authors apply it to float pixels on the 0..255 scale (``cifar_input.py``,
    ``per_image_standardization``; ``cifar10.py`` casts to float32 without rescaling), and so do
    we: the floor is scale-dependent, the rest is not."""
    if len(x) == 0:   # an empty split (no validation under dataset.split=authors)
        return x
    dims = tuple(range(1, x.ndim))
    n = math.prod(x.shape[1:])
    mean = x.mean(dim=dims, keepdim=True)
    std = x.std(dim=dims, keepdim=True, correction=0)
    return (x - mean) / std.clamp_min(1.0 / math.sqrt(n))


def check_normalize(normalize: str) -> str:
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"dataset.normalize={normalize!r} must be one of {', '.join(NORMALIZATIONS)} "
                         "(per_image: each sample standardised by its own mean and std, as the "
                         "authors' code does)")
    return normalize


class ImageDataset(Dataset):
    """Images kept as one uint8 tensor ``[N, C, H, W]``; normalised per item.

    Args:
        images: uint8 ``[N, C, H, W]`` (numpy or torch).
        labels: int ``[N]`` (already relabelled to the task's groups).
        mean, std: per-channel constants on the [0, 1] scale.
        augment: random crop (``pad`` pixels of zero padding) + horizontal flip.
        normalize: ``per_channel`` (``(x/255 - mean)/std``) or ``per_image`` (:func:`per_image`
            of the 0..255 pixels, after the crop and flip, as the authors' order is).
    """

    def __init__(self, images, labels, mean: Sequence[float], std: Sequence[float],
                 augment: bool = False, pad: int = 4, normalize: str = "per_channel") -> None:
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
        self.normalize = check_normalize(normalize)

    @property
    def device(self) -> torch.device:
        return self.images.device

    def to(self, device: torch.device | str) -> "ImageDataset":
        """Move the images (still uint8) and labels to ``device``, in place; returns ``self``."""
        for name in ("images", "_y", "_scale", "_shift"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def __len__(self) -> int:
        return len(self.labels)

    def draw_augment(self, n: int, generator: torch.Generator | None = None) -> CropFlip | None:
        """``n`` crop/flip draws on the CPU (``None`` without augmentation)."""
        return draw_crop_flip(n, self.pad, generator) if self.augment else None

    def batch(self, idx: torch.Tensor, aug: CropFlip | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised float32 images ``[B, C, H, W]`` and labels of items ``idx`` (on the data's
        device), cropped and flipped by ``aug`` when given."""
        x = self.images[idx]
        if aug is not None:
            x = crop_flip(x, aug, self.pad)
        if self.normalize == "per_image":
            return per_image(x.float()), self._y[idx]
        return torch.addcmul(-self._shift, x.float(), self._scale), self._y[idx]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.tensor([int(i)], device=self.device)
        aug = self.draw_augment(1)
        x, y = self.batch(idx, aug.to(self.device) if aug is not None else None)
        return x[0], y[0]


class TabularDataset(Dataset):
    """Feature vectors kept as one float32 tensor ``[N, D]`` (normalised once, at construction).

    Args:
        features: float ``[N, D]``.
        labels: int ``[N]``.
        mean, std: per-feature standardisation (broadcastable to ``[D]``); zero std -> 1.
        normalize: ``per_channel`` (each feature by ``mean``/``std``) or ``per_image`` (each row
            by its own statistics, :func:`per_image`; ``mean``/``std`` unused): digits' 64
            features are an 8x8 image.
    """

    def __init__(self, features, labels, mean=0.0, std=1.0, normalize: str = "per_channel") -> None:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"features must be [N, D], got shape {x.shape}")
        if check_normalize(normalize) == "per_image":
            x = per_image(torch.from_numpy(x)).numpy()
        else:
            std = np.where(np.asarray(std, dtype=np.float64) > 0, std, 1.0)
            x = (x - mean) / std
        self.features = torch.from_numpy(x.astype(np.float32))
        self.labels = np.asarray(labels, dtype=np.int64)
        if len(self.labels) != len(self.features):
            raise ValueError(f"{len(self.features)} rows but {len(self.labels)} labels")
        self._y = torch.from_numpy(self.labels)

    @property
    def device(self) -> torch.device:
        return self.features.device

    def to(self, device: torch.device | str) -> "TabularDataset":
        """Move features and labels to ``device``, in place; returns ``self``."""
        self.features, self._y = self.features.to(device), self._y.to(device)
        return self

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: torch.Tensor, aug: None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``idx`` and their labels (no augmentation for feature vectors)."""
        return self.features[idx], self._y[idx]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[i], self._y[i]
