r"""torchvision's ResNet with its convolutions as GEMMs: :class:`GemmResNet` (``model.conv_impl=gemm``;
``mixed`` / ``mixed16``: the small maps' convolutions as GEMMs, the large maps' by oneDNN's direct
kernel, :data:`MIXED_RATIOS`).

A lone run is a pack of one: the forward is :func:`models.gemm.forward` on the model's own
parameters and buffers viewed as ``[1, ...]`` stacks, the code a GEMM pack runs (He et al.
2016's ResNet, torchvision's modules unchanged). Only ``forward`` differs from torchvision's
:class:`~torchvision.models.resnet.ResNet`: the submodules, parameter and buffer names and shapes
are the same, so ``state_dict`` and checkpoints move between the two both ways, and a GEMM model
initialised from the same seed draws the same weights. The convolution weights are kept
channels-last (memory ``[C_out, k_h, k_w, C_in]``): the GEMM reads them in place and writes their
gradients in place (:mod:`models.gemm`).

Precision follows the caller: under ``torch.autocast("cpu", dtype=torch.bfloat16)``
(``trainer.precision=bf16``) the convolution GEMMs take bf16 operands with float32 accumulation
and outputs, and everything else (BatchNorm and its statistics, the head, the weights) stays
float32; the logits are float32. On CUDA autocast applies as to any module.

Example::

    >>> import torch
    >>> from torchvision.models.resnet import BasicBlock
    >>> net = GemmResNet(BasicBlock, [2, 2, 2, 2], num_classes=2)
    >>> net(torch.randn(4, 3, 32, 32)).shape
    torch.Size([4, 2])
"""
from __future__ import annotations

import torch
from torch import nn
from torchvision.models.resnet import ResNet

from lpmetrics.models import gemm


#: ``model.conv_impl=mixed``: convolutions of more than one tap whose output has at least this many
#: positions per image per output channel (one per 8 channels) run by oneDNN's direct kernel, the
#: rest as GEMMs (:func:`models.gemm.conv`). With the ImageNet stem: the stem and layers 1-2's
#: 3x3 convolutions at 32 and 50 px, layer 3's too at 96 px. Per convolution on one Xeon core
#: (``python -m scripts.cpu.bench_layers --px 32 / 50 / 96``) this split matched the faster way for
#: every convolution at the three sizes; the 32 px fp32 training step with it was 0.53x and 0.60x
#: stock's where the all-GEMM step was 0.73x and 0.84x (``results/cpu_step/``)
MIXED_DIRECT_RATIO = 1 / 8

#: the direct ratio of each ``mixed`` path: ``mixed`` (the rule above) and ``mixed16`` (one position
#: per 16 output channels: also layer3's 3x3 convolutions at 50 px, 4x4 maps of 256 channels, which
#: an AMD EPYC runs faster direct and the Xeon faster as GEMMs: ``results/cpu_step/``). Each is a
#: function of shapes only; ``auto`` picks one per machine and a run keeps it (``model.conv_impl``)
MIXED_RATIOS = {"mixed": MIXED_DIRECT_RATIO, "mixed16": 1 / 16}

#: images per GEMM forward when evaluating with running statistics (no grad): a 512-image batch's
#: im2col (77 MB at the 32 px stem) would stream through memory; 64 (the training batch) stays in cache
EVAL_CHUNK = 64


def _bf16_autocast(x: torch.Tensor) -> bool:
    kind = x.device.type
    return kind == "cpu" and torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16


class GemmResNet(ResNet):
    """:class:`~torchvision.models.resnet.ResNet` (BasicBlock) whose forward is the GEMM
    convolution of :mod:`models.gemm`; built with ResNet's own arguments (module docstring).
    Call :meth:`channels_last` after changing a convolution (the stem); the plan is read from the
    modules at the first forward."""

    def __init__(self, *args, direct_ratio: float | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.direct_ratio = direct_ratio   # which convolutions run by the direct kernel (models.gemm.conv)
        self._gemm_plan: gemm.Plan | None = None
        self.channels_last()

    def channels_last(self) -> "GemmResNet":
        """Convolution weights in channels-last memory (values, names and shapes unchanged)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)
        self._gemm_plan = None
        return self

    def direct_split(self, height: int, width: int) -> dict[str, bool]:
        """Which convolutions run by the direct kernel on ``height x width`` images (by weight key)."""
        shapes = {k: tuple(v.shape) for k, v in self.named_parameters()}
        return gemm.direct_split(gemm.plan(self), shapes, height, width, self.direct_ratio)

    def _norm_modes(self) -> dict[str, bool]:
        return {name: m.training for name, m in self.named_modules() if isinstance(m, nn.BatchNorm2d)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"GemmResNet takes images [B, C, H, W]; got {tuple(x.shape)}")
        if self._gemm_plan is None:
            self._gemm_plan = gemm.plan(self)
        modes = self._norm_modes()
        if x.shape[0] > EVAL_CHUNK and not torch.is_grad_enabled() and not any(modes.values()):
            # images are independent under running statistics: chunks keep im2col in cache
            return torch.cat([self._forward(part, modes) for part in x.split(EVAL_CHUNK)])
        return self._forward(x, modes)

    def _forward(self, x: torch.Tensor, modes: dict[str, bool]) -> torch.Tensor:
        params = {k: v.unsqueeze(0) for k, v in self.named_parameters()}
        buffers = {k: v.unsqueeze(0) for k, v in self.named_buffers()}
        if not _bf16_autocast(x):
            return gemm.forward(self._gemm_plan, params, buffers, x.unsqueeze(0), modes,
                                direct_ratio=self.direct_ratio).squeeze(0)
        with torch.autocast("cpu", enabled=False):   # bf16 operands in the convolutions only
            return gemm.forward(self._gemm_plan, params, buffers, x.float().unsqueeze(0), modes,
                                operands="bf16", direct_ratio=self.direct_ratio).squeeze(0)
