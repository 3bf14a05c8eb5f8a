"""The packed forward's GEMM convolution (``PackedModels(mode="gemm")``): the project's one GEMM
convolution lives in :mod:`models.gemm`, below the run layer, so that a lone run (a pack of one,
``model.conv_impl=gemm``) and a pack compute the same code; this module is its name in packed/."""
from lpmetrics.models.gemm import (Block, Conv, GemmPlanError, Norm, Plan, batch_norm, bmm, conv,
                                   forward, gemm, im2col, max_pool, plan, taps)

__all__ = ["Block", "Conv", "GemmPlanError", "Norm", "Plan", "batch_norm", "bmm", "conv", "forward",
           "gemm", "im2col", "max_pool", "plan", "taps"]
