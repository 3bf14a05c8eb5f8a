"""``trainer.precision`` (bf16 autocast of the model) and ``trainer.checkpoints``.

bf16 must really change the computation (its losses differ from fp32 by bf16 rounding, not by
more), leave the objective float32, and pack (a packed bf16 run matches its ``train.py`` twin to
bf16 rounding: see :mod:`packed.step`); ``checkpoints=false`` writes the same metrics and no
checkpoint; old configs without the new keys resume and pool as the keys' defaults.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from lpmetrics.run import loop
from omegaconf import OmegaConf
from lpmetrics.objectives.ce import CrossEntropy
from lpmetrics.packed.launch import Job, train_packed
from lpmetrics.run.runfolder import config_differences
from lpmetrics.run.upgrade import ADDED_DEFAULTS
from lpmetrics.errors import ConfigError
from lpmetrics.run.validate import validate

SHORT = ["dataset=digits", "trainer.max_steps=6", "trainer.eval_every=3"]


def losses(run_dir) -> list[float]:
    return pd.read_csv(run_dir / "metrics.csv")["train_loss"].tolist()


@pytest.mark.parametrize("objective", ["ce", "auc_lp"])
def test_bf16_changes_the_model_arithmetic_only_by_its_rounding(compose_cfg, tmp_path, objective):
    first = ["dataset=digits", "trainer.max_steps=2", "trainer.eval_every=1", f"objective={objective}"]
    fp32 = loop.train(compose_cfg(first), tmp_path / "fp32")
    bf16 = loop.train(compose_cfg([*first, "trainer.precision=bf16"]), tmp_path / "bf16")
    a, b = losses(tmp_path / "fp32")[0], losses(tmp_path / "bf16")[0]   # same init, same batch
    assert a != b                        # autocast did run the model in bf16
    assert b == pytest.approx(a, rel=0.02)   # ... and only rounding changed (bf16: 8 bits)
    assert bf16["config"]["trainer"]["precision"] == "bf16"
    assert fp32["final"]["val_auc"] > 0.5 and bf16["final"]["val_auc"] > 0.5


def test_the_objective_sees_float32_scores_under_bf16(compose_cfg, tmp_path, monkeypatch):
    seen = []
    real = CrossEntropy.forward

    def spy(self, logits, labels):
        seen.append(logits.dtype)
        return real(self, logits, labels)

    monkeypatch.setattr(CrossEntropy, "forward", spy)
    loop.train(compose_cfg([*SHORT, "trainer.precision=bf16"]), tmp_path / "bf16")
    assert seen and set(seen) == {torch.float32}


def test_packed_bf16_run_matches_train_py_to_bf16_rounding(compose_cfg, tmp_path):
    over = ["dataset=digits", "trainer.max_steps=2", "trainer.eval_every=1", "trainer.precision=bf16"]
    loop.train(compose_cfg(over), tmp_path / "alone")
    (res,) = train_packed([Job(compose_cfg(over), tmp_path / "packed", name="p")])
    alone, packed = losses(tmp_path / "alone"), losses(tmp_path / "packed")
    # the MLP's linear layers run in bf16 alone but partly in float32 inside vmap (batched
    # linear with bias is outside CPU autocast's casts), so equal to bf16 rounding, not bitwise
    assert packed[0] == pytest.approx(alone[0], rel=0.02)   # the first step: same init and batch
    assert res["config"]["trainer"]["precision"] == "bf16"


def test_precision_splits_packs(compose_cfg, tmp_path):
    jobs = [Job(compose_cfg([*SHORT, f"trainer.precision={p}"]), tmp_path / p, name=p) for p in ("fp32", "bf16")]
    out = train_packed(jobs)
    assert [r["packed"]["size"] for r in out] == [1, 1]


def test_checkpoints_false_writes_the_same_metrics_and_no_checkpoint(compose_cfg, tmp_path):
    loop.train(compose_cfg(SHORT), tmp_path / "with")
    res = loop.train(compose_cfg([*SHORT, "trainer.checkpoints=false"]), tmp_path / "without")
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "with" / "metrics.csv"),
                                  pd.read_csv(tmp_path / "without" / "metrics.csv"), check_exact=True)
    assert (tmp_path / "with" / "last.pt").is_file() and (tmp_path / "with" / "best.pt").is_file()
    assert not list((tmp_path / "without").glob("*.pt"))
    assert res["best_val"] is not None
    assert json.loads((tmp_path / "without" / "results.json").read_text())["final"] is not None


@pytest.mark.parametrize("bad", ["trainer.precision=fp16", "trainer.checkpoints=maybe"])
def test_bad_precision_or_checkpoints_is_named(compose_cfg, bad):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        validate(compose_cfg([bad]))


def test_configs_from_before_the_new_keys_are_no_difference(compose_cfg):
    new = dict(OmegaConf.to_container(compose_cfg([]), resolve=True))
    old = {**new, "trainer": {k: v for k, v in new["trainer"].items()
                              if f"trainer.{k}" not in ADDED_DEFAULTS}}
    assert config_differences(old, new) == {}
    changed = {**new, "trainer": {**new["trainer"], "precision": "bf16"}}
    assert config_differences(old, changed) == {"trainer.precision": ["fp32", "bf16"]}


def test_device_statistics_accumulate_in_place_and_keep_their_order():
    """Tensor values go into one persistent [sum, count] tensor per key (what a replayed CUDA
    graph adds into); pop_stats reads, zeroes in place, and keeps the first-recorded order."""
    from lpmetrics.objectives.base import Objective
    obj = Objective()
    obj.record(a=torch.tensor(1.0), b=2.0)
    obj.record_where(torch.tensor(False), c=torch.tensor(5.0))
    obj.record(a=torch.tensor(3.0), b=4.0)
    acc = obj._stat_device["a"]
    assert obj.pop_stats() == {"a": 2.0, "b": 3.0}           # c: recorded in no batch
    assert obj._stat_device["a"] is acc and not acc.any()    # same tensor, zeroed
    obj.record_where(torch.tensor(True), c=torch.tensor(5.0))
    obj.record(a=torch.tensor(0.5))
    assert list(obj.pop_stats().items()) == [("a", 0.5), ("c", 5.0)]


def test_an_auc_lp_config_from_before_pair_layout_resumes(compose_cfg):
    new = OmegaConf.to_container(compose_cfg(["objective=auc_lp"]), resolve=True)
    old = {**new, "objective": {k: v for k, v in new["objective"].items() if k != "pair_layout"}}
    assert config_differences(old, new) == {}
    checkpoints_off = {**new, "trainer": {**new["trainer"], "checkpoints": False}}
    assert config_differences(new, checkpoints_off) == {}   # allowed on resume
