"""scripts/campaign/cli.py: the device command end to end on the CPU (digits, a few
steps) folds back into run folders equal to train.py's; folding is idempotent and refuses another
queue version or protocol; plan reports what it skips; make_tables renders "pending"."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scripts.campaign import cli as campaign
from scripts.campaign import fold as campaign_fold
from scripts.campaign import queue as campaign_queue
from scripts.tables import make_tables
from scripts.campaign.jobs import compose_job, composer

ROOT = Path(__file__).resolve().parents[1]

STEPS = 6
# two runs of one (cell, seed) block and one that cannot compose
SECTION = campaign_queue.Section(
    ("binary",), "table1_binary", {"dataset.neg_keep": ["0.1"], "dataset": ["digits"], "seed": ["0"],
                                   "optimizer.lr": ["0.1"], "objective": ["ce", "auc_lp", "nope"]}, block=3)
EXTRA = ("model=mlp", f"trainer.max_steps={STEPS}")
DEVICE_SET = ["trainer.eval_every=3", "device=cpu", "logger=csv", "trainer.checkpoints=false"]
SPEED = {"step_ms_per_run_ce": 1.0, "step_ms_per_run_auc_lp": 2.0, "eval_ms": 10.0}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def queue_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("campaign")
    campaign_queue.write_json(d / "queue.json", campaign_queue.build((SECTION,), extra=EXTRA, log=lambda m: None))
    return d


@pytest.fixture(scope="module")
def returned(queue_dir, tmp_path_factory) -> Path:
    """``python -m scripts.campaign run`` on the CPU (rates given, no probe): OUT holds what would come back."""
    out = tmp_path_factory.mktemp("out")
    (out.parent / "speed.json").write_text(json.dumps(SPEED))
    assert campaign.main(["--dir", str(queue_dir), "run", "--out", str(out), "--budget-s", "200",
                          "--device", "cpu", "--eval-every", "3", "--speed", str(out.parent / "speed.json")]) == 0
    return out


@pytest.mark.slow
def test_gpu_campaign_sh_end_to_end_on_the_cpu(queue_dir, tmp_path):
    """The device script as the device runs it (probe included), then folded here."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PY": sys.executable, "OMP_NUM_THREADS": "1", "BUDGET": "200",
           "EVAL_EVERY": "3", "DEVICE": "cpu", "CAMPAIGN_DIR": str(queue_dir), "PROBE_N": "2"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "campaign" / "gpu_campaign.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["campaign.log", "machine.txt", "plan.json", "runs.jsonl.gz"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["speed"]["step_ms_per_run_ce"] > 0 and plan["speed"]["step_ms_per_run_auc_lp"] > 0
    assert set(plan["outcome"].values()) == {f"done at step {STEPS}"}
    assert '"git_commit"' in (out / "machine.txt").read_text()
    d = folded_copy(queue_dir, tmp_path)
    assert campaign_fold.fold([out], d, log=lambda m: None)["done"] == 2
    kept = list((d / "windows").iterdir())
    assert len(kept) == 1 and sorted(p.name for p in kept[0].iterdir()) == ["machine.txt", "plan.json"]


def folded_copy(queue_dir: Path, tmp_path: Path) -> Path:
    d = tmp_path / "campaign"
    d.mkdir(parents=True)
    (d / "queue.json").write_bytes((queue_dir / "queue.json").read_bytes())
    return d


def test_queue_keeps_a_non_composing_entry_and_shares_protocols():
    queue = campaign_queue.build((SECTION, campaign_queue.Section(
        ("eps",), "table_eps", {"dataset.neg_keep": ["0.1"], "seed": ["0"], "objective.epsilon": ["0.01"],
                                "optimizer.lr": ["0.1"]}, block=2, fixed={"dataset": "digits", "objective": "auc_lp"})),
        extra=EXTRA, log=lambda m: None)
    keys = [e["key"] for e in queue["entries"]]
    assert keys == ["digits_nk0.1_ce_lr0.1_s0", "digits_nk0.1_auc_lp_lr0.1_s0", "digits_nk0.1_nope_lr0.1_s0"]
    assert queue["entries"][1]["tables"] == ["binary", "eps"]   # eps 0.01 = Table 1's LP run: queued once
    assert queue["entries"][2]["config_sha"] is None and "objective/nope" in queue["entries"][2]["error"]
    assert queue["version"].startswith("q-") and queue["entries"][0]["steps"] == STEPS


def test_device_command_folds_back_to_train_py_runs_and_twice_changes_nothing(queue_dir, returned, tmp_path):
    assert sorted(p.name for p in returned.iterdir()) == ["plan.json", "runs.jsonl.gz"]
    plan = json.loads((returned / "plan.json").read_text())
    assert plan["kept"] == ["digits_nk0.1_ce_lr0.1_s0", "digits_nk0.1_auc_lp_lr0.1_s0"]
    assert plan["skipped"][0]["key"] == "digits_nk0.1_nope_lr0.1_s0"
    assert set(plan["outcome"].values()) == {f"done at step {STEPS}"}
    d = folded_copy(queue_dir, tmp_path)
    assert campaign_fold.fold([returned], d, log=lambda m: None)["done"] == 2
    for entry in json.loads((d / "queue.json").read_text())["entries"][:2]:
        cfg = compose_job([*entry["overrides"], *DEVICE_SET])
        from lpmetrics.run import loop
        loop.train(cfg, tmp_path / "alone" / entry["key"], {"objective": entry["objective"]})
        mine = pd.read_csv(d / "runs" / entry["key"] / "metrics.csv")
        alone = pd.read_csv(tmp_path / "alone" / entry["key"] / "metrics.csv")
        assert mine["step"].tolist() == [3, 6] and mine.equals(alone)   # every row, every column
    before = snapshot(d)
    assert campaign_fold.fold([returned / "runs.jsonl.gz"], d, log=lambda m: None)["unchanged"] == 2
    assert snapshot(d) == before
    out = campaign.main(["--dir", str(d), "status"])
    assert out == 0


def _rewrite(returned: Path, tmp_path: Path, change) -> Path:
    with gzip.open(returned / "runs.jsonl.gz", "rt") as f:
        records = [json.loads(line) for line in f]
    for r in records:
        change(r)
    path = tmp_path / "runs.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


def test_fold_refuses_another_queue_version_and_another_protocol(queue_dir, returned, tmp_path):
    d = folded_copy(queue_dir, tmp_path)
    other = _rewrite(returned, tmp_path, lambda r: r.update(queue_version="q-000000000000"))
    with pytest.raises(campaign_fold.FoldError, match="from queue version q-000000000000"):
        campaign_fold.fold([other], d)

    def lr(r):
        r["results"]["config"]["optimizer"]["lr"] = 0.5
    with pytest.raises(campaign_fold.FoldError, match="optimizer.lr: queued 0.1, ran 0.5"):
        campaign_fold.fold([_rewrite(returned, tmp_path, lr)], d)
    assert sorted(p.name for p in d.iterdir()) == ["queue.json"]   # nothing written


def test_a_stopped_run_is_an_attempt_not_done(queue_dir, returned, tmp_path):
    d = folded_copy(queue_dir, tmp_path)

    def stop(r):
        r["results"]["final"]["step"] = 3
        r["results"]["stopped"] = {"step": 3, "reason": "deadline"}
    path = _rewrite(returned, tmp_path, stop)
    assert campaign_fold.fold([path], d, log=lambda m: None)["stopped"] == 2
    ledger = json.loads((d / "ledger.json").read_text())
    assert ledger["runs"] == {} and [a["why"] for a in ledger["attempts"]] == ["deadline at step 3 of 6"] * 2
    assert not (d / "runs").exists()
    before = snapshot(d)
    campaign_fold.fold([path], d, log=lambda m: None)
    assert snapshot(d) == before


def test_plan_reports_what_it_skips_and_keeps_whole_blocks(queue_dir, tmp_path, capsys):
    d = folded_copy(queue_dir, tmp_path)
    queue = json.loads((d / "queue.json").read_text())
    queue["entries"][1]["config_sha"] = "0" * 16   # as if the configs changed since the queue was made
    (d / "queue.json").write_text(json.dumps(queue))
    (tmp_path / "speed.json").write_text(json.dumps(SPEED))
    assert campaign.main(["--dir", str(d), "plan", "--speed", str(tmp_path / "speed.json"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "skipped digits_nk0.1_nope_lr0.1_s0: does not compose: MissingConfigException" in out
    assert "skipped digits_nk0.1_auc_lp_lr0.1_s0: composes to another protocol than queued" in out
    assert "plan: 1 run(s) of digits (digits_nk0.1_ce_lr0.1_s0)" in out


def test_plan_leaves_out_the_keys_an_earlier_command_trained(queue_dir, tmp_path, capsys):
    (tmp_path / "speed.json").write_text(json.dumps(SPEED))
    (tmp_path / "planned.txt").write_text("digits_nk0.1_ce_lr0.1_s0\n")
    assert campaign.main(["--dir", str(queue_dir), "plan", "--speed", str(tmp_path / "speed.json"),
                          "--device", "cpu", "--exclude", str(tmp_path / "planned.txt")]) == 0
    out = capsys.readouterr().out
    assert "1 pending run(s) left out: trained by an earlier command on this machine" in out
    assert "plan: 1 run(s) of digits (digits_nk0.1_auc_lp_lr0.1_s0)" in out
    (tmp_path / "planned.txt").write_text("digits_nk0.1_ce_lr0.1_s0\ndigits_nk0.1_auc_lp_lr0.1_s0\n")
    assert campaign.main(["--dir", str(queue_dir), "plan", "--speed", str(tmp_path / "speed.json"),
                          "--device", "cpu", "--exclude", str(tmp_path / "planned.txt")]) == 0
    out = capsys.readouterr().out
    assert "2 pending run(s) left out" in out and "run(s) of digits" not in out   # nothing left to plan


def test_fold_passes_over_a_folder_whose_command_planned_nothing(queue_dir, returned, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "plan.json").write_text(json.dumps({"kept": [], "note": "nothing pending that composes"}))
    said = []
    assert campaign_fold.fold([returned, empty], folded_copy(queue_dir, tmp_path), log=said.append)["done"] == 2
    assert any("planned no run" in m for m in said)
    (empty / "plan.json").write_text(json.dumps({"kept": ["digits_nk0.1_ce_lr0.1_s0"]}))   # lost its runs
    with pytest.raises(campaign_fold.FoldError, match="no runs.jsonl.gz"):
        campaign_fold.fold([returned, empty], folded_copy(queue_dir, tmp_path / "b"), log=said.append)


def test_a_second_window_command_refuses_a_machine_without_the_first_ones_state(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": sys.executable, "SECOND": "1",
           "STATE": str(tmp_path / "state")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "campaign" / "gpu_window.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "SECOND=1 but no" in proc.stdout and "run without SECOND" in proc.stdout
    assert not (tmp_path / "out" / "plan.json").exists()


def test_choose_takes_whole_blocks_then_single_runs_that_fit():
    def e(key, block, obj="ce"):
        return {"key": key, "block": block, "objective": obj, "steps": 1000}
    entries = [e("a", 1), e("b", 1, "auc_lp"), e("c", 2, "auc_lp"), e("d", 2), e("f", 3)]
    cost = {"ce": 1.0, "auc_lp": 2.0}
    kept, total = campaign.choose(entries, lambda xs: sum(cost[x["objective"]] for x in xs), avail=4.5)
    # block 1 (3 s) fits, block 2 (3 s) does not; then, alone, c (2 s) does not, d (1 s) does, f no more
    assert [x["key"] for x in kept] == ["a", "b", "d"] and total == 4.0


def test_fold_cpu_takes_a_finished_run_as_its_entry_and_refuses_a_short_one(queue_dir, tmp_path):
    from lpmetrics.run import loop
    d = folded_copy(queue_dir, tmp_path)
    entry = json.loads((d / "queue.json").read_text())["entries"][0]
    loop.train(compose_job([*entry["overrides"], "trainer.eval_every=3", "device=cpu"]), tmp_path / "ce_run",
                {"objective": "ce"})
    assert campaign_fold.fold_cpu([tmp_path / "ce_run"], d, log=lambda m: None)["done"] == 1
    meta = json.loads((d / "runs" / entry["key"] / "campaign.json").read_text())
    assert meta["kind"] == "cpu" and "not the grid" in meta["note"]
    before = snapshot(d)
    assert campaign_fold.fold_cpu([tmp_path / "ce_run"], d, log=lambda m: None)["unchanged"] == 1
    assert snapshot(d) == before
    short = compose_job([*entry["overrides"], "trainer.max_steps=3", "device=cpu", "seed=1"])
    loop.train(short, tmp_path / "short", {"objective": "ce"})
    with pytest.raises(campaign_fold.FoldError, match="ran 3 of 3 steps; the campaign folds runs of 6"):
        campaign_fold.fold_cpu([tmp_path / "short"], d)


def test_make_tables_renders_pending_cells_from_the_queue(queue_dir, returned, tmp_path, capsys):
    d = folded_copy(queue_dir, tmp_path)
    make_tables.main([str(d), "--table", "binary"])
    out = capsys.readouterr().out
    assert "| ce | pending |" in out and "| auc_lp | pending |" in out
    assert "code versions: none (no run done yet)." in out
    campaign_fold.fold([returned], d, log=lambda m: None)
    make_tables.main([str(d), "--table", "binary", "--select", "best-test"])
    out = capsys.readouterr().out
    assert "(selection on test, optimistic)" in out and "pending" not in out.split("\n\n")[1]
    assert "| ce | " in out and "(n=1)" in out and "code versions: " in out


def test_windows_counts_the_commands_the_planner_would_fill():
    from scripts.campaign import status as campaign_status
    # ce: 2.0 ms a step alone, 1.0 per run in a pack of 4 -> a step of a pack of N: 4/3 + 2N/3 ms
    rates = {"budget_s": 100, "margin": 0.5, "eval_every": 1000, "assume": {"ce_twin": "ce"},
             "speed": {"pack_n": 4, "step_ms_per_run_ce": 1.0, "step_ms_solo_ce": 2.0, "eval_ms": 100.0,
                       "families": {"ce": "SGD"}}}

    def entry(obj, steps=10000, block="b"):
        return {"objective": obj, "steps": steps, "block": block, "where": {"dataset.name": "d"}}
    # N runs of 10k steps: 13.3 + 6.7 N s of steps + N s of evaluations <= 50 s -> 4 per command
    entries = [entry("ce") for _ in range(5)] + [entry("f1_cvxpy"), entry("ce_twin", block="c"), entry("ce", 100000, "z")]
    w = campaign_status.windows(entries, rates)
    assert w["windows"] == 2 and w["unfit"] == 1 and w["unpriced"] == {"f1_cvxpy": 1}
    # 4 runs: 13.3 + 26.7 + 4 s; then ce with ce_twin (its stand-in's family: one pack): 13.3 + 13.3 + 2 s
    assert w["runs"] == 8 and w["seconds"] == pytest.approx(44.0 + 28.7, abs=0.1)
    assert campaign_status.windows([entry("ce") for _ in range(4)], rates)["windows"] == 1


def test_the_committed_queue_is_the_paper_regime_seed_0_first_and_consistent():
    queue = json.loads((ROOT / "results" / "paper_tables" / "queue.json").read_text())
    entries = queue["entries"]
    assert queue["version"] == campaign_queue.version(entries) and len({e["key"] for e in entries}) == len(entries)
    assert queue["stages"] == [s.stage for s in campaign_queue.SECTIONS]
    assert all(e.get("config_sha") for e in entries) and all(e["steps"] == 40000 for e in entries)
    stages = [e["stage"] for e in entries]
    assert stages == sorted(stages, key=queue["stages"].index)            # entries grouped by stage, in order
    seed0 = [e for e in entries if e["stage"] == "table1_seed0"]
    assert len(seed0) == 2 * 4 * 4 * 3 and {e["seed"] for e in seed0} == {0} and {e["rule"] for e in seed0} == {"grid"}
    # the CIFAR-10 91 % cell first: ce and auc_lp at every lr, then the PPD pair; then Cat&Dog 91 %
    assert [e["key"] for e in seed0[:6]] == [f"cifar10_nk0.1_{o}_lr{lr}_s0" for lr in ("0.1", "0.01", "0.001")
                                             for o in ("ce", "auc_lp")]
    assert {e["objective"] for e in seed0[6:12]} == {"ppd_sg", "ppd_adagrad"}
    assert seed0[12]["key"] == "catdog_nk0.1_ce_lr0.1_s0" and seed0[24]["key"] == "cifar10_nk0.2_ce_lr0.1_s0"
    later = [e for e in entries if e["stage"] == "table1_seeds12"]
    assert {e["seed"] for e in later} == {1, 2} and {e["rule"] for e in later} == {"chosen"}
    assert {e["cell"] for e in later} == {e["cell"] for e in seed0}      # every later seed has its seed-0 cell
    # the paper's regime in every table but the augmented arm, which only runs the 91 % cells
    for e in entries:
        cfg = e["overrides"]
        assert ("regime=augmented" in cfg) == e["stage"].startswith("augmented")
    aug = [e for e in entries if e["stage"].startswith("augmented")]
    assert {e["where"]["dataset.neg_keep"] for e in aug} == {0.1} and all("_augmented_" in e["key"] for e in aug)
    eps = [e for e in entries if e["stage"] == "eps_compact"]
    assert {e["rule"] for e in eps} == {"anchor"} and all(e["anchor_cell"] in {x["cell"] for x in seed0} for e in eps)
    # host-only entries are marked, and only those whose LP layer runs on the host
    host = {e["objective"] for e in entries if e["runs_on"] != "device"}
    assert {"f1_cvxpy", "f1_apperf"} <= host and not host & {"ce", "auc_lp", "ppd_sg", "ppd_adagrad"}


def test_objectives_first_within_each_block_keep_blocks_whole():
    section = campaign_queue.Section(("binary",), "table1_binary",
                                     {"seed": ["0", "1"], "optimizer.lr": ["0.1", "0.01"],
                                      "objective": ["ppd_sg", "ce", "auc_lp"]}, block=1,
                                     fixed={"dataset": "digits"}, first=("ce", "auc_lp"))
    with composer() as compose:
        got = campaign_queue.section_jobs(section, compose)
    assert [j["name"] for j in got] == [f"digits_{o}_lr{lr}_s{s}" for s in "01" for group in
                                        (("ce", "auc_lp"), ("ppd_sg",)) for lr in ("0.1", "0.01")
                                        for o in group]
    assert [j["block"].rsplit("=", 1)[1] for j in got] == ["0"] * 6 + ["1"] * 6


def test_a_new_queue_order_moves_the_ledger_along_and_a_changed_entry_does_not(queue_dir, returned, tmp_path,
                                                                            monkeypatch, capsys):
    d = folded_copy(queue_dir, tmp_path)
    campaign_fold.fold([returned], d, log=lambda m: None)
    old = json.loads((d / "queue.json").read_text())
    turned = {**old, "entries": old["entries"][::-1]}
    turned["version"] = campaign_queue.version(turned["entries"])
    monkeypatch.setattr(campaign_queue, "build", lambda: turned)
    assert campaign.main(["--dir", str(d), "queue"]) == 0
    ledger = json.loads((d / "ledger.json").read_text())
    assert ledger["queue_version"] == turned["version"] and ledger["earlier_queue_versions"] == [old["version"]]
    assert len(ledger["runs"]) == 2
    # an entry with a run recorded changes its protocol: the ledger stays, and says why
    changed = json.loads(json.dumps(turned))
    changed["entries"][-1]["config_sha"] = "f" * 16
    changed["version"] = campaign_queue.version(changed["entries"])
    monkeypatch.setattr(campaign_queue, "build", lambda: changed)
    assert campaign.main(["--dir", str(d), "queue"]) == 0
    assert json.loads((d / "ledger.json").read_text())["queue_version"] == turned["version"]
    assert f"no entry of the new queue has the protocol of {changed['entries'][-1]['key']}" in capsys.readouterr().out


def test_a_renamed_entry_takes_its_run_folder_and_ledger_record_along(queue_dir, returned, tmp_path, monkeypatch):
    d = folded_copy(queue_dir, tmp_path)
    campaign_fold.fold([returned], d, log=lambda m: None)
    old = json.loads((d / "queue.json").read_text())
    renamed = json.loads(json.dumps(old))
    first = renamed["entries"][0]
    old_key, first["key"] = first["key"], first["key"].replace("_ce_", "_augmented_ce_")
    renamed["version"] = campaign_queue.version(renamed["entries"])
    before = (d / "runs" / old_key / "metrics.csv").read_bytes()
    monkeypatch.setattr(campaign_queue, "build", lambda: renamed)
    assert campaign.main(["--dir", str(d), "queue"]) == 0
    ledger = json.loads((d / "ledger.json").read_text())
    assert ledger["queue_version"] == renamed["version"] and ledger["earlier_queue_versions"] == [old["version"]]
    assert first["key"] in ledger["runs"] and old_key not in ledger["runs"] and len(ledger["runs"]) == 2
    assert not (d / "runs" / old_key).exists() and (d / "runs" / first["key"] / "metrics.csv").read_bytes() == before
    meta = json.loads((d / "runs" / first["key"] / "campaign.json").read_text())
    assert meta["key"] == first["key"] and meta["requeued"] == [{"key": old_key, "queue_version": old["version"]}]
    # the renamed run is done under its new key: plan no longer offers it
    waiting = campaign.pending(renamed, ledger, d)
    assert first["key"] not in {e["key"] for e in waiting}


def test_pack_cost_fits_a_pack_overhead_from_the_solo_probe_and_shares_it_within_a_pack():
    # pack of 4: ce 2 ms per run-step (8 ms a step), alone 5 ms -> a = 4, b = 1; auc_lp 3 / 6 -> a = 4, b = 2
    speed = {"pack_n": 4, "eval_ms": 0.0, "families": {"ce": "SGD", "auc_lp": "SGD", "ppd_sg": "PPD"},
             **{f"step_ms_per_run_{o}": v for o, v in (("ce", 2.0), ("auc_lp", 3.0), ("ppd_sg", 2.0))},
             **{f"step_ms_solo_{o}": v for o, v in (("ce", 5.0), ("auc_lp", 6.0), ("ppd_sg", 5.0))}}
    cost_of = campaign.pack_cost(speed, eval_every=1000)

    def e(obj):
        return {"objective": obj, "steps": 1000}
    assert cost_of([e("ce")]) == pytest.approx(5.0) and cost_of([e("ce")] * 4) == pytest.approx(8.0)
    assert cost_of([e("ce"), e("auc_lp")]) == pytest.approx(7.0)            # one pack: 4 + 1 + 2 ms a step
    assert cost_of([e("ce"), e("auc_lp"), e("ppd_sg")]) == pytest.approx(12.0)   # + a pack of its own: 5


@pytest.mark.slow
def test_gpu_window_sh_end_to_end_on_the_cpu(queue_dir, tmp_path):
    """The window's one command (graph check, the campaign, the LP timing) on the CPU: every file
    it promises comes back, the graph check gates the campaign, and the campaign's runs fold."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PY": sys.executable, "OMP_NUM_THREADS": "1", "BUDGET": "200",
           "EVAL_EVERY": "3", "DEVICE": "cpu", "CAMPAIGN_DIR": str(queue_dir), "PROBE_N": "2",
           "CHECK_ARGS": "--model mlp --steps 4 --n 2", "CHECK_S": "200", "TIMING_S": "200",
           "STATE": str(tmp_path / "state")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "campaign" / "gpu_window.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["campaign.log", "check_graph.json", "machine.txt", "plan.json",
                                                     "runs.jsonl.gz", "time_capture_lp.jsonl", "window.log"]
    rows = json.loads((out / "check_graph.json").read_text())
    assert {r["objective"] for r in rows} == {"ce", "auc_lp", "ppd_sg", "ppd_adagrad"}
    log = (out / "window.log").read_text()
    assert "graph check passed: 1" in log and "CUDA_GRAPH=1" in log   # the CPU's stand-in equals eager
    plan = json.loads((out / "plan.json").read_text())
    assert set(plan["outcome"].values()) == {f"done at step {STEPS}"}
    assert plan["speed"]["graph_ce"] is False   # no graph on the CPU: the probe timed the eager step
    lines = [json.loads(line) for line in (out / "time_capture_lp.jsonl").read_text().splitlines()]
    assert [r["path"] for r in lines if "path" in r] == ["standard", "capture_safe"]
    assert {(r["k"], r["variant"]) for r in lines if "k" in r} == {(k, v) for k in (1, 2, 4, 8)
                                                                   for v in ("separate", "batched")}
    assert campaign_fold.fold([out], folded_copy(queue_dir, tmp_path), log=lambda m: None)["done"] == 2
    # what it left for a second command on this machine
    state = tmp_path / "state"
    assert (state / "graph").read_text().strip() == "1"
    assert json.loads((state / "speed.json").read_text()) == plan["speed"]
    assert (state / "dataset").read_text().strip() == "digits"
    assert (state / "planned.txt").read_text().split() == plan["kept"]
    # the second command, sent at once (nothing folded in between): the first one's check, probe,
    # dataset and runs. As if the first had planned only its first run, the second trains the other.
    (state / "planned.txt").write_text(plan["kept"][0] + "\n")
    again = {**env, "OUT": str(tmp_path / "out2"), "SECOND": "1"}
    for k in ("CHECK_S", "TIMING_S"):
        again.pop(k)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "campaign" / "gpu_window.sh")], env=again, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log2 = (tmp_path / "out2" / "window.log").read_text()
    assert "no graph check (CHECK_S=0): CUDA_GRAPH=1" in log2 and "LP timing" not in log2
    plan2 = json.loads((tmp_path / "out2" / "plan.json").read_text())
    assert plan2["excluded"] == [plan["kept"][0]] and plan2["kept"] == plan["kept"][1:]
    assert plan2["speed"]["from"] == "speed.json" and plan2["dataset"] == "digits"  # no machine path
    assert set(plan2["outcome"].values()) == {f"done at step {STEPS}"}
    assert (state / "planned.txt").read_text().split() == plan["kept"]
    # a third command plans nothing; fold passes over its folder
    third = {**again, "OUT": str(tmp_path / "out3")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "campaign" / "gpu_window.sh")], env=third, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and json.loads((tmp_path / "out3" / "plan.json").read_text())["kept"] == []
    d = folded_copy(queue_dir, tmp_path / "again")
    assert campaign_fold.fold([tmp_path / "out2", tmp_path / "out3"], d, log=lambda m: None)["done"] == 1
