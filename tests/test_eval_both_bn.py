"""Every evaluation scores test in both BatchNorm modes (evaluation.evaluate): the run's own
``trainer.eval_bn`` columns unchanged, the other mode's beside them (``test_bntrain_*``: each
test batch of ``trainer.bntrain_batch_size`` = 32 normalised by its own statistics, as the
authors' binary_auc.py evaluates; ``test_bneval_*`` for an ``eval_bn=train`` run), in train.py's
and the packed launcher's run folders alike, without moving the training trajectory; and
``make_tables.py --bn train`` reads them.

Digits with a small MLP that has a BatchNorm layer (the project's MLP has none, so its two
modes would agree); oracles: the model of ``last.pt`` run by hand (``model.train()`` in batches
of 32 in predict's fixed shuffled order, or ``model.eval()`` on the whole split) and scikit-learn.
"""
from __future__ import annotations

import copy
import csv
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from sklearn.metrics import accuracy_score, roc_auc_score
from torch import nn

from lpmetrics.data import build_data
from lpmetrics.packed.launch import Job, train_packed
from lpmetrics.run import evaluation, loop
from lpmetrics.run import job as run_job
from lpmetrics.run import runfolder
from lpmetrics.run.builders import build_model
from lpmetrics.run.rng import rng_state

from scripts.campaign import queue as campaign_queue
from scripts.tables import make_tables

ROOT = Path(__file__).resolve().parents[1]
BN_MLP = [f"model._target_={__name__}.bn_mlp", "model.hidden=[16]"]
SHORT = ["dataset=digits", *BN_MLP, "trainer.max_steps=20", "trainer.eval_every=10",
         "trainer.batch_size=32", "device=cpu", "logger=csv", "optimizer.lr=0.1"]
AUTHORS_BATCH = 32   # binary_auc.py: batch_size = 32, the config's trainer.bntrain_batch_size


def bn_mlp(num_classes: int, input_shape, hidden=(16,), dropout: float = 0.0) -> nn.Module:
    """``Flatten -> [Linear -> BatchNorm -> ReLU -> Dropout] * len(hidden) -> Linear``."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = int(np.prod(input_shape))
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.BatchNorm1d(int(h)), nn.ReLU()]
        layers += [nn.Dropout(dropout)] if dropout else []
        width = int(h)
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


def composed(overrides):
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def last_model(cfg, run_dir: Path):
    """The model of ``run_dir/last.pt`` (the weights of its final evaluation) and the data."""
    bundle = build_data(cfg.dataset, seed=cfg.seed)
    model = build_model(cfg, bundle)
    model.load_state_dict(torch.load(run_dir / "last.pt", weights_only=False)["model"])
    return model, bundle


def oracle(model: nn.Module, split, bn: str, batch: int = AUTHORS_BATCH) -> dict[str, float]:
    """AUC and accuracy of ``split`` by hand: ``train`` = ``model.train()`` (per-batch BatchNorm
    statistics) in batches of ``batch`` taken in predict's order (a seed-0 permutation: the splits
    are stored sorted by label), ``eval`` = ``model.eval()`` on the whole split at once."""
    x, y = split.features, np.asarray(split.labels)
    net = copy.deepcopy(model)
    with torch.no_grad():
        if bn == "eval":
            logits = net.eval()(x)
        else:
            net.train()
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
            assert len(x) % batch != 1   # predict would fold a lone last sample into the batch before
            logits = torch.empty(len(x), 2)
            for idx in order.split(batch):
                logits[idx] = net(x[idx])
    margin = (logits[:, 1] - logits[:, 0]).double().numpy()
    return {"auc": roc_auc_score(y, margin), "acc": accuracy_score(y, margin > 0)}


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """One train.py run with the default trainer.eval_bn=eval."""
    run_dir = tmp_path_factory.mktemp("eval_run")
    cfg = composed(SHORT)
    return cfg, run_dir, loop.train(cfg, run_dir, choices={"objective": "ce", "dataset": "digits"})


def test_train_py_records_the_bn_train_test_metrics_beside_its_own(eval_run):
    cfg, run_dir, results = eval_run
    assert cfg.trainer.eval_bn == "eval" and cfg.trainer.bntrain_batch_size == AUTHORS_BATCH
    table = rows(run_dir)
    own = [k for k in table[0] if k.startswith("test_") and not k.startswith("test_bn")]
    assert set(own) == {"test_auc", "test_ap", "test_f1", "test_acc", "test_mcc", "test_jaccard", "test_eer"}
    assert [k for k in table[0] if k.startswith("test_bn")] == [f"test_bntrain_{k[5:]}" for k in own]
    assert not [k for k in table[0] if k.startswith("val_bn")]   # test only: val is what selects
    assert all(row[k] != "" for row in table for k in table[0] if k.startswith("test_"))
    final = {k: float(v) for k, v in table[-1].items() if k.startswith("test_")}
    model, bundle = last_model(cfg, run_dir)
    by_hand = {"eval": oracle(model, bundle.test, "eval"), "train": oracle(model, bundle.test, "train")}
    for metric in ("auc", "acc"):
        assert final[f"test_{metric}"] == pytest.approx(by_hand["eval"][metric], abs=1e-12)
        assert final[f"test_bntrain_{metric}"] == pytest.approx(by_hand["train"][metric], abs=1e-12)
    assert abs(final["test_auc"] - final["test_bntrain_auc"]) > 1e-4   # the modes do differ here
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert on_disk["final"]["test_bntrain_auc"] == final["test_bntrain_auc"]
    assert "test_bntrain_auc" in on_disk["best_val"]


def test_an_eval_bn_train_run_records_the_eval_mode_metrics_beside_its_own(tmp_path):
    """Its own columns are the BN-train evaluation in batches of trainer.eval_batch_size (as
    before); the extra ones are eval mode, named test_bneval_*."""
    cfg = composed([*SHORT, "trainer.max_steps=10", "trainer.eval_bn=train", "trainer.eval_batch_size=20"])
    loop.train(cfg, tmp_path)
    final = {k: float(v) for k, v in rows(tmp_path)[-1].items() if k.startswith("test_")}
    assert "test_bneval_auc" in final and not any(k.startswith("test_bntrain") for k in final)
    model, bundle = last_model(cfg, tmp_path)
    assert final["test_auc"] == pytest.approx(oracle(model, bundle.test, "train", batch=20)["auc"], abs=1e-12)
    assert final["test_bneval_auc"] == pytest.approx(oracle(model, bundle.test, "eval")["auc"], abs=1e-12)


def test_evaluate_leaves_the_model_its_mode_and_every_rng_untouched(eval_run):
    cfg, run_dir, _ = eval_run
    model, bundle = last_model(cfg, run_dir)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = rng_state()
    metrics = evaluation.evaluate(model, bundle, "test", cfg, torch.device("cpu"))
    assert "bntrain_auc" in metrics and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())   # running stats too
    after = rng_state()
    assert torch.equal(rng["torch"], after["torch"]) and rng["python"] == after["python"]
    assert all(np.array_equal(a, b) for a, b in zip(rng["numpy"], after["numpy"]))


def own_mode_only(model, bundle, split, cfg, device, predict_fn=None):
    """evaluation.evaluate before it scored the other mode: the run's own columns only."""
    return evaluation._scored(predict_fn or evaluation.predict, model, bundle, split, device, cfg.trainer.eval_bn,
                         cfg.trainer.eval_batch_size)


def assert_same_trajectory(with_extra: Path, without: Path) -> None:
    """Same rows (every column the run without the extra evaluation has), weights, running
    statistics, optimizer state and RNG state at the end."""
    a, b = rows(with_extra), rows(without)
    assert [{k: r[k] for k in b[0]} for r in a] == b
    assert any(k.startswith("test_bntrain_") for k in a[0]) and not any(k.startswith("test_bn") for k in b[0])
    ca, cb = (torch.load(d / "last.pt", weights_only=False) for d in (with_extra, without))
    assert ca["model"].keys() == cb["model"].keys()
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    assert torch.equal(ca["rng"]["torch"], cb["rng"]["torch"])
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert all(torch.equal(sa[i]["momentum_buffer"], sb[i]["momentum_buffer"]) for i in sb)


def test_the_extra_evaluation_leaves_train_py_s_trajectory_bit_identical(tmp_path, monkeypatch):
    """Dropout draws from the global torch RNG every step, so an evaluation that moved it would
    change every later step."""
    cfg = composed([*SHORT, "model.dropout=0.3", "trainer.eval_every=5"])
    loop.train(cfg, tmp_path / "with")
    monkeypatch.setattr(run_job, "evaluate", own_mode_only)
    loop.train(cfg, tmp_path / "without")
    assert_same_trajectory(tmp_path / "with", tmp_path / "without")


def test_packed_launcher_records_both_modes_and_keeps_its_trajectory(tmp_path, monkeypatch):
    """Two runs in one pack: each run's extra columns match the oracle on its last.pt, and the
    pack trains what it trains without them (the evaluation runs on each run's view of the
    packed storage: a BN-train evaluation that wrote running statistics would show here)."""
    cfgs = [composed([*SHORT, "trainer.max_steps=6", "trainer.eval_every=3", f"seed={s}"]) for s in (0, 1)]
    outcomes = train_packed([Job(c, tmp_path / "with" / f"s{i}", name=f"s{i}") for i, c in enumerate(cfgs)])
    assert all(o["packed"]["size"] == 2 and o["diverged"] is None for o in outcomes)
    for i, cfg in enumerate(cfgs):
        run_dir = tmp_path / "with" / f"s{i}"
        final = rows(run_dir)[-1]
        assert final["step"] == "6" and outcomes[i]["final"]["test_bntrain_auc"] == float(final["test_bntrain_auc"])
        model, bundle = last_model(cfg, run_dir)
        assert float(final["test_bntrain_auc"]) == pytest.approx(oracle(model, bundle.test, "train")["auc"], abs=1e-12)
        assert float(final["test_auc"]) == pytest.approx(oracle(model, bundle.test, "eval")["auc"], abs=1e-12)
    monkeypatch.setattr(run_job, "evaluate", own_mode_only)
    train_packed([Job(c, tmp_path / "without" / f"s{i}", name=f"s{i}") for i, c in enumerate(cfgs)])
    for i in range(2):
        assert_same_trajectory(tmp_path / "with" / f"s{i}", tmp_path / "without" / f"s{i}")


def test_the_batch_key_is_an_evaluation_setting_not_a_protocol():
    """trainer.bntrain_batch_size changes neither make_tables.protocol nor the campaign queue's
    config_sha (committed run folders and queue entries keep theirs), and a resume of a run
    made before the key accepts it."""
    config = campaign_queue.composed_config(composed(["experiment=table1_binary", "objective=ce", "seed=0"]))
    assert config["trainer"]["bntrain_batch_size"] == AUTHORS_BATCH
    before = copy.deepcopy(config)
    del before["trainer"]["bntrain_batch_size"]
    other = copy.deepcopy(config)
    other["trainer"]["bntrain_batch_size"] = 64
    assert make_tables.protocol(before) == make_tables.protocol(config) == make_tables.protocol(other)
    assert campaign_queue.config_sha(before) == campaign_queue.config_sha(config) == campaign_queue.config_sha(other)
    assert runfolder.config_differences(before, other) == {}


def test_make_tables_bn_train_renders_the_recorded_bn_train_numbers(eval_run, tmp_path, capsys):
    """Default: the run's own (eval-mode) test metric, as ever; --bn train: its test_bntrain
    column; a run folder from before the extra columns is n/a under --bn train (never its
    eval-mode number in their place), and a cell with both says how many of each."""
    _, run_dir, results = eval_run
    new = tmp_path / "new"
    shutil.copytree(run_dir, new, ignore=shutil.ignore_patterns("*.pt"))
    res = json.loads((new / "results.json").read_text())
    old = tmp_path / "old"   # the same run as an older code version would have written it
    shutil.copytree(new, old)
    old_res = json.loads((old / "results.json").read_text())
    for row in (old_res["final"], old_res["best_val"]):
        for k in [k for k in row if k.startswith("test_bntrain_")]:
            del row[k]
    old_res["config"]["seed"] = 1
    del old_res["config"]["trainer"]["bntrain_batch_size"]
    (old / "results.json").write_text(json.dumps(old_res))
    keep = [k for k in rows(old)[0] if not k.startswith("test_bntrain_")]
    with open(old / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keep, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows(new))

    def cell(*args) -> str:
        make_tables.main([*map(str, args), "--table", "binary", "--no-queue"])
        out = capsys.readouterr()
        return next(line for line in out.out.splitlines() if line.startswith("| ce")), out.err

    eval_mode, train_mode = (100 * res["final"][k] for k in ("test_auc", "test_bntrain_auc"))
    assert cell(new)[0] == f"| ce | {eval_mode:.1f} (n=1) |"
    assert cell(new, "--bn", "train")[0] == f"| ce | {train_mode:.1f} (n=1) |"
    assert cell(new, "--bn", "train", "--select", "best-val")[0] == \
        f"| ce | {100 * res['best_val']['test_bntrain_auc']:.1f} (n=1) |"
    assert cell(old, "--bn", "train")[0] == "| ce | n/a (1 run unrecorded) |"
    line, err = cell(new, old, "--bn", "train")
    assert line == f"| ce | {train_mode:.1f} (n=1, 1 n/a) |"
    assert "n/a, no test_bntrain_auc recorded" in err and str(old) in err
    assert cell(new, old)[0] == f"| ce | {eval_mode:.1f} ± 0.0 (n=2) |"   # both have the eval number
