"""The API reference builds from the source with warnings as errors (``make docs``).

mkdocstrings' griffe reads the code without importing it, so the build is a second proof that the
public surface reads from source: a docstring that does not parse, a cross-reference to a name
that moved, a page naming a module that is gone, each fails the build. Skipped where mkdocs is not
installed (it is pinned in requirements.txt).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings_handlers.python")

ROOT = Path(__file__).resolve().parents[1]
#: what the reference must show: each public module's names (an entry, ``id="...AUCLoss"``) and
#: the front door's links to them (``href="...#...AUCLoss"``)
PUBLIC = {
    "index.html": ["AUCLoss", "AUCMuLoss", "F1LPLoss", "CrossEntropy", "NMFLayer", "solve_lp", "LPLayer",
                   "LPSolution"],
    "objectives/index.html": ["AUCLoss", "AUCMuLoss", "AUCOneVsAllLoss", "F1LPLoss", "CrossEntropy", "NMFLayer"],
    "solver/index.html": ["solve_lp", "LPLayer", "LPSolution", "SolverOptions", "LPSolverError", "LPInputError"],
    "metrics/index.html": ["evaluate", "MetricError"],
}


def test_the_api_reference_builds_strict_and_shows_the_public_surface(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert not re.search(r"^WARNING", done.stderr, re.M), done.stderr[-4000:]
    for page, names in PUBLIC.items():
        html = (site / page).read_text()
        missing = [n for n in names if not re.search(rf'(id="|href="[^"#]*#)([\w.]*\.)?{n}"', html)]
        assert not missing, f"{page} lacks {missing}"
