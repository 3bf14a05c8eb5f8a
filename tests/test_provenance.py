"""Every run's results.json names its code version and machine (:mod:`provenance`)."""
from __future__ import annotations

import json
import subprocess

import pytest

from lpmetrics.run import loop
from lpmetrics.run import provenance
from lpmetrics.run.job import Run

SHORT = ["dataset=digits", "model=mlp", "trainer.max_steps=4", "trainer.eval_every=4",
         "trainer.batch_size=32", "device=cpu", "logger=csv", "trainer.checkpoints=false"]


def _head() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(provenance.CODE_DIR), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def test_a_fresh_run_names_its_commit(compose_cfg, tmp_path):
    before = _head()
    if before is None:
        pytest.skip("the checkout is not a git repository here")
    provenance.code_version.cache_clear()   # read once per process: this test's run reads it
    loop.train(compose_cfg(SHORT), tmp_path)
    heads = {before, _head()}               # other sessions may commit while it runs
    rec = json.loads((tmp_path / "results.json").read_text())["provenance"]
    assert set(rec) == set(provenance.KEYS)
    assert rec["git_commit"] in heads and len(rec["git_commit"]) == 40
    assert isinstance(rec["git_dirty"], bool)
    assert rec["torch"] and rec["python"] and rec["cpu_count"] >= 1 and rec["device_name"]
    launches = json.loads((tmp_path / "results.json").read_text())["launches"]
    assert [la["git_commit"] for la in launches] == [rec["git_commit"]]   # each launch names its code


def test_outside_a_repository_the_version_is_unknown(tmp_path):
    provenance.code_version.cache_clear()
    try:
        rec = provenance.record("cpu", folder=tmp_path)   # tmp_path is in no repository
    finally:
        provenance.code_version.cache_clear()
    assert rec["git_commit"] == "unknown" and rec["git_dirty"] is None


def test_without_git_the_run_still_writes_unknown(compose_cfg, tmp_path, monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")   # what subprocess raises when the binary is missing

    provenance.code_version.cache_clear()
    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    monkeypatch.setattr(provenance, "STAMP", "no-such-stamp.json")   # a stamp left by a device call
    try:
        loop.train(compose_cfg(SHORT), tmp_path)
    finally:
        provenance.code_version.cache_clear()
    rec = json.loads((tmp_path / "results.json").read_text())["provenance"]
    assert rec["git_commit"] == "unknown" and rec["git_dirty"] is None


@pytest.mark.parametrize("status, dirty", [
    ("", False),
    ("?? results/new_study/\0?? outputs/2026-11-26/\0?? multirun/x/\0", False),
    ("?? scratch.py\0", True),
    (" M train.py\0", True),
    (" M results/README.md\0", True),          # a tracked file changed: dirty wherever it is
    ("R  new.py\0old.py\0", True),
])
def test_run_outputs_do_not_make_the_tree_dirty(status, dirty):
    assert provenance.is_dirty(status) is dirty


def test_packed_runs_record_it_too(compose_cfg, tmp_path):
    """The packed launcher writes results.json through Run.results: provenance included."""
    from lpmetrics.packed.launch import Job, train_packed

    short = ["dataset=digits", "trainer.max_steps=2", "device=cpu", "trainer.checkpoints=false"]
    jobs = [Job(compose_cfg([*short, f"seed={s}"]), tmp_path / f"s{s}", name=f"s{s}") for s in (0, 1)]
    for job, out in zip(jobs, train_packed(jobs)):
        rec = json.loads((job.run_dir / "results.json").read_text())["provenance"]
        assert out["packed"]["size"] == 2 and set(rec) == set(provenance.KEYS)
        assert rec["device_name"] == provenance.cpu_model()


def test_a_copy_without_git_names_its_commit_through_the_stamp(tmp_path, monkeypatch):
    """A lent GPU machine gets the tree without .git: the stamp written here travels with it."""
    provenance.code_version.cache_clear()
    saved = json.loads((_stamped_copy(tmp_path) / provenance.STAMP).read_text())
    try:
        rec = provenance.record("cpu", folder=tmp_path / "copy")
    finally:
        provenance.code_version.cache_clear()
    assert saved["git_commit"] == rec["git_commit"] != "unknown"
    assert rec["git_dirty"] == saved["git_dirty"] is False and saved["paths"] == ["a.py"]
    (tmp_path / "copy" / "a.py").write_text("x = 2\n")   # changed after the stamp: its commit, with changes
    try:
        assert provenance.code_version(tmp_path / "copy") == (saved["git_commit"], True)
    finally:
        provenance.code_version.cache_clear()
    (tmp_path / "copy" / provenance.STAMP).write_text("{not json")
    try:
        assert provenance.code_version(tmp_path / "copy") == ("unknown", None)
    finally:
        provenance.code_version.cache_clear()
    with pytest.raises(RuntimeError, match="not a git checkout"):
        provenance.stamp(tmp_path / "copy")


def _stamped_copy(tmp_path):
    """A one-commit repository at tmp_path/repo, stamped; its stamp copied to tmp_path/copy."""
    import shutil
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["add", "a.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    provenance.stamp(repo)
    (tmp_path / "copy").mkdir()
    shutil.copy(repo / provenance.STAMP, tmp_path / "copy" / provenance.STAMP)
    shutil.copy(repo / "a.py", tmp_path / "copy" / "a.py")
    return repo


def test_a_stale_git_copy_does_not_overrule_a_matching_stamp(tmp_path):
    """The device received a later commit's files with an older .git beside them (the first H100
    campaign window): the stamp, whose fingerprint the files match, names the code; once a file
    differs from the stamp, git answers again."""
    import shutil
    repo = _stamped_copy(tmp_path)
    old = tmp_path / "old"
    shutil.copytree(repo, old)   # its .git: the first commit
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    (repo / "a.py").write_text("x = 3\n")
    subprocess.run(git + ["commit", "-qam", "two"], check=True)
    saved = provenance.stamp(repo)
    shutil.copy(repo / "a.py", old / "a.py")                 # the new files ...
    shutil.copy(repo / provenance.STAMP, old / provenance.STAMP)   # ... and their stamp, beside the old .git
    provenance.code_version.cache_clear()
    try:
        assert provenance.code_version(old) == (saved["git_commit"], False)
        provenance.code_version.cache_clear()
        (old / "a.py").write_text("x = 4\n")
        commit, dirty = provenance.code_version(old)
        assert commit != saved["git_commit"] and dirty is True   # git's answer: the old commit, changed
    finally:
        provenance.code_version.cache_clear()


def test_a_stamp_left_behind_by_later_commits_does_not_overrule_git(tmp_path):
    """Stamp, then commit (the usual order here): the checkout has the stamped commit, so git
    answers (the new HEAD, clean), even though the files still match the stamp."""
    repo = _stamped_copy(tmp_path)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    (repo / "b.py").write_text("y = 1\n")
    provenance.stamp(repo)                       # dirty: b.py is new
    subprocess.run(git + ["add", "b.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "two"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    provenance.code_version.cache_clear()
    try:
        assert provenance.code_version(repo) == (head, False)
    finally:
        provenance.code_version.cache_clear()


def test_a_file_name_that_is_not_utf8_can_be_stamped(tmp_path):
    import os
    repo = _stamped_copy(tmp_path)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    name = os.fsdecode(b"odd\xff.py")
    (repo / name).write_text("z = 1\n")
    subprocess.run(git + ["add", name], check=True)
    subprocess.run(git + ["commit", "-qm", "odd"], check=True)
    saved = provenance.stamp(repo)
    assert saved["files"] == 2 and saved["git_dirty"] is False   # a.py and the odd name


def test_an_installed_copy_outside_a_checkout_names_no_commit(tmp_path, monkeypatch):
    """A wheel's ``site-packages/lpmetrics`` may sit inside someone's git project (a venv in it):
    without the checkout's ``pyproject.toml`` beside the code, git is not asked."""
    from lpmetrics.run import provenance as prov
    import subprocess
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    inner = tmp_path / "venv" / "site-packages"
    inner.mkdir(parents=True)
    monkeypatch.setattr(prov, "CODE_DIR", inner)
    assert prov.code_version(inner) == (prov.UNKNOWN, None)
