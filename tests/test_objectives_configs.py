"""Every LP objective config composes and instantiates (runtime keys filled as the trainer does)."""
from __future__ import annotations

import pytest
import torch

from lpmetrics.run.builders import instantiate_runtime
from lpmetrics.objectives.base import Objective

NAMES = ["auc_lp", "auc_mu_lp", "auc_ova_lp", "f1_lp", "fbeta_lp", "jaccard_lp", "prec_at_recall_lp"]


@pytest.mark.parametrize("name", NAMES)
def test_objective_config_instantiates(name, compose_cfg):
    cfg = compose_cfg([f"objective={name}"])   # through Hydra: some configs are _global_ packages
    k = 3 if name in ("auc_mu_lp", "auc_ova_lp") else 2
    obj = instantiate_runtime(cfg.objective, num_classes=k, input_shape=[8], pos_ratio=0.5,
                              class_counts=[10] * k)
    assert isinstance(obj, Objective)
    if hasattr(obj, "method"):  # the closed form runs without the solver
        obj.method = "closed_form"
        loss = obj(torch.randn(16, k), torch.arange(16) % k)
        assert torch.isfinite(loss)
