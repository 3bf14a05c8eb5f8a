"""Every option of every config group composes, and every component instantiates."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lpmetrics.run.builders import instantiate_runtime

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


MODEL_NEEDS = {"synthetic_student": ["dataset=synthetic"]}  # reads the teacher's widths from the dataset


@pytest.mark.parametrize("name", options("model"))
def test_every_model_instantiates(compose_cfg, name):
    model = instantiate_runtime(compose_cfg([f"model={name}", *MODEL_NEEDS.get(name, [])]).model, **RUNTIME)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 2)


def test_datasets_pick_their_model(compose_cfg):
    assert compose_cfg(["dataset=digits"]).model._target_ == "lpmetrics.models.mlp.MLP"
    assert compose_cfg(["dataset=cifar10"]).model._target_ == "lpmetrics.models.resnet.resnet18"
    assert compose_cfg(["dataset=cifar10", "model=mlp"]).model._target_ == "lpmetrics.models.mlp.MLP"


def test_unknown_option_is_hydras_error(compose_cfg):
    with pytest.raises(ConfigCompositionException):
        compose_cfg(["objective=no_such_objective"])


def test_paper_defaults(compose_cfg):
    cfg = compose_cfg([])
    assert cfg.trainer.batch_size == 64 and cfg.trainer.max_steps == 40000
    assert cfg.optimizer.lr == 0.1 and cfg.optimizer.momentum == 0.9
    assert list(cfg.scheduler.milestones) == [2000, 10000, 25000]
    assert abs(cfg.scheduler.gamma - 1 / 3) < 1e-12 and cfg.scheduler.stages is None


# --- the paper's tables as multiruns (configs/experiment/table*.yaml) ---------------------------

TABLES = [name for name in options("experiment") if name.startswith("table")]
DOCUMENTED = re.compile(r"^#\s+python train\.py -m (experiment=\S+.*?)\s+#.*=\s*(\d+) runs", re.M)


def sweep_jobs(experiment_overrides: list[str]) -> list[list[str]]:
    """The jobs Hydra's basic sweeper launches for ``python train.py -m <overrides>``: the
    experiment's ``hydra.sweeper.params`` extended by the command line (which replaces an axis)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = GlobalHydra.instance().config_loader().load_configuration(
            "config", overrides=list(experiment_overrides), run_mode=RunMode.MULTIRUN)
    GlobalHydra.instance().clear()
    params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()]
    parsed = OverridesParser.create().parse_overrides(params + experiment_overrides)
    return [job for chunk in BasicSweeper.split_arguments(parsed, None) for job in chunk]


def documented_commands(name: str) -> list[tuple[list[str], int]]:
    text = (CONFIGS / "experiment" / f"{name}.yaml").read_text()
    commands = [(m.group(1).split(), int(m.group(2))) for m in DOCUMENTED.finditer(text)]
    assert commands, f"configs/experiment/{name}.yaml documents no 'python train.py -m ... = N runs'"
    undocumented = [line for line in text.splitlines()
                    if "python train.py -m" in line and not DOCUMENTED.match(line)]
    assert not undocumented, f"{name}: commands without a run count: {undocumented}"
    return commands


@pytest.mark.parametrize("name", TABLES)
def test_table_multirun_expands_to_the_documented_job_count(name):
    for overrides, runs in documented_commands(name):
        jobs = sweep_jobs(overrides)
        assert len(jobs) == runs, f"`python train.py -m {' '.join(overrides)}` launches {len(jobs)} jobs, documented {runs}"
        assert len({tuple(sorted(j)) for j in jobs}) == len(jobs)


@pytest.mark.parametrize("name", TABLES)
def test_table_sweeps_the_papers_lr_grid_and_several_seeds(name):
    jobs = sweep_jobs([f"experiment={name}"])
    values = lambda key: {o.split("=", 1)[1] for j in jobs for o in j if o.startswith(key + "=")}  # noqa: E731
    # the lr grid of Meng et al., ICLR 2021 version, §4
    assert {float(v) for v in values("optimizer.lr")} == {0.1, 0.01, 0.001}
    assert values("seed") == {"0", "1", "2"}  # our choice; the paper ran one seed


@pytest.mark.parametrize("name", TABLES)
def test_every_table_job_composes_and_gets_its_swept_lr(compose_cfg, name):
    """One composition per distinct group choice (dataset x objective) of the full sweep, at the
    smallest lr of the grid: the swept lr must win over an objective's own optimizer.lr."""
    jobs = sweep_jobs([f"experiment={name}"])
    groups = {tuple(o for o in job if o.split("=")[0] in ("dataset", "objective")) for job in jobs}
    for choice in sorted(groups):
        cfg = compose_cfg([f"experiment={name}", *choice, "optimizer.lr=0.001", "seed=1"])
        OmegaConf.to_container(cfg.trainer, resolve=True)
        OmegaConf.to_container(cfg.objective, resolve=True)
        assert cfg.optimizer.lr == 0.001, (name, choice)
        assert cfg.trainer.max_steps == 40000 and cfg.trainer.batch_size == 64, (name, choice)
        picked = dict(o.split("=") for o in choice)
        if "dataset" in picked:
            assert cfg.dataset.name == picked["dataset"], (name, choice)
        if "objective" in picked:
            alone = compose_cfg([f"objective={picked['objective']}"]).objective
            assert cfg.objective._target_ == alone._target_, (name, choice)


def test_table_datasets_and_levels_are_the_papers(compose_cfg):
    def axis(name, key):
        return {o.split("=", 1)[1] for j in sweep_jobs([f"experiment={name}"]) for o in j if o.startswith(key + "=")}
    assert axis("table1_binary", "dataset") == {"catdog", "cifar10", "cifar100", "stl10"}
    assert {float(v) for v in axis("table1_binary", "dataset.neg_keep")} == {0.1, 0.2, 0.4, 1.0}
    assert axis("table2_multiclass", "dataset") == {"stl10", "cifar100"}
    assert {float(v) for v in axis("table2_multiclass", "dataset.drop_rate")} == {0.9, 0.8, 0.6, 0.0}
    assert compose_cfg(["experiment=table2_multiclass"]).dataset.task == "multiclass"
    assert axis("table_f1", "dataset") == {"catdog", "cifar10", "cifar100", "stl10"}
    eps = compose_cfg(["experiment=table_eps"])
    assert eps.dataset.name == "catdog" and eps.objective._target_ == "lpmetrics.objectives.auc.AUCLoss"
    assert {float(v) for v in axis("table_eps", "objective.epsilon")} == {0.1, 0.01, 0.001}
