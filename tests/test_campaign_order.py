"""scripts/tables/queue_order.py: the queue's lr rules (seed 0 chooses a cell's lr by validation, seeds
1-2 train only that lr; the eps ablation takes Table 1's lr first), the plan order by stage, the
counts make_tables shows as "pending", and host-only entries kept out of device commands."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.campaign import cli as campaign
from scripts.tables import queue_order
from scripts.campaign import status as campaign_status
from scripts.tables.queue_cells import expected_cells

ROOT = Path(__file__).resolve().parents[1]

LRS = (0.1, 0.01, 0.001)


def entry(key, cell, seed, lr, stage, rule="grid", objective="ce", **more):
    return {"key": key, "cell": cell, "seed": seed, "lr": lr, "stage": stage, "rule": rule, "objective": objective,
            "metric": "val_auc", "tables": ["binary"], "config_sha": key, "steps": 1000, "block": f"{cell}/{seed}",
            "where": {"dataset.name": "d", "dataset.neg_keep": 0.1}, "runs_on": "device", **more}


def queue_of(*entries, stages=("s0", "s12", "compact", "late")):
    return {"version": "q-test", "entries": list(entries), "stages": list(stages)}


def finish(folder: Path, ledger: dict, key: str, val: float | None, status: str = "done") -> None:
    ledger.setdefault("runs", {})[key] = {"status": status}
    if status == "done":
        (folder / "runs" / key).mkdir(parents=True)
        (folder / "runs" / key / "results.json").write_text(json.dumps({"final": {"val_auc": val, "test_auc": 0.5}}))


def cell_queue():
    seed0 = [entry(f"c_lr{lr}_s0", "c", 0, lr, "s0") for lr in LRS]
    later = [entry(f"c_lr{lr}_s{s}", "c", s, lr, "s12", rule="chosen") for s in (1, 2) for lr in LRS]
    return queue_of(*seed0, *later)


def test_seeds_1_2_wait_for_seed_0_then_train_only_the_chosen_lr(tmp_path):
    q, ledger = cell_queue(), {}
    st = queue_order.states(q, ledger, tmp_path)
    assert [st[f"c_lr{lr}_s1"][0] for lr in LRS] == ["waiting"] * 3
    assert [e["key"] for e in queue_order.ordered_pending(q, ledger, tmp_path)] == [f"c_lr{lr}_s0" for lr in LRS]
    finish(tmp_path, ledger, "c_lr0.1_s0", 0.70)
    finish(tmp_path, ledger, "c_lr0.01_s0", 0.80)
    assert queue_order.chosen_lrs(q, ledger, tmp_path) == {}          # lr 0.001 still open
    finish(tmp_path, ledger, "c_lr0.001_s0", 0.75)
    assert queue_order.chosen_lrs(q, ledger, tmp_path) == {"c": 0.01}
    st = queue_order.states(q, ledger, tmp_path)
    assert {k: v[0] for k, v in st.items() if k.endswith(("s1", "s2"))} == {
        "c_lr0.1_s1": "not needed", "c_lr0.01_s1": "pending", "c_lr0.001_s1": "not needed",
        "c_lr0.1_s2": "not needed", "c_lr0.01_s2": "pending", "c_lr0.001_s2": "not needed"}
    assert [e["key"] for e in queue_order.ordered_pending(q, ledger, tmp_path)] == ["c_lr0.01_s1", "c_lr0.01_s2"]


@pytest.mark.parametrize("vals, statuses, want", [
    ((0.8, 0.8, 0.7), ("done",) * 3, 0.01),              # a tie goes to the smaller lr
    ((None, 0.6, 0.7), ("diverged", "done", "done"), 0.001),
    ((0.9, None, None), ("done", "diverged", "diverged"), 0.1),
    ((None, None, None), ("diverged",) * 3, 0.001),       # all diverged: the rule still decides
])
def test_the_choice_is_the_tables_per_cell_rule_on_seed_0(tmp_path, vals, statuses, want):
    q, ledger = cell_queue(), {}
    for lr, val, status in zip(LRS, vals, statuses):
        finish(tmp_path, ledger, f"c_lr{lr}_s0", val, status)
    assert queue_order.chosen_lrs(q, ledger, tmp_path) == {"c": want}


def test_the_anchor_rule_takes_the_anchor_cells_lr_first_and_the_others_later(tmp_path):
    anchor = [entry(f"a_lr{lr}_s0", "a", 0, lr, "s0") for lr in LRS]
    eps = [entry(f"e_lr{lr}_s0", "e", 0, lr, "compact", rule="anchor", anchor_cell="a", later="late") for lr in LRS]
    other = entry("x_s0", "x", 0, 0.1, "mid")
    q, ledger = queue_of(*anchor, *eps, other, stages=("s0", "compact", "mid", "late")), {}
    assert [queue_order.states(q, ledger, tmp_path)[e["key"]][0] for e in eps] == ["waiting"] * 3
    for lr, val in zip(LRS, (0.6, 0.7, 0.9)):
        finish(tmp_path, ledger, f"a_lr{lr}_s0", val)
    # e at the anchor's lr in its own stage (before x), its other lrs in "late" (after x)
    assert [e["key"] for e in queue_order.ordered_pending(q, ledger, tmp_path)] == [
        "e_lr0.001_s0", "x_s0", "e_lr0.1_s0", "e_lr0.01_s0"]


def test_make_tables_counts_one_run_per_waiting_cell_and_seed_and_none_not_needed(tmp_path):
    q, ledger = cell_queue(), {}
    count = expected_cells(q, "binary", "neg_keep", None, set(), queue_order.states(q, ledger, tmp_path))
    assert count == {(("d", 0.1), "ce"): (3 + 2, 0)}      # 3 lrs of seed 0 + one lr for each of seeds 1 and 2
    for lr in LRS:
        finish(tmp_path, ledger, f"c_lr{lr}_s0", 0.5 + lr)
    done = {f"c_lr{lr}_s0" for lr in LRS}
    count = expected_cells(q, "binary", "neg_keep", None, done, queue_order.states(q, ledger, tmp_path))
    assert count == {(("d", 0.1), "ce"): (5, 3)}
    assert expected_cells(q, "binary", "neg_keep", None, set()) == {(("d", 0.1), "ce"): (9, 0)}   # no rules


def test_a_host_only_entry_is_never_planned_for_a_device_command():
    host = entry("h", "h", 0, 0.1, "s0", objective="f1_cvxpy", runs_on="host",
                 runs_on_why="F1CvxpyLoss has no capture-safe form (it needs the host every step)")
    dev = entry("g", "g", 0, 0.1, "s0")
    todo, left = campaign.candidates([host, dev])
    assert [e["key"] for e in todo] == ["g"]
    assert left == [("h", "runs on the host, never in a device command: F1CvxpyLoss has no capture-safe form "
                          "(it needs the host every step)")]


def test_status_windows_prices_device_runs_and_lists_host_only_apart(tmp_path):
    q = cell_queue()
    q["entries"].append(entry("h_s0", "h", 0, 0.1, "s0", objective="f1_cvxpy", runs_on="host"))
    rates = {"source": "a test", "budget_s": 100, "margin": 0.5, "eval_every": 1000,
             "speed": {"step_ms_per_run_ce": 1.0, "step_ms_per_run_f1_cvxpy": 1.0, "eval_ms": 0.0}}
    lines = campaign_status.windows_table(q, {"runs": {}}, tmp_path, rates)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ") and "---" not in line}
    # seed 0: 3 lrs; seeds 1-2: one stand-in each (their lr is not chosen yet); the host run is not priced
    assert rows["s0"].split(" | ")[1:3] == ["3", "3"] and rows["s12"].split(" | ")[1:3] == ["2", "2"]
    assert rows["all device runs"].split(" | ")[1] == "5"
    assert lines[-1].startswith("Host-only runs still needed, never planned for a device command (1): f1_cvxpy 1")


def test_the_augmented_arm_has_its_own_rows_and_pending_counts(tmp_path):
    from scripts.tables.queue_cells import row_name
    paper = entry("p", "p", 0, 0.1, "s0", overrides=["dataset=d", "objective=ce"])
    aug = entry("a", "a", 0, 0.1, "s0", overrides=["regime=augmented", "dataset=d", "objective=ce"])
    assert row_name(paper) == "ce" and row_name(aug) == "ce (regime=augmented)"
    count = expected_cells(queue_of(paper, aug), "binary", "neg_keep", None, {"a"})
    assert count == {(("d", 0.1), "ce"): (1, 0), (("d", 0.1), "ce (regime=augmented)"): (1, 1)}


def test_the_table_reports_the_lr_seed_0_chose_with_all_its_seeds():
    """make_tables' per-cell rule compares lrs on the seeds every lr ran: with seeds 1-2 only at
    seed 0's choice, a weaker mean at that lr does not hand the cell to another lr's single run."""
    from scripts.tables import make_tables

    def run(lr, seed, val):
        return make_tables.Run(Path(f"/x/{lr}_{seed}/results.json"), "ce", ("d", 0.1), lr, seed, 70.0, val, {},
                               label="ce")
    runs = [run(0.1, 0, 80.0), run(0.1, 1, 76.0), run(0.1, 2, 77.0), run(0.01, 0, 79.0)]
    (cell,), _ = make_tables.select(runs, "per-cell", "val_auc", lambda m: None)
    assert cell.lr == 0.1 and len(cell.runs) == 3
    # every lr at every seed: the mean over all of them, as before
    runs += [run(0.01, 1, 79.0), run(0.01, 2, 79.0)]
    (cell,), _ = make_tables.select(runs, "per-cell", "val_auc", lambda m: None)
    assert cell.lr == 0.01 and len(cell.runs) == 3


def test_requeue_moves_runs_whose_new_keys_cross(tmp_path):
    """Run a takes key b while run b moves to c: the folders move in two phases."""
    for key in ("a", "b"):
        (tmp_path / "runs" / key).mkdir(parents=True)
        (tmp_path / "runs" / key / "campaign.json").write_text(json.dumps({"key": key}))
        (tmp_path / "runs" / key / "metrics.csv").write_text(key)
    ledger = {"queue_version": "q-old", "runs": {"a": {"status": "done"}, "b": {"status": "done"}}, "attempts": []}
    (tmp_path / "ledger.json").write_text(json.dumps(ledger))
    old = {"version": "q-old", "entries": [{"key": "a", "config_sha": "S1", "tables": ["binary"]},
                                           {"key": "b", "config_sha": "S2", "tables": ["binary"]}]}
    new = {"version": "q-new", "entries": [{"key": "b", "config_sha": "S1", "tables": ["binary"]},
                                           {"key": "c", "config_sha": "S2", "tables": ["binary"]}]}
    campaign.requeue_ledger(tmp_path / "ledger.json", old, new)
    assert (tmp_path / "runs" / "b" / "metrics.csv").read_text() == "a"
    assert (tmp_path / "runs" / "c" / "metrics.csv").read_text() == "b"
    assert not (tmp_path / "runs" / "a").exists()
    moved = json.loads((tmp_path / "ledger.json").read_text())
    assert moved["queue_version"] == "q-new" and set(moved["runs"]) == {"b", "c"}


def test_a_stale_entry_in_the_probe_window_falls_back_to_the_default_mode(monkeypatch):
    """The selector builds its pack from the first entries before the plan verifies them: one that
    no longer composes must not end the command (the default mode, and why)."""
    import types

    from scripts.campaign import gpu_tables
    good = {"key": "g", "objective": "ce", "overrides": ["dataset=digits", "model=mlp", "objective=ce"],
            "experiment": "table1_binary"}
    bad = {**good, "key": "stale", "overrides": [*good["overrides"], "trainer.no_such_key=1"]}
    args = types.SimpleNamespace(select_mode=True, probe_n=8, probe_window=48, probe_reps=1, max_pack=None,
                                 cuda_graph=False, select_budget_s=1.0, pack_mode="auto", pack_select=None)
    monkeypatch.setattr(gpu_tables, "measure", lambda *a, **k: {"step_ms_per_run_ce": 1.0, "eval_ms": 1.0})
    speed, _ = campaign.probe([good, bad], ["device=cpu"], args)
    assert args.pack_mode == "auto" and "did not build" in args.pack_select["fell_back"]
    assert speed["step_ms_per_run_ce"] == 1.0
