"""A run folder made before the code became the ``lpmetrics`` package, and before the config keys
added since, still resumes and evaluates.

Such a folder differs from one made today only in its ``_target_`` names (``objectives.auc.AUCLoss``
where today's says ``lpmetrics.objectives.auc.AUCLoss``) and in the keys its config lacks (those of
``lpmetrics.run.upgrade.ADDED_DEFAULTS``, at the value they have by default), in
``.hydra/config.yaml``, in the checkpoints' stored config and Hydra files, and in ``results.json``:
checkpoints hold tensors and plain data only. So the test makes a short run with today's code,
"ages" a copy by rewriting exactly those names to the old form and deleting those keys, and checks
that resuming both copies writes the same ``metrics.csv`` rows and that ``eval.py`` (which reads
keys without fallbacks, after the one upgrade step) reports the same metrics on both. (Checked once
by hand on folders written by the code before the package existed, commit 69f386e: same outcome.)
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from lpmetrics.run.targets import short_target
from lpmetrics.run.upgrade import ADDED_DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["dataset=digits", "objective=auc_lp", "trainer.eval_every=10", "logger=csv"]
#: columns that measure time, not what was computed
TIMING = re.compile(r"(_ms|_s|_seconds|time)$")


def cli(*args: str, cwd: Path = ROOT) -> str:
    env = os.environ | {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def shorten(node):
    """Every ``_target_`` of a (JSON-like) tree in the form runs wrote before the package."""
    if isinstance(node, dict):
        return {k: short_target(v) if k == "_target_" else shorten(v) for k, v in node.items()}
    return [shorten(v) for v in node] if isinstance(node, list) else node


def without_added(config: dict) -> dict:
    """``config`` without the keys added since old runs were made (where they hold that value)."""
    for dotted, value in ADDED_DEFAULTS.items():
        group, key = dotted.rsplit(".", 1)
        if key in config.get(group, {}) and config[group][key] == value:
            del config[group][key]
    return config


def shorten_text(text: str) -> str:
    return re.sub(r"(_target_:\s*)([\w.]+)", lambda m: m.group(1) + short_target(m.group(2)), text)


def old_config_text(text: str) -> str:
    """A ``.hydra/config.yaml`` as an old run wrote it: old names, no added keys."""
    config = without_added(OmegaConf.to_container(OmegaConf.create(text)))
    return shorten_text(OmegaConf.to_yaml(OmegaConf.create(config)))


def age(folder: Path) -> None:
    for yaml in (folder / ".hydra").glob("*.yaml"):
        yaml.write_text((old_config_text if yaml.name == "config.yaml" else shorten_text)(yaml.read_text()))
    results = json.loads((folder / "results.json").read_text())
    results["config"] = without_added(results["config"])
    (folder / "results.json").write_text(json.dumps(shorten(results), indent=2))
    for ckpt_path in folder.glob("*.pt"):
        ckpt = torch.load(ckpt_path, weights_only=True)
        ckpt["config"] = shorten(without_added(ckpt["config"]))
        if "hydra_files" in ckpt:
            ckpt["hydra_files"] = {k: (old_config_text if k == "config.yaml" else shorten_text)(v)
                                   for k, v in ckpt["hydra_files"].items()}
        torch.save(ckpt, ckpt_path)


def rows(folder: Path) -> list[dict]:
    with open(folder / "metrics.csv") as f:
        return [{k: v for k, v in r.items() if not TIMING.search(k)} for r in csv.DictReader(f)]


def test_an_aged_run_folder_resumes_and_evaluates_like_todays(tmp_path):
    new, old = tmp_path / "new", tmp_path / "old"
    cli("train.py", *SHORT, "trainer.max_steps=20", f"hydra.run.dir={new}")
    shutil.copytree(new, old)
    age(old)
    assert "_target_: objectives.auc.AUCLoss" in (old / ".hydra" / "config.yaml").read_text()
    aged = torch.load(old / "last.pt", weights_only=True)["config"]
    assert aged["objective"]["_target_"] == "objectives.auc.AUCLoss"
    assert not {"eval_bn", "precision", "bntrain_batch_size"} & set(aged["trainer"])
    assert not {"split", "normalize"} & set(aged["dataset"]) and "stages" not in aged["scheduler"]

    for folder in (new, old):
        cli("train.py", *SHORT, "trainer.max_steps=30", "resume=true", f"hydra.run.dir={folder}")
    assert [r["step"] for r in rows(old)] == ["10", "20", "30"]
    assert rows(old) == rows(new)
    # the resumed folder keeps the names it was made with (its own Hydra files are put back)
    assert "_target_: objectives.auc.AUCLoss" in (old / ".hydra" / "config.yaml").read_text()

    reports = [json.loads(cli("eval.py", str(folder))) for folder in (new, old)]
    assert reports[0] == reports[1] and 0.5 < reports[0]["auc"] <= 1.0
