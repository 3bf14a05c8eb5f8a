"""Committed results name no machine's paths: run folders record paths relative to the run folder
or as the config spelled them (``${oc.env:DATA_ROOT,...}``), and READMEs / logs quote commands
with repository-relative paths."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from omegaconf import OmegaConf

from lpmetrics.run.runfolder import portable_config

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".json", ".csv", ".md", ".log", ".txt")
# an absolute path into a home, scratch or system folder (not part of a URL such as https://x/home/)
ABSOLUTE = re.compile(r"(?<![\w.:/~-])(/(?:work|root|home|tmp|Users|mnt|scratch|data|var|opt)/[^\s\"'`)]*)")


def committed_results() -> list[Path]:
    """The files of ``results/`` that git tracks (everything there when git is unavailable)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "results"], cwd=ROOT, capture_output=True,
                             check=True, timeout=60).stdout.decode()
        files = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in (ROOT / "results").rglob("*") if p.is_file()]
    return [p for p in files if p.suffix in SUFFIXES and p.is_file()]


def test_committed_results_hold_no_absolute_paths():
    found = []
    for path in committed_results():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{n}: {m}" for m in ABSOLUTE.findall(line)]
    assert not found, "absolute paths in committed results (record them relative to the run " \
                      "folder or as ${oc.env:DATA_ROOT}):\n" + "\n".join(found[:30])


def test_the_scan_finds_what_it_should():
    assert ABSOLUTE.findall('"root": "/work/shared/data",') == ["/work/shared/data"]
    assert ABSOLUTE.findall("--out /tmp/st2`") == ["/tmp/st2"]
    assert not ABSOLUTE.findall("see https://github.com/home/x and ../shared/data and ~/.cache")


def test_portable_config_keeps_spelled_interpolations_and_relativises_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_ROOT", "/work/shared/data")
    cfg = OmegaConf.create({"dataset": {"root": "${oc.env:DATA_ROOT,/somewhere}", "name": "x"},
                            "trainer": {"init_from": str(tmp_path / "ce" / "last.pt"),
                                        "max_steps": 3},
                            "lists": ["/home/u/a", "b"]})
    out = portable_config(cfg, tmp_path / "run")
    assert out["dataset"] == {"root": "${oc.env:DATA_ROOT,/somewhere}", "name": "x"}
    assert out["trainer"] == {"init_from": "../ce/last.pt", "max_steps": 3}
    assert out["lists"][1] == "b" and not out["lists"][0].startswith("/")


def test_train_records_portable_paths(compose_cfg, tmp_path, monkeypatch):
    from lpmetrics.run import loop
    monkeypatch.setenv("DATA_ROOT", str(tmp_path / "data"))
    cfg = compose_cfg(["dataset=digits", "model=mlp", "trainer.max_steps=2", "trainer.eval_every=2",
                       "trainer.batch_size=16", "device=cpu"])
    loop.train(cfg, tmp_path / "run")
    text = (tmp_path / "run" / "results.json").read_text()
    assert str(tmp_path) not in text and not ABSOLUTE.findall(text)
    assert json.loads(text)["config"]["dataset"]["root"].startswith("${oc.env:DATA_ROOT")
