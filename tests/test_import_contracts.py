"""The import layers of ``.importlinter`` hold, and the checker catches a module that breaks them.

grimp (import-linter's graph) walks the package's folder; ``lpmetrics/<name>`` are committed links
to the repository's folders, so the contracts are checked on the real tree. The checker's own test
plants an offending module in a copy of the tree (the package folder, its links and the folders
they name, copied as they are), so no other test running at the same time sees it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lpmetrics

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".importlinter"
LINT = Path(sys.executable).with_name("lint-imports")


def copy_of_tree(folder: Path) -> Path:
    """The package as the checkout lays it out (``lpmetrics/`` with its links, the linked folders,
    ``.importlinter``), copied under ``folder``."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "lpmetrics", folder / "lpmetrics", symlinks=True, ignore=ignore)
    for name in lpmetrics.SUBPACKAGES:
        shutil.copytree(ROOT / name, folder / name, ignore=ignore)
    shutil.copy(CONFIG, folder / CONFIG.name)
    return folder


def lint(root: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache", str(root / CONFIG.name)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_package_keeps_its_import_contracts():
    result = lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_graph_holds_every_module_of_the_package():
    """The check sees the whole package: every ``.py`` file of every subpackage is in the graph
    (a tree grimp could not walk would pass every contract vacuously)."""
    script = ("import grimp; g = grimp.build_graph('lpmetrics', cache_dir=None); "
              "print('\\n'.join(sorted(g.modules)))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, check=True).stdout.split()
    expected = {f"lpmetrics.{name}" for name in lpmetrics.SUBPACKAGES}
    for name in lpmetrics.SUBPACKAGES:
        expected |= {"lpmetrics." + ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                     for p in (ROOT / name).rglob("*.py") if "__pycache__" not in p.parts}
    assert expected <= set(out), sorted(expected - set(out))


@pytest.mark.parametrize("path, source, contract", [
    # the solver importing the run layer: upward, and forbidden to the LP layer
    ("solver/_offender.py", "from lpmetrics.run import validate\n", "Layers"),
    # the solver reaching sideways into the metrics
    ("solver/_offender.py", "from lpmetrics import metrics\n", "The LP layer knows nothing"),
    # two components of one layer: objectives and data stay independent
    ("objectives/_offender.py", "from lpmetrics.data import build_data\n", "Layers"),
    # a baseline importing the run layer (what direct_loss once did for ConfigError)
    ("baselines/_offender.py", "from lpmetrics.run.validate import validate\n", "Layers"),
    # the packed launcher importing the train.py script
    ("packed/_offender.py", "import train\n", "never imports an entry script"),
])
def test_the_checker_catches_an_offending_import(tmp_path, path, source, contract):
    tree = copy_of_tree(tmp_path)
    (tree / path).write_text(source)
    result = lint(tree)
    module = "lpmetrics." + path.removesuffix(".py").replace("/", ".")
    assert result.returncode != 0, result.stdout
    report = result.stdout.partition("Broken contracts")[2]
    assert contract in report and module in report, result.stdout
