"""``experiment=authors_protocol``: the authors' public code as one config.

Each setting is tested on its own (stage schedule, authors' split, per-image standardisation),
then the whole config trains through ``train.py``: on digits always (no packs needed), and on
CIFAR-10 when the packs are there (``data`` marker; skipped cleanly without them).
"""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from lpmetrics.data.datasets import ImageDataset, TabularDataset, per_image
from lpmetrics.data.errors import SplitError
from lpmetrics.data.splits import build_splits
from lpmetrics.run import loop, prepare
from lpmetrics.run.schedule import StageDecayLR, build_scheduler

CIFAR_TRAIN = np.repeat(np.arange(10), 5000)
CIFAR_TEST = np.repeat(np.arange(10), 1000)
SMALL = ["trainer.max_steps=8", "trainer.eval_every=4", "device=cpu", "logger=csv"]


def lrs_at(scheduler, optimizer, steps):
    """The lr that training step ``t`` (0-based, as ``train.py`` counts) uses, for each ``t``.
    (One ``optimizer.step()`` keeps torch's order check quiet; the lr does not depend on it.)"""
    out, last = {}, max(steps)
    optimizer.step()
    for t in range(last + 1):
        if t in steps:
            out[t] = optimizer.param_groups[0]["lr"]
        scheduler.step()
    return out


def test_the_experiment_sets_every_authors_setting(compose_cfg):
    cfg = compose_cfg(["experiment=authors_protocol"])
    assert cfg.dataset.name == "cifar10" and cfg.dataset.neg_keep == 0.1
    assert (cfg.dataset.split, cfg.dataset.normalize, cfg.dataset.augment) == ("authors", "per_image", False)
    assert cfg.optimizer.weight_decay == 0 and cfg.optimizer.momentum == 0.9
    assert (cfg.trainer.batch_size, cfg.trainer.eval_every) == (32, 400)
    assert (cfg.trainer.eval_bn, cfg.trainer.eval_batch_size) == ("train", 32)
    assert list(cfg.scheduler.milestones) == [] and dict(cfg.scheduler.stages) == {"first": 2000, "growth": 3}
    default = compose_cfg([])   # the defaults keep today's behaviour
    assert (default.dataset.split, default.dataset.normalize, default.scheduler.stages) == \
        ("paper", "per_channel", None)


def test_stage_schedule_drops_after_2k_8k_26k(compose_cfg):
    cfg = compose_cfg(["experiment=authors_protocol"])
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = build_scheduler(cfg.scheduler, opt)
    assert isinstance(sched, StageDecayLR)
    want = {0: 0.1, 1999: 0.1, 2000: 0.1 / 3, 7999: 0.1 / 3, 8000: 0.1 / 9, 25999: 0.1 / 9,
            26000: 0.1 / 27, 79999: 0.1 / 27, 80000: 0.1 / 81}
    for t, lr in want.items():   # the closed form at step t (stepping 80k times takes long under pytest)
        sched.last_epoch = t
        assert math.isclose(sched._get_closed_form_lr()[0], lr, rel_tol=1e-12), t
        assert sched.stages_done(t)[1] == (t in (2000, 8000, 26000, 80000))
    # what train.py does (one scheduler.step() per step) on the same schedule scaled 1/1000
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    got = lrs_at(StageDecayLR(opt, first=2, growth=3, gamma=1 / 3), opt, {1, 2, 7, 8, 25, 26, 79, 80})
    for t in got:
        assert math.isclose(got[t], want[1000 * (t + 1) - 1 if t % 2 else 1000 * t], rel_tol=1e-12), t


def test_stage_schedule_resumes_from_its_state_dict():
    def fresh():
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        return opt, StageDecayLR(opt, first=2, growth=3, gamma=0.5)

    opt, sched = fresh()
    full = lrs_at(sched, opt, set(range(30)))
    opt, sched = fresh()
    lrs_at(sched, opt, {0, 1, 2, 3, 4})            # 5 steps, then "checkpoint"
    state, opt_state = sched.state_dict(), opt.state_dict()
    opt2, sched2 = fresh()
    opt2.load_state_dict(opt_state)
    sched2.load_state_dict(state)
    rest = lrs_at(sched2, opt2, set(range(25)))
    assert [rest[t] for t in range(25)] == [full[t + 5] for t in range(25)]


def test_equal_stages_and_bad_stage_options():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    got = lrs_at(StageDecayLR(opt, first=3, growth=1, gamma=0.5), opt, set(range(10)))
    assert [got[t] for t in range(10)] == [1, 1, 1, .5, .5, .5, .25, .25, .25, .125]
    with pytest.raises(ValueError, match=r"scheduler.stages.first=0 must be an integer >= 1"):
        StageDecayLR(opt, first=0)
    with pytest.raises(ValueError, match=r"scheduler.stages.growth=0.5 must be a number >= 1"):
        StageDecayLR(opt, first=10, growth=0.5)


def test_authors_split_keeps_every_positive_and_the_first_k_negatives():
    s = build_splits(CIFAR_TRAIN, CIFAR_TEST, neg_keep=0.1, val_size=5000, seed=0, protocol="authors")
    y = CIFAR_TRAIN[s.train]
    assert len(s.val) == 0 and len(s.test) == 10000
    assert (y >= 5).sum() == 25000                  # every official train positive
    assert (y <= 4).sum() == 2500                   # the authors' 2,500 = int(25000 * 0.1)
    per_class = np.bincount(y[y <= 4], minlength=5)
    assert len(set(per_class.tolist())) > 1         # drawn from the pooled negatives, not per class
    again = build_splits(CIFAR_TRAIN, CIFAR_TEST, neg_keep=0.1, seed=0, protocol="authors")
    other = build_splits(CIFAR_TRAIN, CIFAR_TEST, neg_keep=0.1, seed=1, protocol="authors")
    assert np.array_equal(s.train, again.train) and not np.array_equal(s.train, other.train)
    # the paper protocol is untouched: a 5k hold-out, class-stratified thinning
    paper = build_splits(CIFAR_TRAIN, CIFAR_TEST, neg_keep=0.1, val_size=5000, seed=0)
    assert (len(paper.train), len(paper.val)) == (24750, 5000)


def test_authors_split_floors_the_count_and_thins_both_multiclass_groups():
    y = np.repeat(np.arange(9), 7)                  # groups of 21 samples
    s = build_splits(y, y, task="multiclass", drop_rate=0.5, seed=3, protocol="authors")
    groups = np.bincount(y[s.train] // 3, minlength=3)
    assert groups.tolist() == [10, 10, 21]          # int(21 * 0.5) = 10 of groups 0 and 1
    with pytest.raises(SplitError, match=r"dataset.split='holdout' must be one of paper, authors"):
        build_splits(y, y, protocol="holdout")


def test_per_image_is_tensorflows_standardisation():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 3, 4, 4), dtype=np.uint8)
    images[2] = 77                                  # a constant image: the 1/sqrt(N) floor
    x = images.astype(np.float64)
    n = x[0].size
    ref = np.stack([(im - im.mean()) / max(im.std(), 1 / np.sqrt(n)) for im in x])
    ds = ImageDataset(images, np.zeros(5), (0.5,) * 3, (0.2,) * 3, normalize="per_image")
    got, _ = ds.batch(torch.arange(5))
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-5)
    assert np.allclose(got[2].numpy(), 0.0)
    np.testing.assert_allclose(per_image(torch.from_numpy(x)).numpy(), ref, rtol=1e-12)
    tab = TabularDataset(x.reshape(5, -1), np.zeros(5), normalize="per_image")
    np.testing.assert_allclose(tab.features.numpy(), ref.reshape(5, -1), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"dataset.normalize='tf' must be one of per_channel, per_image"):
        ImageDataset(images, np.zeros(5), (0.5,) * 3, (0.2,) * 3, normalize="tf")


def _check_authors_run(run_dir, results, eval_steps):
    rows = pd.read_csv(run_dir / "metrics.csv")
    assert list(rows["step"]) == eval_steps
    assert not [c for c in rows.columns if c.startswith("val_")] and rows["test_auc"].notna().all()
    assert results["best_val"] is None and "no validation data" in results["val_split"]
    assert results["splits"]["val"]["n"] == 0
    assert not (run_dir / "best.pt").exists() and (run_dir / "last.pt").exists()
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert on_disk["config"]["dataset"]["split"] == "authors"
    return rows


def test_authors_protocol_trains_on_digits(compose_cfg, tmp_path):
    """The whole experiment through train.py without the packs: digits (8x8 images standardised
    per image), the authors' split, the stage schedule shrunk to stages of 2, 6, ... steps."""
    cfg = compose_cfg(["experiment=authors_protocol", "dataset=digits", *SMALL,
                       "scheduler.stages.first=2", "optimizer.lr=0.09"])
    results = loop.train(cfg, tmp_path)
    rows = _check_authors_run(tmp_path, results, [4, 8])
    assert np.allclose(rows["lr"], [0.03, 0.01])      # lr after steps 4 and 8: drops after 2 and 8
    counts = results["splits"]["train"]["class_counts"]
    bundle = prepare.build_data(compose_cfg(["dataset=digits", "dataset.split=authors"]).dataset, seed=0)
    assert counts[1] == bundle.stats["train"]["class_counts"][1]              # every positive kept
    assert counts[0] == int(bundle.stats["train"]["class_counts"][0] * 0.1)   # the first 10 % of negatives
    x = prepare.build_data(cfg.dataset, seed=0).train.features
    assert torch.allclose(x.mean(1), torch.zeros(len(x)), atol=1e-5)          # per_image: each row centred


def every_25th_test_image(build):
    """``build_data`` whose test split keeps every 25th image (400, all classes): one evaluation of
    the 10,000 at batch 32 takes minutes on a busy CPU, and evaluation is not what is tested."""
    def wrapped(cfg, seed):
        bundle = build(cfg, seed)
        test, keep = copy.copy(bundle.test), torch.arange(0, len(bundle.test), 25)
        test.images, test._y, test.labels = test.images[keep], test._y[keep], test.labels[keep.numpy()]
        bundle.test = test
        return bundle
    return wrapped


@pytest.mark.data
def test_authors_protocol_trains_on_cifar10(compose_cfg, tmp_path, data_root, monkeypatch):
    cfg = compose_cfg(["experiment=authors_protocol", f"dataset.root={data_root}",
                       "trainer.max_steps=3", "device=cpu", "logger=csv"])
    assert cfg.trainer.eval_every == 400    # the run is too short to reach it: evaluated at its end
    build = prepare.build_data
    x, _ = build(cfg.dataset, seed=0).train.batch(torch.arange(4))
    assert torch.allclose(x.mean((1, 2, 3)), torch.zeros(4), atol=1e-4)          # per_image
    assert torch.allclose(x.std((1, 2, 3), correction=0), torch.ones(4), atol=1e-4)
    monkeypatch.setattr(prepare, "build_data", every_25th_test_image(build))
    results = loop.train(cfg, tmp_path)
    _check_authors_run(tmp_path, results, [3])
    assert results["splits"]["train"]["class_counts"] == [2500, 25000]   # all positives, 2,500 negatives
    assert results["splits"]["test"]["n"] == 10000
