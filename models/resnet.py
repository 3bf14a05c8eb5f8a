"""ResNet-18 (torchvision) with a K-way head, trained from scratch."""
from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torchvision.models import resnet18 as tv_resnet18


def resnet18(num_classes: int, input_shape: Sequence[int], cifar_stem: bool = False) -> nn.Module:
    """torchvision's ResNet-18 for ``input_shape = [C, H, W]`` images and ``num_classes`` logits.

    ``cifar_stem=False`` keeps the ImageNet stem (7x7/2 conv + 3x3/2 max-pool), as Meng et al.
    ran it on 32x32 and 50x50 inputs; ``cifar_stem=True`` swaps in a 3x3/1 conv with no pool, the
    usual variant for small images (more accurate, ~16x more compute on 32x32).
    """
    if len(input_shape) != 3:
        raise ValueError(f"resnet18 needs image input [C, H, W], got input_shape={list(input_shape)}; "
                         "use model=mlp for flat features (digits, synthetic, svmlight)")
    net = tv_resnet18(weights=None, num_classes=num_classes)
    channels = int(input_shape[0])
    if cifar_stem:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif channels != 3:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net
