"""The import layers of ``.importlinter`` hold, and the checker catches a module that breaks them.

grimp (import-linter's graph) finds a package's modules under the package's folder only; this
checkout's subpackages live beside ``lpmetrics/`` (``pyproject.toml`` maps them), so each check
runs on a *view*: a temporary folder holding a copy of ``lpmetrics/``'s own modules and, for each
name in :data:`lpmetrics.SUBPACKAGES`, a link ``lpmetrics/<name>`` to the repository's folder. Its
``__init__`` finds no ``pyproject.toml`` beside it, so it adds nothing to its ``__path__``: the
view is the package exactly as a wheel lays it out.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import lpmetrics

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".importlinter"
LINT = Path(sys.executable).with_name("lint-imports")


def make_view(folder: Path, extra: dict[str, str] | None = None) -> Path:
    """The package under ``folder`` (own modules copied, subpackages linked); ``extra`` maps a
    module file inside a subpackage (``"solver/_offender.py"``) to its source: that subpackage
    becomes a folder of links to the repository's files, plus the extra file."""
    package = folder / "lpmetrics"
    package.mkdir(parents=True)
    for own in (ROOT / "lpmetrics").glob("*.py"):
        (package / own.name).write_text(own.read_text())
    added = {Path(path).parts[0]: (Path(path).name, source) for path, source in (extra or {}).items()}
    for name in lpmetrics.SUBPACKAGES:
        if name not in added:
            (package / name).symlink_to(ROOT / name, target_is_directory=True)
            continue
        (package / name).mkdir()
        for entry in (ROOT / name).iterdir():
            if entry.name != "__pycache__":
                (package / name / entry.name).symlink_to(entry)
        filename, source = added[name]
        (package / name / filename).write_text(source)
    return folder


def lint(view: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(view)}
    return subprocess.run([str(LINT), "--no-cache", str(CONFIG)], cwd=view, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_package_keeps_its_import_contracts(tmp_path):
    result = lint(make_view(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_view_holds_every_module_of_the_package(tmp_path):
    """The check sees the whole package: every ``.py`` file of every subpackage is in the graph
    (a view grimp could not walk would pass every contract vacuously)."""
    view = make_view(tmp_path)
    script = ("import grimp; g = grimp.build_graph('lpmetrics', cache_dir=None); "
              "print('\\n'.join(sorted(g.modules)))")
    out = subprocess.run([sys.executable, "-c", script], cwd=view, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(view)}, timeout=120, check=True).stdout.split()
    expected = {f"lpmetrics.{name}" for name in lpmetrics.SUBPACKAGES}
    for name in lpmetrics.SUBPACKAGES:
        expected |= {f"lpmetrics.{name}.{p.stem}" for p in (ROOT / name).glob("*.py") if p.stem != "__init__"}
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
    result = lint(make_view(tmp_path, {path: source}))
    module = "lpmetrics." + path.removesuffix(".py").replace("/", ".")
    assert result.returncode != 0, result.stdout
    report = result.stdout.partition("Broken contracts")[2]
    assert contract in report and module in report, result.stdout
