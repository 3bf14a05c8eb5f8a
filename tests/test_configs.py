"""Every option of every config group composes, and every component instantiates."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from builders import instantiate_runtime

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


RUNTIME = {"num_classes": 2, "input_shape": [3, 32, 32], "pos_ratio": 0.8, "class_counts": [20, 80]}


@pytest.mark.parametrize("group", ["dataset", "model", "objective", "optimizer", "logger", "experiment"])
def test_every_option_composes(compose_cfg, group):
    assert options(group), f"configs/{group}/ is empty"
    for name in options(group):
        cfg = compose_cfg([f"{group}={name}"])
        OmegaConf.to_container(cfg.trainer, resolve=True)
        assert cfg.dataset.name and cfg.seed == 0


@pytest.mark.parametrize("name", options("objective"))
def test_every_objective_gives_a_finite_loss_and_its_optimizer_steps(compose_cfg, name):
    cfg = compose_cfg([f"objective={name}"])
    k = 3 if name.startswith(("auc_mu", "auc_ova")) else 2  # the multi-class LPs need 3 groups
    objective = instantiate_runtime(cfg.objective, **{**RUNTIME, "num_classes": k})
    torch.manual_seed(0)
    model = torch.nn.Linear(5, k)
    params = [{"params": list(model.parameters())}] + objective.extra_param_groups()
    optimizer = instantiate(cfg.optimizer, _partial_=True)(params=params)
    before = model.weight.detach().clone()
    loss = objective(model(torch.randn(24, 5)), torch.arange(24) % k)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    optimizer.step()
    assert not torch.equal(before, model.weight), f"{name}: the optimizer did not move the model"


def test_every_optimizer_is_used_by_some_objective(compose_cfg):
    used = {compose_cfg([f"objective={o}"]).optimizer._target_ for o in options("objective")}
    for name in options("optimizer"):
        assert compose_cfg([f"optimizer={name}"]).optimizer._target_ in used, name


@pytest.mark.parametrize("name", options("model"))
def test_every_model_instantiates(compose_cfg, name):
    model = instantiate_runtime(compose_cfg([f"model={name}"]).model, **RUNTIME)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 2)


def test_datasets_pick_their_model(compose_cfg):
    assert compose_cfg(["dataset=digits"]).model._target_ == "models.mlp.MLP"
    assert compose_cfg(["dataset=cifar10"]).model._target_ == "models.resnet.resnet18"
    assert compose_cfg(["dataset=cifar10", "model=mlp"]).model._target_ == "models.mlp.MLP"


def test_unknown_option_is_hydras_error(compose_cfg):
    with pytest.raises(ConfigCompositionException):
        compose_cfg(["objective=no_such_objective"])


def test_paper_defaults(compose_cfg):
    cfg = compose_cfg([])
    assert cfg.trainer.batch_size == 64 and cfg.trainer.max_steps == 40000
    assert cfg.optimizer.lr == 0.1 and cfg.optimizer.momentum == 0.9
    assert list(cfg.scheduler.milestones) == [2000, 10000, 25000]
    assert abs(cfg.scheduler.gamma - 1 / 3) < 1e-12
