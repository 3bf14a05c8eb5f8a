"""The installable core: ``lpmetrics`` from any directory, nothing generic in site-packages,
pyproject's package map complete, and old runs' ``_target_`` names still meaning the same code.

The subprocess tests use the interpreter running the suite from a temporary directory outside
the checkout and without ``PYTHONPATH``: they pass only where ``lpmetrics`` is installed
(``make install`` / ``pip install -e .``), which is what they check.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import lpmetrics
from lpmetrics.run.runfolder import config_differences
from lpmetrics.run.targets import LEGACY_ROOTS, package_target, short_target, upgrade_targets

from scripts.tables.make_tables import protocol

ROOT = Path(__file__).resolve().parents[1]


def run_outside(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -c code`` from ``cwd`` with the checkout off the path (as a user's project runs)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Use the loss in your own loop"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readmes_snippet_runs_from_a_directory_outside_the_checkout(tmp_path):
    done = run_outside(readme_snippet(), tmp_path)
    assert done.returncode == 0, f"not installed? run `make install` or `pip install -e .`\n{done.stderr}"
    loss, lp = done.stdout.strip().splitlines()
    assert 0.0 <= float(loss.split()[-1]) <= 1.0
    # the LP max z1 + z2 s.t. z1 + 2 z2 <= 4, 3 z1 + z2 <= 6 has both constraints active at
    # (8/5, 6/5); d(z1 + z2)/db = (1, 1) A^{-1} = (2/5, 1/5)
    assert lp == "z* = tensor([1.6000, 1.2000])  d(sum z*)/db = tensor([0.4000, 0.2000])"


def test_installing_adds_no_generic_top_level_name_and_a_users_data_package_wins(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("MINE = True\n")
    done = run_outside(
        "import sys, lpmetrics.objectives.auc, lpmetrics.data.build, lpmetrics.metrics, lpmetrics.run.builders\n"
        "generic = sorted(set(sys.modules) & {'solver', 'objectives', 'baselines', 'models', 'metrics', 'run', 'packed'})\n"
        "assert not generic, generic\n"
        "import data; assert data.MINE, data.__file__\n"
        "assert lpmetrics.data.build.__name__ == 'lpmetrics.data.build'\n"
        "print('ok')", tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_front_door_names_load_lazily_and_are_the_package_classes():
    from lpmetrics.objectives.auc import AUCLoss
    from lpmetrics.solver import solve_lp
    assert lpmetrics.AUCLoss is AUCLoss and lpmetrics.solve_lp is solve_lp
    assert set(lpmetrics.__all__) <= set(dir(lpmetrics))
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        lpmetrics.nonsense  # noqa: B018


def test_pyproject_lists_every_subpackage_and_each_is_a_committed_link():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = {"lpmetrics"}
    for sub in lpmetrics.SUBPACKAGES:
        link = ROOT / "lpmetrics" / sub
        assert link.is_symlink() and os.readlink(link) == f"../{sub}", f"lpmetrics/{sub} must link to ../{sub}"
        found |= {"lpmetrics." + ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / sub).rglob("__init__.py")
                  if "__pycache__" not in p.parts}
    assert set(packages) == found, f"pyproject.toml's packages: add {sorted(found - set(packages))}, " \
                                   f"drop {sorted(set(packages) - found)}"
    tracked = subprocess.run(["git", "ls-files", "-s", "lpmetrics"], cwd=ROOT, capture_output=True, text=True).stdout
    if tracked:   # a git checkout (a source tarball has no index): the links are committed as links
        modes = {line.split()[-1]: line.split()[0] for line in tracked.splitlines()}
        assert all(modes.get(f"lpmetrics/{sub}") == "120000" for sub in lpmetrics.SUBPACKAGES), modes


def configured_targets() -> set[str]:
    found = set()
    for path in (ROOT / "configs").rglob("*.yaml"):
        found |= set(re.findall(r"_target_:\s*([\w.]+)", path.read_text()))
    return found


def test_every_configured_target_is_in_the_package_and_round_trips():
    targets = configured_targets()
    assert len(targets) > 20
    for t in targets:
        if t.startswith(("torch.", "hydra_plugins.")):
            assert package_target(t) == t and short_target(t) == t
            continue
        assert t.startswith("lpmetrics."), t
        assert package_target(short_target(t)) == t
        assert short_target(t).split(".")[0] in LEGACY_ROOTS


@pytest.mark.parametrize("old, new", [
    ("objectives.auc.AUCLoss", "lpmetrics.objectives.auc.AUCLoss"),
    ("loggers.CSVLogger", "lpmetrics.run.loggers.CSVLogger"),
    ("data.tabular.digits", "lpmetrics.data.tabular.digits"),
    ("torch.optim.SGD", "torch.optim.SGD"),
    ("datasets.thing", "datasets.thing"),          # a root that only starts like a legacy one
])
def test_package_and_short_forms(old, new):
    assert package_target(old) == new and short_target(new) == old


def test_an_old_runs_config_upgrades_and_keeps_its_protocol_and_resume_identity(compose_cfg):
    from tests.test_legacy_run_folder import shorten   # every _target_ in the pre-package form
    new = OmegaConf.to_container(compose_cfg(["objective=auc_lp", "dataset=digits"]), resolve=True)
    old = shorten(new)
    assert old["objective"]["_target_"] == "objectives.auc.AUCLoss"
    assert protocol(old) == protocol(new)
    assert config_differences(old, new) == {}
    # a real difference is still one
    assert config_differences(old | {"seed": 5}, new) == {"seed": [5, new["seed"]]}

    cfg = OmegaConf.create(old | {"later": "???", "alias": "${objective._target_}"})
    upgrade_targets(cfg)
    assert cfg.objective._target_ == "lpmetrics.objectives.auc.AUCLoss"
    assert cfg.logger._target_.startswith("lpmetrics.run.loggers.")
    assert OmegaConf.is_missing(cfg, "later") and cfg.alias == cfg.objective._target_
