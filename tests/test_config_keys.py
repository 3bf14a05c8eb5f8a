"""Every default lives in ``configs/``: the code reads config keys with no fallback, so every key it
reads must be in every composed config.

The keys are :data:`lpmetrics.run.validate.REQUIRED` (top level, ``trainer``, ``scheduler``, and
``dataset``: :data:`lpmetrics.data.build.KEYS`, plus ``IMAGE_KEYS`` for image sources). Two checks
keep that list honest: a scan of the run layer, the packed launcher, the data builder and the entry
points for the keys they name, which must all be listed; and compositions of every experiment x
regime x objective x dataset, each of which must carry every listed key. The default suite
composes a covering subset (one composition per objective x dataset, in which every pair of
choices occurs); the full product (3,360 compositions) runs under ``-m slow``. Every combination
composes: an experiment that picks its own dataset or objective gives way to the command line.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from lpmetrics.data.build import IMAGE_KEYS, KEYS
from lpmetrics.run.validate import REQUIRED, missing_keys

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
#: what reads the config: the run layer, the packed launcher, the data builder, the entry points
READERS = [*(ROOT / "run").glob("*.py"), *(ROOT / "packed").glob("*.py"), ROOT / "data" / "build.py",
           ROOT / "train.py", ROOT / "eval.py"]
#: attributes of objects that share a group's name (an lr scheduler, a dataset), not config keys
NOT_KEYS = {"get", "step", "state_dict", "load_state_dict", "batch"}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


EXPERIMENTS, REGIMES = [None, *options("experiment")], [None, *options("regime")]
OBJECTIVES, DATASETS = options("objective"), options("dataset")


def overrides(experiment, regime, objective, dataset) -> list[str]:
    return ([f"experiment={experiment}"] if experiment else []) + ([f"regime={regime}"] if regime else []) \
        + [f"objective={objective}", f"dataset={dataset}"]


def absent(cfg) -> list[str]:
    """The keys the code reads that ``cfg`` lacks."""
    image = str(OmegaConf.select(cfg, "dataset.source._target_")).startswith("lpmetrics.data.images.")
    return missing_keys(cfg) + [f"dataset.{k}" for k in IMAGE_KEYS if image and k not in cfg.dataset]


@pytest.fixture(scope="module")
def composed():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        yield lambda combo: compose(config_name="config", overrides=overrides(*combo))
    GlobalHydra.instance().clear()


def check(composed, combos) -> None:
    problems = {}
    for combo in combos:
        missing = absent(composed(combo))
        if missing:
            problems[" ".join(overrides(*combo))] = missing
    assert not problems, f"compositions that lack keys the code reads: {problems}"


def test_the_listed_keys_are_the_keys_the_code_reads():
    """Every ``trainer.X`` / ``scheduler.X`` / ``dataset.X`` the readers name (code or docstring),
    and every ``cfg["X"]`` of the data builder, is a listed key."""
    listed = {group: set(keys) for group, keys in REQUIRED.items()}
    listed["dataset"] |= set(IMAGE_KEYS)
    named = {}
    for path in READERS:
        text = path.read_text()
        for group, key in re.findall(r"\b(trainer|scheduler|dataset)\.([a-z_]+)\b", text):
            if key not in NOT_KEYS:
                named.setdefault(f"{group}.{key}", path.name)
    for key in re.findall(r'\bcfg\["([a-z_]+)"\]', (ROOT / "data" / "build.py").read_text()):
        named.setdefault(f"dataset.{key}", "build.py")
    unlisted = {k: where for k, where in named.items()
                if k.split(".", 1)[1] not in listed[k.split(".", 1)[0]]}
    assert not unlisted, f"keys read but not in run.validate.REQUIRED / data.build.KEYS: {unlisted}"
    assert set(KEYS) <= {k.split(".", 1)[1] for k in named if k.startswith("dataset.")}


def test_no_config_fallbacks_in_the_library():
    """No ``.get("key", fallback)`` on a config in the readers: each remaining one is on a
    checkpoint, a results row or another plain dict, and is listed here with its file."""
    allowed = {("loop.py", "side_stream_step"), ("prepare.py", "launches"), ("resume.py", "batch_stream"),
               ("guards.py", "degenerate_batches")}
    found = {(path.name, key) for path in READERS
             for key in re.findall(r'\.get\("([a-z_]+)", ', path.read_text())}
    assert found <= allowed, f"config fallbacks restating a default: {sorted(found - allowed)}"


def covering() -> list[tuple]:
    """One composition per objective x dataset, the experiment and the regime cycling so that every
    pair of choices (experiment x objective, regime x dataset, experiment x regime, ...) occurs."""
    return [(EXPERIMENTS[i % len(EXPERIMENTS)], REGIMES[(i // 2) % len(REGIMES)], o, d)
            for i, (o, d) in enumerate(itertools.product(OBJECTIVES, DATASETS))]


def test_the_covering_set_has_every_pair():
    rows = covering()
    for a, b in itertools.combinations(range(4), 2):
        choices = (EXPERIMENTS, REGIMES, OBJECTIVES, DATASETS)
        assert {(r[a], r[b]) for r in rows} == set(itertools.product(choices[a], choices[b]))


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_pair_of_choices_composes_every_key(composed, dataset):
    check(composed, [combo for combo in covering() if combo[3] == dataset])


@pytest.mark.slow
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_objective_dataset_and_regime_composes_every_key(composed, experiment):
    check(composed, itertools.product([experiment], REGIMES, OBJECTIVES, DATASETS))


def test_a_deleted_key_is_named_before_anything_is_built(composed):
    from lpmetrics.errors import ConfigError
    from lpmetrics.run.validate import validate
    cfg = compose(config_name="config", overrides=["~trainer.eval_bn", "~dataset.split"])
    with pytest.raises(ConfigError, match=r"trainer\.eval_bn, dataset\.split are missing"):
        validate(cfg)


def test_an_old_config_gets_the_added_keys_where_its_group_takes_them(composed):
    """The one upgrade step (:func:`lpmetrics.run.upgrade.upgrade_config`): each key an older run's
    config lacks comes back at its ADDED_DEFAULTS value, where the group takes it; the rest stays."""
    from lpmetrics.run.upgrade import ADDED_DEFAULTS, upgrade_config
    for objective, dataset in (("ce", "digits"), ("auc_lp", "cifar10")):
        today = OmegaConf.to_container(composed((None, None, objective, dataset)), resolve=True)
        old = OmegaConf.create(today)
        for dotted in ADDED_DEFAULTS:
            group, key = dotted.rsplit(".", 1)
            old[group].pop(key, None)
        old.objective._target_ = old.objective._target_.removeprefix("lpmetrics.")
        upgraded = OmegaConf.to_container(upgrade_config(old))
        assert missing_keys(OmegaConf.create(upgraded)) == []
        takes = {"ce": {"objective.pair_layout": False}, "auc_lp": {"objective.pair_layout": True}}[objective]
        takes["model.conv_impl"] = dataset != "digits"   # an MLP has no convolutions
        for dotted, value in ADDED_DEFAULTS.items():
            group, key = dotted.rsplit(".", 1)
            assert upgraded[group].get(key, "<absent>") == (value if takes.get(dotted, True) else "<absent>"), dotted
        assert upgraded["objective"]["_target_"] == today["objective"]["_target_"]
        assert {k: v for k, v in upgraded["dataset"].items() if k not in ("split", "normalize")} == \
            {k: v for k, v in today["dataset"].items() if k not in ("split", "normalize")}
