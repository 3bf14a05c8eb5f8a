"""Many runs as one packed model (issue 9): exact packing (:mod:`packed.model`) and the packed
training step (:mod:`packed.step`)."""
from packed.model import PackedModels, PackError, pack, unpack
from packed.step import Divergence, PackedStep, StepOutput, param_groups

__all__ = ["PackedModels", "PackError", "pack", "unpack", "PackedStep", "Divergence", "StepOutput", "param_groups"]
