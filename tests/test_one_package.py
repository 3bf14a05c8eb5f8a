"""One package that tools reading source can follow: ``lpmetrics.<sub>`` is a folder of files
(``lpmetrics/<sub>`` links to the repository's ``<sub>/``), so jedi (the engine behind most Python
editors) finds definitions with no import hook, from a file inside the checkout and from one
outside it that sees a built wheel; the old ``__path__`` extension's leaks are gone; a class has
one identity, because the bare folder names refuse to import."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

jedi = pytest.importorskip("jedi")

ROOT = Path(__file__).resolve().parents[1]
USER_CODE = ("from lpmetrics import AUCLoss, solve_lp\n"
             "import lpmetrics.run.loop\n"
             "AUCLoss\n"
             "solve_lp\n"
             "lpmetrics.run.loop.train\n")
#: (line, column) of each name in USER_CODE, and the file and name jedi must land on
WANTED = [((3, 2), "objectives/auc.py", "AUCLoss"), ((4, 2), "solver/", "solve_lp"),
          ((5, 22), "run/loop.py", "train")]


def definitions(where: Path, package_root: Path) -> list[tuple[str, str]]:
    """(file, name) jedi's goto gives for each name of USER_CODE written to ``where/user.py``,
    with ``package_root`` and this interpreter's site-packages on jedi's path and no code run."""
    user = where / "user.py"
    user.write_text(USER_CODE)
    site = [p for p in sys.path if p.endswith("site-packages")]
    project = jedi.Project(path=where, sys_path=[str(package_root), *site], added_sys_path=[])
    script = jedi.Script(USER_CODE, path=user, project=project,
                         environment=jedi.create_environment(sys.executable, safe=False))
    found = []
    for (line, col), _, _ in WANTED:
        hits = script.goto(line, col, follow_imports=True)
        found.append((str(hits[0].module_path), hits[0].name) if hits else ("", ""))
    return found


def check(found: list[tuple[str, str]], package_root: Path) -> None:
    for (path, name), (_, want_file, want_name) in zip(found, WANTED):
        assert name == want_name and path.startswith(str(package_root / "lpmetrics")) and want_file in path, \
            (path, name)


def test_jedi_follows_every_import_from_a_file_inside_the_checkout(tmp_path):
    where = ROOT / f".jedi_probe_{os.getpid()}"
    where.mkdir()
    try:
        check(definitions(where, ROOT), ROOT)
    finally:
        (where / "user.py").unlink(missing_ok=True)
        where.rmdir()


@pytest.fixture(scope="module")
def wheel_tree(tmp_path_factory) -> Path:
    """The built wheel, unpacked (the files a ``pip install`` would put in site-packages)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out)], check=True, capture_output=True, cwd=out, timeout=300)
    unpacked = out / "site"
    with zipfile.ZipFile(next(out.glob("lpmetrics-*.whl"))) as whl:
        whl.extractall(unpacked)
    assert not any(p.is_symlink() for p in unpacked.rglob("*")), "a wheel carries files, not links"
    return unpacked


def test_jedi_follows_every_import_from_a_file_outside_that_sees_the_wheel(tmp_path, wheel_tree):
    check(definitions(tmp_path, wheel_tree), wheel_tree)


def test_the_wheel_imports_outside_the_checkout(tmp_path, wheel_tree):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(wheel_tree)}
    code = ("import lpmetrics, lpmetrics.run.loop, lpmetrics.solver; from lpmetrics import AUCLoss; "
            "print(lpmetrics.solver.__file__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().startswith(str(wheel_tree)), done.stderr


@pytest.mark.parametrize("name", ["lpmetrics.scripts", "lpmetrics.tests", "lpmetrics.configs", "lpmetrics.results",
                                  "lpmetrics.docs", "lpmetrics.train", "lpmetrics.eval", "lpmetrics.lpmetrics"])
def test_nothing_but_the_subpackages_imports_under_lpmetrics(name):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


def test_a_class_has_one_identity_the_bare_folder_names_refuse():
    code = ("import sys; sys.path.insert(0, {root!r})\n"
            "import lpmetrics.objectives.auc\n"
            "for bare in ('objectives.auc', 'solver', 'data', 'run.loop', 'packed', 'models', 'metrics', 'baselines'):\n"
            "    try:\n"
            "        __import__(bare)\n"
            "    except ImportError as err:\n"
            "        assert 'import lpmetrics.' in str(err), err\n"
            "    else:\n"
            "        raise SystemExit(f'{{bare}} imported under its bare name')\n"
            "print('ok')").format(root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
