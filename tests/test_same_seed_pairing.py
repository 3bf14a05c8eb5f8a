"""The premise of reading objectives seed by seed (``scripts.tables.compare_seeds``): at one seed,
runs of different objectives start from the same weights and see the same batches, because the
model is drawn from the seed before the objective is built and the batch stream is a function of
the seed alone (``run/prepare.py``, ``data/stream.py``)."""
from __future__ import annotations

import torch

from lpmetrics.data.stream import BatchStream
from lpmetrics.run.prepare import prepare_run

OBJECTIVES = ("ce", "auc_lp", "ppd_sg", "ppd_adagrad")


def test_objectives_at_one_seed_share_initial_weights_and_batches(compose_cfg, tmp_path):
    weights, batches = {}, {}
    for objective in OBJECTIVES:
        cfg = compose_cfg(["experiment=table1_binary", "dataset=digits", f"objective={objective}", "seed=1",
                           "logger=csv"])
        run, _ = prepare_run(cfg, tmp_path / objective, torch.device("cpu"))
        weights[objective] = {k: v.clone() for k, v in run.model.state_dict().items()}
        stream = BatchStream(run.bundle.train, cfg.trainer.batch_size, cfg.seed)
        batches[objective] = [next(stream) for _ in range(3)]
    ref = weights["ce"]
    for objective in OBJECTIVES[1:]:
        assert weights[objective].keys() == ref.keys(), objective
        assert all(torch.equal(weights[objective][k], ref[k]) for k in ref), objective
        for (x, y), (x0, y0) in zip(batches[objective], batches["ce"]):
            assert torch.equal(x, x0) and torch.equal(y, y0), objective
    other = compose_cfg(["experiment=table1_binary", "dataset=digits", "objective=ce", "seed=2", "logger=csv"])
    run, _ = prepare_run(other, tmp_path / "ce_seed2", torch.device("cpu"))
    assert not all(torch.equal(v, ref[k]) for k, v in run.model.state_dict().items() if v.is_floating_point())
