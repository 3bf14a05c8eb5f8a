"""Every relative link and every command path the narrative docs name exists in the checkout.

Scanned: ``README.md``, ``docs/*.md``, ``scripts/README.md``, ``results/README.md`` and
``results/*/README.md`` (:data:`DOCS`). Checked in each:

- Markdown links ``[text](target)`` and reference definitions ``[id]: target`` that are not URLs:
  the target is a path relative to the file and must be a file or folder that git tracks (a figure
  a script produces counts only once it is committed); a ``#fragment`` must be the slug of a
  heading in the target (GitHub's rule: lower case, punctuation dropped, spaces to hyphens).
- ``python -m pkg.mod`` commands: the module is a ``.py`` file or a package folder of the
  checkout (:func:`module_file`); a name outside the checkout (``pytest``) must be importable.
- ``bash path.sh`` / ``sh path.sh`` / ``python path.py`` commands: the path exists, relative to the
  repository root (where every command in these files runs) or to the file.

Shell brace lists (``solver_fig_{blackbox,sketch}``) are expanded; placeholders in angle
brackets (``scripts/<folder>/<script>.sh``) are not paths and are skipped, and so is a command
that first changes into another checkout (``cd <clone at 89b6da9> && bash scripts/x.sh``: the
paths of that commit's tree). ``scripts/README.md``'s table of folders names each tool by its
file name inside its folder; those files must exist too.
"""
from __future__ import annotations

import importlib.util
import itertools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "lpmetrics"


def docs() -> list[Path]:
    """The files scanned, in a stable order."""
    files = [ROOT / "README.md", ROOT / "scripts" / "README.md", ROOT / "results" / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "results").glob("*/README.md"))
    return [f for f in files if f.is_file()]


def tracked() -> set[Path]:
    """Every file git tracks, and every folder above one (absolute paths); without git (an
    unpacked source archive) every path on disk counts as tracked."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {p for p in ROOT.rglob("*")}
    files = {ROOT / name for name in out.decode().split("\0") if name}
    return files | {parent for f in files for parent in f.parents}


FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
MODULE = re.compile(r"python3?\s+-m\s+([A-Za-z_][\w.{},<>]*)")
SCRIPT = re.compile(r"(?:^|[\s`(;&|])(?:bash|sh|python3?)\s+([\w./{},<>-]+\.(?:sh|py))\b")
#: a code span that first changes into another checkout (``cd <clone at 89b6da9> && ...``): its
#: paths are that checkout's, not this one's
FOREIGN = re.compile(r"`[^`]*\bcd\s+<[^`]*`")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")


def expand(text: str) -> list[str]:
    """Shell brace expansion of ``a_{x,y}_b`` (non-nested): ``["a_x_b", "a_y_b"]``."""
    parts = re.split(r"\{([^{}]*,[^{}]*)\}", text)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: inline markup and punctuation dropped (hyphens and
    underscores kept), lower case, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings (a repeated heading gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (links there are not links; commands are read from
    every line by :func:`commands`)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def links(text: str) -> list[str]:
    """The relative link targets of Markdown ``text`` (URLs, ``mailto:`` and in-page anchors left out)."""
    found = []
    for line in prose_lines(text):
        line = re.sub(r"``[^`]*``|`[^`]*`", "", line)   # code spans hold no links
        found += INLINE_LINK.findall(line)
        if m := REFERENCE.match(line):
            found.append(m.group(1))
    return [t for t in found if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def commands(text: str) -> tuple[list[str], list[str]]:
    """``(modules, scripts)`` named by ``python -m`` and ``bash`` / ``sh`` / ``python`` commands
    anywhere in ``text`` (prose, code spans and fenced blocks), braces expanded, placeholders out."""
    text = FOREIGN.sub("", text)
    modules = [m for raw in MODULE.findall(text) for m in expand(raw.rstrip("."))]
    scripts = [s for raw in SCRIPT.findall(text) for s in expand(raw)]
    return ([m for m in modules if "<" not in m and ">" not in m],
            [s for s in scripts if "<" not in s and ">" not in s])


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The file or package folder that ``python -m name`` runs from the repository root, None if
    there is none.

    ``lpmetrics.a.b`` is ``lpmetrics/a/b.py`` where the code lives under the package folder, and
    ``a/b.py`` at the root where the package maps its subpackages onto the root's folders (both
    are tried, so the check holds before and after such a move); any other name is a path from the
    root (``scripts.tables.make_tables``: ``scripts/tables/make_tables.py``)."""
    parts = name.split(".")
    bases = [root / Path(*parts)]
    if parts[0] == PACKAGE and len(parts) > 1:
        bases.append(root / Path(*parts[1:]))
    for base in bases:
        for candidate in (base.with_suffix(".py"), base / "__init__.py", base / "__main__.py"):
            if candidate.is_file():
                return candidate.parent if candidate.name in ("__init__.py", "__main__.py") else candidate
    return None


def in_checkout(name: str) -> bool:
    """Whether ``python -m name`` names something of this repository (its first part is a root
    folder or module, or the package)."""
    top = name.split(".")[0]
    return top == PACKAGE or (ROOT / top).is_dir() or (ROOT / f"{top}.py").is_file()


def broken_in(path: Path, files: set[Path], text: str | None = None) -> list[str]:
    """One line per broken link or command path of ``path`` (or of ``text`` read as if it were
    ``path``'s)."""
    rel = path.relative_to(ROOT)
    text = path.read_text() if text is None else text
    bad = []
    for target in links(text):
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if dest not in files:
            why = "not committed" if dest.exists() else "does not exist"
            bad.append(f"{rel}: link ({target}) -> {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} {why}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{rel}: link ({target}) -> no heading with anchor #{fragment} in "
                       f"{dest.relative_to(ROOT)}")
    modules, scripts = commands(text)
    for name in modules:
        if in_checkout(name):
            if module_file(name) is None:
                bad.append(f"{rel}: python -m {name} -> no module file in the checkout")
        elif importlib.util.find_spec(name.split(".")[0]) is None:
            bad.append(f"{rel}: python -m {name} -> not importable")
    for script in scripts:
        if not any((base / script).resolve() in files for base in (ROOT, path.parent)):
            bad.append(f"{rel}: script {script} -> not in the checkout")
    return bad


TABLE_ROW = re.compile(r"^\|\s*`([\w/.]+)`\s*\|(.*)\|\s*$")
FILE_NAME = re.compile(r"`([\w{},.-]+\.(?:py|sh|txt))`")


def scripts_table(readme: Path = ROOT / "scripts" / "README.md") -> list[str]:
    """The files ``scripts/README.md``'s folder table names: a row ``| `tables/` | ... `make_tables.py` ... |``
    names ``scripts/tables/make_tables.py``; a row of a file (``| `demo.py` |``) names that file;
    rows of a ``results/`` folder name that folder."""
    out = []
    for line in readme.read_text().splitlines():
        m = TABLE_ROW.match(line)
        if not m:
            continue
        first, rest = m.groups()
        if first.startswith("results/"):
            out.append(first.rstrip("/"))
        elif first.endswith("/"):
            out += [f"scripts/{first}{name}" for raw in FILE_NAME.findall(rest) for name in expand(raw)]
        else:
            out.append(f"scripts/{first}")
    return out


# ---- the resolver itself ---------------------------------------------------------------------

def test_module_resolver_reads_both_layouts(tmp_path):
    (tmp_path / "solver").mkdir()
    (tmp_path / "solver" / "__init__.py").write_text("")
    (tmp_path / "solver" / "newton.py").write_text("")
    (tmp_path / "scripts" / "tables").mkdir(parents=True)
    (tmp_path / "scripts" / "tables" / "make_tables.py").write_text("")
    assert module_file("lpmetrics.solver.newton", tmp_path) == tmp_path / "solver" / "newton.py"
    assert module_file("lpmetrics.solver", tmp_path) == tmp_path / "solver"
    assert module_file("scripts.tables.make_tables", tmp_path) == tmp_path / "scripts" / "tables" / "make_tables.py"
    assert module_file("lpmetrics.solver.gone", tmp_path) is None
    (tmp_path / "lpmetrics" / "packed").mkdir(parents=True)
    (tmp_path / "lpmetrics" / "packed" / "speed.py").write_text("")   # the code under the package
    assert module_file("lpmetrics.packed.speed", tmp_path) == tmp_path / "lpmetrics" / "packed" / "speed.py"


def test_the_scanner_finds_links_commands_and_anchors(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Results so far: `make_tables` (CPU)\n"
                   "See [x](a.md#b), ![fig](f.png), [web](https://e.org), [top](#c) and `[no](link.md)`.\n"
                   "[ref]: ../README.md\n"
                   "```\nbash scripts/<folder>/<script>.sh; python -m scripts.solver.fig_{a,b} --x\n"
                   "[not](a link.md)\n```\n"
                   "Run `RUNS=x bash scripts/studies/s.sh` and `python -m scripts.` then `python train.py`.\n")
    text = doc.read_text()
    assert links(text) == ["a.md#b", "f.png", "../README.md"]
    assert commands(text) == (["scripts.solver.fig_a", "scripts.solver.fig_b", "scripts"],
                             ["scripts/studies/s.sh", "train.py"])
    assert anchors(doc) == {"results-so-far-make_tables-cpu"}
    assert expand("x_{a,b}_{1,2}") == ["x_a_1", "x_a_2", "x_b_1", "x_b_2"]


def test_a_broken_link_anchor_module_and_script_are_each_reported(tmp_path):
    doc = ROOT / "docs" / "training.md"   # a real file, so that paths are read from docs/
    bad = broken_in(doc, tracked(), text="[a](nowhere.md) [b](../README.md#no-such-heading) "
                    "`python -m scripts.tables.gone` `python -m lpmetrics.solver.gone` "
                    "`bash scripts/gone.sh` `python -m no_such_module_anywhere`")
    assert [line.split(" -> ")[0] for line in bad] == [
        "docs/training.md: link (nowhere.md)", "docs/training.md: link (../README.md#no-such-heading)",
        "docs/training.md: python -m scripts.tables.gone", "docs/training.md: python -m lpmetrics.solver.gone",
        "docs/training.md: python -m no_such_module_anywhere", "docs/training.md: script scripts/gone.sh"]


# ---- the docs ---------------------------------------------------------------------------------

def test_every_file_the_scripts_readme_table_names_exists():
    files = tracked()
    named = scripts_table()
    assert len(named) > 40   # the table was read
    missing = [n for n in named if ROOT / n not in files]
    assert not missing, f"scripts/README.md names files that are not in the checkout: {missing}"


@pytest.mark.parametrize("path", docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_command_path_resolves(path):
    bad = broken_in(path, tracked())
    assert not bad, "broken:\n" + "\n".join(bad)
