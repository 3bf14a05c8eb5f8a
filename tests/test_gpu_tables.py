"""scripts/gpu_tables.{sh,py}: the GPU-slot script, end to end on the CPU with a
few steps on digits, and its planner against hand-computed budgets."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.campaign import gpu_tables

ROOT = Path(__file__).resolve().parents[1]

SPEED = {"step_ms_per_run_ce": 1.0, "step_ms_per_run_auc_lp": 2.0, "step_ms_per_run_ppd_sg": 1.0,
         "step_ms_per_run_ppd_adagrad": 1.0, "eval_ms": 100.0}


def test_jobs_are_the_block_seed_major():
    specs = gpu_tables.job_specs("cifar10", seeds=[0, 1], lrs=[0.1, 0.01])
    assert len(specs) == 2 * 2 * 4 * 4 == len({s["name"] for s in specs})
    assert all("seed=0" in s["overrides"] for s in specs[:32]) and "seed=1" in specs[32]["overrides"]


def test_plan_keeps_the_prefix_that_fits_and_shortens_when_the_first_block_does_not():
    specs = gpu_tables.job_specs("cifar10", seeds=[0, 1, 2], lrs=[0.1])   # 48 jobs, 16 per seed
    # per run at 1000 steps, eval every 500: ce / ppd 1.0 s + 2 x 0.1 s, auc_lp 2.0 s + 0.2 s;
    # a block of 16 (4 levels x ce, auc_lp, ppd_sg, ppd_adagrad) costs 12 x 1.2 + 4 x 2.2 = 23.2 s
    p = gpu_tables.plan(specs, SPEED, budget_s=2 * 23.2 / gpu_tables.MARGIN + 0.5, steps=1000,
                        eval_every=500, block=16)
    assert p["steps"] == 1000 and p["shortened_because"] is None
    assert len(p["kept"]) == 32 and p["dropped"] == [s["name"] for s in specs[32:]]
    assert p["projected_s"] == pytest.approx(46.4)
    # 10 s (8 s available) cannot hold 16 runs of 1000 steps (23.2 s). At n steps they cost
    # 0.02 n + 1.6 ceil(n / 500) s: n = 320 costs exactly 8.0 s; evaluation every 320 steps then
    short = gpu_tables.plan(specs, SPEED, budget_s=10.0, steps=1000, eval_every=500, block=16)
    assert (short["steps"], short["eval_every"], len(short["kept"])) == (320, 320, 16)
    assert "do not fit at 1000 steps" in short["shortened_because"]
    # 80 s available: n = 3440 costs 68.8 + 11.2 = 80.0 s; two significant digits -> 3400
    longer = gpu_tables.plan(specs, SPEED, budget_s=100.0, steps=10000, eval_every=500, block=16)
    assert (longer["steps"], longer["eval_every"], len(longer["kept"])) == (3400, 500, 16)
    # whole seeds only: with two lrs a seed is 32 jobs; 1.5 seeds' budget keeps one seed, both lrs
    two_lrs = gpu_tables.job_specs("cifar10", seeds=[0, 1], lrs=[0.1, 0.01])
    one = gpu_tables.plan(two_lrs, SPEED, budget_s=1.5 * 46.4 / gpu_tables.MARGIN, steps=1000,
                          eval_every=500, block=32)
    assert one["kept"] == [s["name"] for s in two_lrs[:32]]
    # each job is priced at its own objective's rate
    slow_ppd = {**SPEED, "step_ms_per_run_ppd_adagrad": 3.0}
    assert gpu_tables.plan(specs, slow_ppd, budget_s=1e6, steps=1000, eval_every=500,
                           block=16)["projected_s"] == pytest.approx(3 * (23.2 + 4 * 2.0))


@pytest.mark.slow   # ~25 s idle; gpu_campaign.sh (the device command now) keeps a fast end-to-end test
def test_end_to_end_on_the_cpu_with_a_few_steps(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": sys.executable, "OMP_NUM_THREADS": "1",
           "BUDGET": "200", "STEPS": "6", "EVAL_EVERY": "3", "SEEDS": "0", "LRS": "0.1", "DEVICE": "cpu"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "campaign" / "gpu_tables.sh"), "digits"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_tables.log", "machine.txt", "plan.json",
                                                     "runs.jsonl.gz", "tables.md"]
    plan = json.loads((out / "plan.json").read_text())
    assert len(plan["kept"]) == 16 and plan["steps"] == 6 and plan["speed"]["step_ms_per_run_ce"] > 0
    with gzip.open(out / "runs.jsonl.gz", "rt") as f:
        assert len(f.readlines()) == 16
    runs = gpu_tables.unpack(out / "runs.jsonl.gz", tmp_path / "runs")
    res = json.loads((runs[0] / "results.json").read_text())
    assert res["final"]["step"] == 6 and res["packed"]["size"] >= 1 and res["batch_stream"]
    tables = (out / "tables.md").read_text()
    for objective in ("ce", "auc_lp", "ppd_sg", "ppd_adagrad"):
        assert f"| {objective} |" in tables
    assert "(n=1" in tables and "digits 0.1" in tables
