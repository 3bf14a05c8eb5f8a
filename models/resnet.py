"""ResNet-18 (torchvision) with a K-way head, trained from scratch."""
from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from lpmetrics.models.gemm_resnet import MIXED_RATIOS, GemmResNet

#: ``model.conv_impl`` values: ``auto`` is the machine's choice, made by
#: :func:`run.builders.build_model` (it needs the run's device, batch and precision); a model
#: built from the config without it (a script's direct ``instantiate``) is ``stock``, as before
CONV_IMPLS = ("stock", "gemm", "mixed", "mixed16", "auto")


def resnet18(num_classes: int, input_shape: Sequence[int], cifar_stem: bool = False,
             conv_impl: str = "stock") -> nn.Module:
    """torchvision's ResNet-18 for ``input_shape = [C, H, W]`` images and ``num_classes`` logits.

    ``cifar_stem=False`` keeps the ImageNet stem (7x7/2 conv + 3x3/2 max-pool), as Meng et al.
    ran it on 32x32 and 50x50 inputs; ``cifar_stem=True`` swaps in a 3x3/1 conv with no pool, the
    usual variant for small images (more accurate, ~16x more compute on 32x32).
    ``conv_impl``: ``stock`` = torchvision's modules; ``gemm`` = the same network (same modules,
    names, shapes and initial weights) with its convolutions computed as GEMMs
    (:class:`models.gemm_resnet.GemmResNet`); ``mixed`` = the same with the convolutions of the
    larger maps by oneDNN's direct kernel (the CPU's fast path), ``mixed16`` with more of them so
    (:data:`~models.gemm_resnet.MIXED_RATIOS`); ``auto`` here = ``stock`` (:data:`CONV_IMPLS`).
    """
    if len(input_shape) != 3:
        raise ValueError(f"resnet18 needs image input [C, H, W], got input_shape={list(input_shape)}; "
                         "use model=mlp for flat features (digits, synthetic, svmlight)")
    if conv_impl not in CONV_IMPLS:
        raise ValueError(f"conv_impl={conv_impl!r} must be one of {CONV_IMPLS} (model.conv_impl)")
    # torchvision's resnet18(weights=None, num_classes=K) is exactly this call (same init draws)
    if conv_impl == "gemm" or conv_impl in MIXED_RATIOS:
        net = GemmResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes,
                         direct_ratio=MIXED_RATIOS.get(conv_impl))
    else:
        net = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes)
    channels = int(input_shape[0])
    if cifar_stem:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif channels != 3:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net.channels_last() if isinstance(net, GemmResNet) else net
