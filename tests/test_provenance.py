"""Every run's results.json names its code version and machine (issue 18, :mod:`provenance`)."""
from __future__ import annotations

import json
import subprocess

import pytest

import provenance
import train

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
    train.train(compose_cfg(SHORT), tmp_path)
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
    try:
        train.train(compose_cfg(SHORT), tmp_path)
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
    """The packed launcher writes results.json through train.Run.results: provenance included."""
    from packed.launch import Job, train_packed

    short = ["dataset=digits", "trainer.max_steps=2", "device=cpu", "trainer.checkpoints=false"]
    jobs = [Job(compose_cfg([*short, f"seed={s}"]), tmp_path / f"s{s}", name=f"s{s}") for s in (0, 1)]
    for job, out in zip(jobs, train_packed(jobs)):
        rec = json.loads((job.run_dir / "results.json").read_text())["provenance"]
        assert out["packed"]["size"] == 2 and set(rec) == set(provenance.KEYS)
        assert rec["device_name"] == provenance.cpu_model()
