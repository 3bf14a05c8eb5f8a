"""What the GEMM forward of a torchvision ResNet reads from the model: :func:`plan` turns a
:class:`~torchvision.models.resnet.ResNet` of BasicBlocks (He et al. 2016; ResNet-18/34, either
stem) into a :class:`Plan` of hyperparameters and ``state_dict`` keys, or a
:class:`GemmPlanError` naming the first module the GEMM forward (:mod:`models.gemm`) cannot
compute."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet


class GemmPlanError(ValueError):
    """The model is not a torchvision ResNet of BasicBlocks this mode computes (the reason says
    which module differs). :mod:`packed.model` re-raises it as its ``PackError``."""


@dataclass(frozen=True)
class Conv:
    weight: str               # key of the stacked weight [N, C_out, C_in, k_h, k_w]
    stride: tuple[int, int]
    padding: tuple[int, int]


@dataclass(frozen=True)
class Norm:
    prefix: str               # keys prefix.weight / .bias / .running_mean / .running_var / .num_batches_tracked
    eps: float
    momentum: float | None


@dataclass(frozen=True)
class Block:
    conv1: Conv
    bn1: Norm
    conv2: Conv
    bn2: Norm
    down: tuple[Conv, Norm] | None


@dataclass(frozen=True)
class Plan:
    """What the forward reads from the skeleton: hyperparameters and storage keys only."""
    stem: Conv
    stem_bn: Norm
    pool: dict | None          # F.max_pool2d keywords; None: no pool (cifar_stem)
    blocks: tuple[Block, ...]
    fc: str


def _conv(m: nn.Module, name: str) -> Conv:
    if not isinstance(m, nn.Conv2d) or m.groups != 1 or m.dilation != (1, 1) or m.bias is not None \
            or m.padding_mode != "zeros" or isinstance(m.padding, str):
        raise GemmPlanError(f"{name} is {m}: mode='gemm' computes bias-free, ungrouped, undilated, "
                            "zero-padded Conv2d only")
    return Conv(f"{name}.weight", tuple(m.stride), tuple(m.padding))


def _norm(m: nn.Module, name: str) -> Norm:
    if not isinstance(m, nn.BatchNorm2d) or not m.affine or not m.track_running_stats:
        raise GemmPlanError(f"{name} is {m}: mode='gemm' computes affine BatchNorm2d with running "
                            "statistics only")
    return Norm(name, float(m.eps), m.momentum)


def plan(model: nn.Module) -> Plan:
    """Read ``model`` (a torchvision :class:`ResNet` of :class:`BasicBlock`, e.g.
    ``models.resnet.resnet18`` with either stem) into a :class:`Plan`; :class:`GemmPlanError`
    naming the first module this mode cannot compute."""
    if not isinstance(model, ResNet):
        raise GemmPlanError(f"the model is a {type(model).__name__}, not a torchvision ResNet: "
                            "mode='gemm' computes ResNet-18/34 (models/resnet.py) only; "
                            "pack it with mode='vmap' or 'loop'")
    pool = model.maxpool
    if not isinstance(pool, (nn.MaxPool2d, nn.Identity)):
        raise GemmPlanError(f"maxpool is {pool}: mode='gemm' takes a MaxPool2d or Identity")
    if not isinstance(model.avgpool, nn.AdaptiveAvgPool2d) or model.avgpool.output_size not in (1, (1, 1)):
        raise GemmPlanError(f"avgpool is {model.avgpool}: mode='gemm' takes global average pooling")
    if model.fc.bias is None:
        raise GemmPlanError("fc has no bias: mode='gemm' computes torchvision's Linear head")
    blocks = []
    for li in range(1, 5):
        for bi, blk in enumerate(getattr(model, f"layer{li}")):
            name = f"layer{li}.{bi}"
            if not isinstance(blk, BasicBlock):
                raise GemmPlanError(f"{name} is a {type(blk).__name__}: mode='gemm' computes "
                                    "BasicBlock ResNets (18/34) only; pack it with mode='vmap'")
            down = None
            if blk.downsample is not None:
                if len(blk.downsample) != 2:
                    raise GemmPlanError(f"{name}.downsample is {blk.downsample}: expected conv, bn")
                down = (_conv(blk.downsample[0], f"{name}.downsample.0"),
                        _norm(blk.downsample[1], f"{name}.downsample.1"))
            blocks.append(Block(_conv(blk.conv1, f"{name}.conv1"), _norm(blk.bn1, f"{name}.bn1"),
                                _conv(blk.conv2, f"{name}.conv2"), _norm(blk.bn2, f"{name}.bn2"), down))
    keys = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
    return Plan(_conv(model.conv1, "conv1"), _norm(model.bn1, "bn1"),
                {k: getattr(pool, k) for k in keys} if isinstance(pool, nn.MaxPool2d) else None,
                tuple(blocks), "fc")
