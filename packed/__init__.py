"""Many runs as one packed model: exact packing (:mod:`packed.model`), the packed
training step (:mod:`packed.step`), its pack-wide SGD update (:mod:`packed.optim`) and its CUDA-graph
replay (:mod:`packed.graph`)."""
if not __name__.startswith("lpmetrics."):   # one identity per class (lpmetrics/__init__.py)
    raise ImportError(f"import lpmetrics.{__name__}, not the bare folder name {__name__!r}")
from lpmetrics.packed.model import PackedModels, PackError, pack, unpack
from lpmetrics.packed.optim import PackedSGD
from lpmetrics.packed.step import Divergence, PackedStep, StepOutput, param_groups

__all__ = ["PackedModels", "PackError", "pack", "unpack", "PackedStep", "PackedSGD", "Divergence",
           "StepOutput", "param_groups"]
