"""Many runs as one packed model: exact packing (:mod:`packed.model`), the packed
training step (:mod:`packed.step`), its pack-wide SGD update (:mod:`packed.optim`) and its CUDA-graph
replay (:mod:`packed.graph`)."""
from lpmetrics.packed.model import PackedModels, PackError, pack, unpack
from lpmetrics.packed.optim import PackedSGD
from lpmetrics.packed.step import Divergence, PackedStep, StepOutput, param_groups

__all__ = ["PackedModels", "PackError", "pack", "unpack", "PackedStep", "PackedSGD", "Divergence",
           "StepOutput", "param_groups"]
