"""scripts/campaign/submit.py: ``python -m scripts.campaign submit`` hands the wanted runs to submitit, one job per
pack (submitit's real local executor here, SLURM on a cluster); each job writes what a GPU window
returns, so ``fold`` takes it unchanged and the tables equal those of ``python -m scripts.campaign run``; a queue
whose configs no longer compose is refused before anything is submitted."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from scripts.campaign import cli as campaign
from scripts.campaign import fold as campaign_fold
from scripts.campaign import queue as campaign_queue
from scripts.campaign import submit as campaign_submit
from scripts.tables import make_tables

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("submitit")

STEPS = 6
SECTION = campaign_queue.Section(
    ("binary",), "table1_binary", {"dataset.neg_keep": ["0.1"], "dataset": ["digits"], "seed": ["0"],
                                   "optimizer.lr": ["0.1"], "objective": ["ce", "auc_lp", "f1_cvxpy"]}, block=3)
EXTRA = ("model=mlp", f"trainer.max_steps={STEPS}")
COMMON = ["--device", "cpu", "--eval-every", "3"]


@pytest.fixture(scope="module")
def queue_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("campaign")
    campaign_queue.write_json(d / "queue.json", campaign_queue.build((SECTION,), extra=EXTRA, log=lambda m: None))
    return d


def copy_of(queue_dir: Path, into: Path) -> Path:
    into.mkdir(parents=True)
    (into / "queue.json").write_bytes((queue_dir / "queue.json").read_bytes())
    return into


def table(folder: Path, capsys) -> str:
    make_tables.main([str(folder), "--table", "binary", "--lr-rule", "none"])
    return capsys.readouterr().out


def test_submit_local_trains_folds_and_gives_the_tables_of_run(queue_dir, tmp_path, capsys):
    queue = json.loads((queue_dir / "queue.json").read_text())
    assert [e["runs_on"] for e in queue["entries"]] == ["device", "device", "host"]
    out = tmp_path / "jobs"
    assert campaign.main(["--dir", str(queue_dir), "submit", "--out", str(out), "--executor", "local",
                          "--max-pack", "1", "--wait", *COMMON]) == 0
    said = capsys.readouterr().out
    assert "left digits_nk0.1_f1_cvxpy_lr0.1_s0: runs on the host" in said
    jobs = sorted(p for p in out.iterdir() if p.name != "logs")
    assert len(jobs) == 2 and all(sorted(q.name for q in j.iterdir() if q.is_file()) == ["plan.json", "runs.jsonl.gz"]
                                  for j in jobs)
    plans = [json.loads((j / "plan.json").read_text()) for j in jobs]
    assert [p["kept"] for p in plans] == [["digits_nk0.1_ce_lr0.1_s0"], ["digits_nk0.1_auc_lp_lr0.1_s0"]]
    assert all(set(p["outcome"].values()) == {f"done at step {STEPS}"} for p in plans)
    submitted = copy_of(queue_dir, tmp_path / "submitted")
    assert campaign_fold.fold(jobs, submitted, log=lambda m: None)["done"] == 2
    # the same queue through the device command
    returned = tmp_path / "returned"
    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps({"step_ms_per_run_ce": 1.0, "step_ms_per_run_auc_lp": 2.0, "eval_ms": 10.0}))
    assert campaign.main(["--dir", str(queue_dir), "run", "--out", str(returned), "--budget-s", "200",
                          "--speed", str(speed), *COMMON]) == 0
    ran = copy_of(queue_dir, tmp_path / "ran")
    assert campaign_fold.fold([returned], ran, log=lambda m: None)["done"] == 2
    capsys.readouterr()
    for key in ("digits_nk0.1_ce_lr0.1_s0", "digits_nk0.1_auc_lp_lr0.1_s0"):
        assert (submitted / "runs" / key / "metrics.csv").read_text() == (ran / "runs" / key / "metrics.csv").read_text()
    assert table(submitted, capsys) == table(ran, capsys)


def test_submit_refuses_a_queue_that_no_longer_composes(queue_dir, tmp_path, capsys):
    d = copy_of(queue_dir, tmp_path / "changed")
    queue = json.loads((d / "queue.json").read_text())
    queue["entries"][0]["config_sha"] = "0" * 16   # as if the configs changed since the queue was made
    (d / "queue.json").write_text(json.dumps(queue))
    out = tmp_path / "jobs"
    assert campaign.main(["--dir", str(d), "submit", "--out", str(out), "--executor", "local", *COMMON]) == 1
    said = capsys.readouterr().out
    assert "refused, nothing submitted" in said and "digits_nk0.1_ce_lr0.1_s0: composes to another protocol" in said
    assert not out.exists()


def test_packs_are_one_dataset_and_at_most_max_pack():
    def e(key, ds):
        return {"key": key, "where": {"dataset.name": ds}}
    packs = campaign_submit.packs_of([e("a", "x"), e("b", "x"), e("c", "x"), e("d", "y")], 2)
    assert [[x["key"] for x in p] for p in packs] == [["a", "b"], ["c"], ["d"]]
