"""scripts/tables/snapshot_runs.sh: what a results folder keeps of a run that lives outside the repository
(metrics, results, config, evaluation lines, the last progress line), never a checkpoint."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fake_run(run: Path, finished: bool) -> None:
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.csv").write_text("step,val_auc\n500,0.7\n")
    for name in ("last.pt", "last.prev.pt", "best.pt"):
        (run / name).write_bytes(b"checkpoint")
    (run / "train.log").write_text(
        "train:   0%| 0/1000\rtrain:   1%| 10/1000\rtrain:  50%| 500/1000\n"
        "step=500 lr=0.1 val_auc=0.7\n[train] resuming from last.pt at step 500\n"
        "train:  60%| 600/1000\rtrain:  70%| 700/1000")
    if finished:
        (run / "results.json").write_text("{}")
        (run / "eval_test_bntrain.json").write_text(
            '{\n  "auc": 0.6,\n  "checkpoint": "%s",\n  "step": 5000\n}' % (run / "last.pt"))


def test_copies_the_small_files_and_never_a_checkpoint(tmp_path):
    src, dst = tmp_path / "runs", tmp_path / "results"
    fake_run(src / "a_s0", finished=True)
    fake_run(src / "b_s0", finished=False)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "tables" / "snapshot_runs.sh"), str(src), str(dst), "^a_"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["a_s0"]   # the name filter
    out = dst / "a_s0"
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "eval_test_bntrain.json", "evals.log",
                                                     "metrics.csv", "progress.txt", "results.json"]
    # the absolute checkpoint path of the evaluation is cut to <run>/<file>
    assert (out / "eval_test_bntrain.json").read_text() == \
        '{\n  "auc": 0.6,\n  "checkpoint": "a_s0/last.pt",\n  "step": 5000\n}'

    assert (out / "evals.log").read_text().splitlines() == ["step=500 lr=0.1 val_auc=0.7",
                                                            "[train] resuming from last.pt at step 500"]
    assert (out / "progress.txt").read_text() == "train:  70%| 700/1000\n"
    subprocess.run(["bash", str(ROOT / "scripts" / "tables" / "snapshot_runs.sh"), str(src), str(dst)], check=True,
                   capture_output=True)
    assert not (dst / "b_s0" / "results.json").exists() and not list(dst.rglob("*.pt"))
