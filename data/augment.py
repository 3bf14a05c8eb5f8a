"""Random crop (zero padding) + horizontal flip of a whole uint8 batch, in one gather.

The standard CIFAR augmentation (He et al. 2016, §4.2: pad 4, random 32x32 crop, random flip),
done as batched tensor code on whatever device holds the images, as airbench / hlb-CIFAR10 do:
no per-image Python, no PIL, no host round trip. The random draws are separate from the
arithmetic (:func:`draw_crop_flip` on a CPU generator, :func:`crop_flip` anywhere), so the same
seed gives the same augmented batch on the CPU and on a GPU.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class CropFlip(NamedTuple):
    """Per-image crop offsets in ``[0, 2 * pad]`` (into the zero-padded image) and flip flags."""
    dy: torch.Tensor     # int64 [B]
    dx: torch.Tensor     # int64 [B]
    flip: torch.Tensor   # bool  [B]

    def to(self, device: torch.device | str) -> "CropFlip":
        return CropFlip(*(t.to(device) for t in self))

    def __getitem__(self, index):   # a slice of the batch (tuple indexing stays positional)
        if isinstance(index, int):
            return tuple.__getitem__(self, index)
        return CropFlip(self.dy[index], self.dx[index], self.flip[index])


def draw_crop_flip(n: int, pad: int, generator: torch.Generator | None = None) -> CropFlip:
    """``n`` independent draws: offsets uniform on ``{0, ..., 2 pad}``, flips with probability 1/2."""
    offsets = torch.randint(0, 2 * pad + 1, (2, n), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    return CropFlip(offsets[0], offsets[1], flip)


def crop_flip(images: torch.Tensor, aug: CropFlip, pad: int) -> torch.Tensor:
    """``out[b] = flip_b(zero_pad(images[b], pad)[:, dy_b : dy_b + H, dx_b : dx_b + W])``.

    Args:
        images: ``[B, C, H, W]`` (any dtype; uint8 in practice).
        aug: the draws (:func:`draw_crop_flip`), on ``images``' device.
        pad: zero padding on every side (``0``: flips only).

    Pixels are read with one advanced-indexing gather from the padded batch: row ``r`` of image
    ``b`` comes from padded row ``dy_b + r``; column ``c`` from ``dx_b + c``, or ``dx_b + W - 1 - c``
    when the image is flipped (crop then flip, as torchvision's two transforms compose).
    """
    b, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (pad,) * 4) if pad > 0 else images
    rows = aug.dy[:, None] + torch.arange(h, device=images.device)              # [B, H]
    cols = torch.arange(w, device=images.device).expand(b, w)
    cols = aug.dx[:, None] + torch.where(aug.flip[:, None], w - 1 - cols, cols)  # [B, W]
    batch = torch.arange(b, device=images.device)[:, None, None]
    # advanced indices around a slice: the result is [B, H, W, C]
    return padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
