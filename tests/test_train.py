"""Smoke, resume and failure-path tests of train.py through Hydra's compose API (digits, CPU)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from lpmetrics.errors import ConfigError
from lpmetrics.objectives.base import Objective
from lpmetrics.run import loop
from lpmetrics.run.guards import NonFiniteLossError

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["dataset=digits", "model=mlp", "trainer.max_steps=20", "trainer.eval_every=10",
         "trainer.batch_size=32", "device=cpu", "logger=csv"]


def test_smoke_run_writes_the_run_folder(compose_cfg, tmp_path):
    cfg = compose_cfg(SHORT + ["dataset.neg_keep=0.2"])
    results = loop.train(cfg, tmp_path)
    rows = pd.read_csv(tmp_path / "metrics.csv")
    assert list(rows["step"]) == [10, 20]
    for key in ("val_auc", "test_auc", "val_acc", "train_loss"):
        assert rows[key].notna().all()
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["final"]["step"] == 20 and on_disk["primary_metric"] == "auc"
    assert set(on_disk["timing_ms_median"]) >= {"data", "forward", "loss", "backward", "step"}
    stats = on_disk["splits"]["train"]
    assert abs(stats["pos_fraction"] - stats["class_counts"][1] / sum(stats["class_counts"])) < 1e-9
    assert stats["pos_fraction"] > 0.75  # neg_keep=0.2 on balanced digits -> ~83 % positives
    assert on_disk["config"]["trainer"]["max_steps"] == 20
    assert (tmp_path / "last.pt").exists() and (tmp_path / "best.pt").exists()
    assert results["final"] == on_disk["final"]


def test_multiclass_smoke(compose_cfg, tmp_path):
    cfg = compose_cfg(SHORT + ["dataset.task=multiclass", "dataset.drop_rate=0.6"])
    results = loop.train(cfg, tmp_path)
    assert results["primary_metric"] == "auc_mu"
    assert 0.0 <= results["final"]["val_auc_mu"] <= 1.0


def test_kill_and_resume_equals_uninterrupted(compose_cfg, tmp_path):
    full = loop.train(compose_cfg(SHORT), tmp_path / "full")
    loop.train(compose_cfg([*SHORT, "trainer.max_steps=10"]), tmp_path / "split")
    resumed = loop.train(compose_cfg([*SHORT, "resume=true"]), tmp_path / "split")
    assert resumed["final"]["val_auc"] == full["final"]["val_auc"]
    assert resumed["final"]["train_loss"] == full["final"]["train_loss"]
    a = torch.load(tmp_path / "full" / "last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "split" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_without_checkpoint_says_what_to_do(compose_cfg, tmp_path):
    with pytest.raises(FileNotFoundError, match="hydra.run.dir"):
        loop.train(compose_cfg([*SHORT, "resume=true"]), tmp_path)


def test_init_from_starts_from_another_runs_weights(compose_cfg, tmp_path):
    loop.train(compose_cfg([*SHORT, "trainer.max_steps=10"]), tmp_path / "ce")
    ckpt = torch.load(tmp_path / "ce" / "last.pt", weights_only=False)
    cfg = compose_cfg([*SHORT, "objective=f1_lp", f"trainer.init_from={tmp_path / 'ce' / 'last.pt'}",
                       "trainer.max_steps=1", "optimizer.lr=0.0"])
    loop.train(cfg, tmp_path / "f1")
    after = torch.load(tmp_path / "f1" / "last.pt", weights_only=False)
    for key, value in ckpt["model"].items():   # lr 0: one step leaves the loaded weights
        if value.is_floating_point() and "running" not in key:
            assert torch.equal(after["model"][key], value), key
    assert after["step"] == 1
    with pytest.raises(ConfigError, match=r"trainer.init_from=/nonexistent/last.pt does not exist"):
        loop.train(compose_cfg([*SHORT, "trainer.init_from=/nonexistent/last.pt"]), tmp_path / "x")
    assert not (tmp_path / "x").exists()   # refused before anything was built or written


class ExplodingLoss(Objective):
    """Turns NaN on the first step: the trainer must stop and say where."""

    def forward(self, logits, labels):
        return logits.sum() * float("nan")


def test_nan_loss_stops_with_step_and_batch_statistics(compose_cfg, tmp_path):
    cfg = compose_cfg([*SHORT, "objective._target_=tests.test_train.ExplodingLoss",
                       "~objective.label_smoothing"])
    with pytest.raises(NonFiniteLossError, match=r"step 1; labels per class"):
        loop.train(cfg, tmp_path)


def test_hydra_multirun_runs_both_jobs(tmp_path):
    cmd = [sys.executable, "train.py", "-m", "optimizer.lr=0.1,0.01", "trainer.max_steps=20",
           "trainer.eval_every=10", "dataset=digits", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(tmp_path.glob("*/results.json"))
    assert len(results) == 2
    lrs = sorted(json.loads(p.read_text())["config"]["optimizer"]["lr"] for p in results)
    assert lrs == [0.01, 0.1]


def test_wandb_logger_offline(compose_cfg, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_cfg([*SHORT, "trainer.max_steps=10", "logger=wandb", "logger.mode=offline"])
    loop.train(cfg, tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


OBJECTIVES = sorted(p.stem for p in (ROOT / "configs" / "objective").glob("*.yaml"))


@pytest.mark.parametrize("name", OBJECTIVES)
def test_every_objective_trains_through_train_py_on_digits(compose_cfg, tmp_path, name):
    task = "multiclass" if name.startswith(("auc_mu", "auc_ova")) else "binary"
    cfg = compose_cfg([f"objective={name}", "dataset=digits", f"dataset.task={task}",
                       "trainer.max_steps=6", "trainer.eval_every=6", "trainer.batch_size=32",
                       "device=cpu"])
    results = loop.train(cfg, tmp_path)
    assert results["final"]["step"] == 6 and math.isfinite(results["final"]["train_loss"])
