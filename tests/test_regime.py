"""configs/regime/: every table experiment composes in the paper's regime (no augmentation, no L2,
per-image standardisation, as the authors' and Liu et al.'s public code), whatever the objective
brings as its optimizer; regime=augmented is our recipe, the single-run defaults; PPD-AdaGrad's
delta is its authors' 0.5."""
from __future__ import annotations

from pathlib import Path

import pytest

from scripts.campaign.jobs import composer

ROOT = Path(__file__).resolve().parents[1]

TABLES = ("table1_binary", "table_eps", "table_f1", "table2_multiclass")


@pytest.fixture(scope="module")
def compose():
    with composer() as c:
        yield c


@pytest.mark.parametrize("experiment", TABLES)
@pytest.mark.parametrize("objective", ["ce", "auc_lp", "ppd_sg", "ppd_adagrad"])
def test_every_table_is_in_the_papers_regime(compose, experiment, objective):
    cfg = compose([f"objective={objective}", "dataset=cifar10"], experiment)
    assert (cfg.dataset.augment, cfg.dataset.normalize, cfg.optimizer.weight_decay) == (False, "per_image", 0.0)
    assert cfg.trainer.batch_size == 64 and cfg.trainer.max_steps == 40000 and cfg.model.cifar_stem is False


@pytest.mark.parametrize("objective", ["ce", "ppd_sg"])
def test_the_augmented_arm_is_our_single_run_recipe(compose, objective):
    arm = compose([f"objective={objective}", "regime=augmented", "dataset=cifar10"], "table1_binary")
    alone = compose([f"objective={objective}", "dataset=cifar10"])
    for key in ("augment", "normalize", "crop_padding"):
        assert arm.dataset[key] == alone.dataset[key]
    assert arm.optimizer.weight_decay == alone.optimizer.weight_decay == 5e-4
    assert arm.dataset.augment is True and arm.dataset.normalize == "per_channel"


def test_single_runs_keep_their_defaults(compose):
    cfg = compose(["dataset=cifar10"])
    assert (cfg.dataset.augment, cfg.dataset.normalize, cfg.optimizer.weight_decay) == (True, "per_channel", 5e-4)


def test_ppd_adagrad_delta_is_its_authors(compose):
    from lpmetrics.baselines.ppd_optim import PPDAdaGrad
    assert compose(["objective=ppd_adagrad"]).optimizer.delta == 0.5
    import torch
    assert PPDAdaGrad([torch.nn.Parameter(torch.zeros(1))]).param_groups[0]["delta"] == 0.5
