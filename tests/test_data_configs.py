"""configs/dataset/*.yaml: the keys build_data reads, a WHY comment per default, Hydra composition."""
from __future__ import annotations

import re

import pytest
from hydra.utils import get_method
from omegaconf import OmegaConf

from lpmetrics.data import build_data
from tests.test_data_helpers import CONFIGS

NAMES = ["digits", "cifar10", "cifar100", "stl10", "catdog", "synthetic", "svmlight"]
TABULAR = {"digits", "synthetic", "svmlight"}
KEYS = {"name", "root", "download", "task", "neg_keep", "drop_rate", "val_size", "augment",
        "groups", "cache_dir", "source"}


@pytest.mark.parametrize("name", NAMES)
def test_dataset_config_has_the_keys_and_comments(name):
    text = (CONFIGS / f"{name}.yaml").read_text()
    cfg = OmegaConf.load(CONFIGS / f"{name}.yaml")
    assert KEYS <= set(cfg.keys()) and cfg.name == name
    assert callable(get_method(cfg.source._target_))
    model = {"synthetic": "synthetic_student"}.get(name, "mlp" if name in TABULAR else "resnet18")
    assert f"override /model@_global_.model: {model}" in text
    for line in text.splitlines():  # nanoGPT habit: every top-level default says why
        if re.match(r"^[a-z_]+: \S", line) and not line.startswith("source:"):
            assert "#" in line, f"{name}.yaml: no comment on {line!r}"


@pytest.mark.parametrize("name", NAMES)
def test_dataset_composes_with_the_root_config(name):
    if not (CONFIGS.parent / "config.yaml").is_file():
        pytest.skip("configs/config.yaml not written yet")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS.parent), version_base="1.3"):
        cfg = compose("config", overrides=[f"dataset={name}"])
        forced = compose("config", overrides=[f"dataset={name}", "model=mlp"])
    assert cfg.dataset.name == name
    assert cfg.model._target_.endswith("MLP") == (name in TABULAR)
    assert forced.model._target_.endswith("MLP")  # a command-line model= wins


def test_composed_default_config_builds():
    if not (CONFIGS.parent / "config.yaml").is_file():
        pytest.skip("configs/config.yaml not written yet")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS.parent), version_base="1.3"):
        cfg = compose("config", overrides=["dataset=digits", "dataset.neg_keep=0.2"])
    bundle = build_data(cfg.dataset, seed=0)
    assert bundle.name == "digits" and round(bundle.stats["train"]["pos_fraction"], 2) == 0.83
