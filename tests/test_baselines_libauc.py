"""objective=libauc_aucm: LibAUC's AUCMLoss wired with the train split's p, and PESG through train.py."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from lpmetrics.baselines.libauc_aucm import LibAUCAUCM, make_pesg
from lpmetrics.run import loop


@pytest.mark.parametrize("seed", range(5))
def test_loss_uses_the_train_ratio_not_the_batch_ratio(seed):
    g = torch.Generator().manual_seed(seed)
    p = 0.9  # far from any batch's ratio below
    obj = LibAUCAUCM(pos_ratio=p, margin=1.0)
    with torch.no_grad():
        obj.loss.a.fill_(0.3), obj.loss.b.fill_(0.1), obj.loss.alpha.fill_(0.7)
    logits = torch.randn(40, 2, generator=g)
    labels = (torch.arange(40) % 2).long()
    h = torch.softmax(logits, 1)[:, 1]
    pos, neg = (labels == 1).float(), (labels == 0).float()
    a, b, alpha, m = 0.3, 0.1, 0.7, 1.0
    expected = ((1 - p) * ((h - a) ** 2 * pos).mean() + p * ((h - b) ** 2 * neg).mean()
                + 2 * alpha * (p * (1 - p) * m + (p * h * neg - (1 - p) * h * pos).mean())
                - p * (1 - p) * alpha ** 2)
    assert obj(logits, labels).item() == pytest.approx(expected.item(), rel=1e-6)


def test_pesg_needs_the_aucm_objective():
    with pytest.raises(TypeError, match="objective=libauc_aucm"):
        make_pesg([{"params": [torch.zeros(2, requires_grad=True)]}], lr=0.1)


def test_trains_through_train_py(compose_cfg, tmp_path):
    cfg = compose_cfg(["objective=libauc_aucm", "dataset=digits", "dataset.neg_keep=0.2",
                       "trainer.max_steps=60", "trainer.eval_every=30", "device=cpu"])
    assert cfg.optimizer._target_ == "lpmetrics.baselines.libauc_aucm.make_pesg"
    loop.train(cfg, tmp_path)
    rows = pd.read_csv(tmp_path / "metrics.csv")
    assert rows["train_loss"].notna().all() and rows["test_auc"].iloc[-1] > 0.8
    assert rows["aucm_alpha"].iloc[-1] > 0  # alpha ascended from 0
