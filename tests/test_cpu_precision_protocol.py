"""A study run is its line's run now, and keeps what its line pins.

When ``scripts/studies/cpu_precision_runs.txt`` is edited after a run began, the report
(``scripts/cpu/precision_report.py``) refuses that run's folder, naming the run and both protocol
hashes (``--partial`` lists it as mismatched and leaves it out), and the CPU lane
(``scripts/campaign/lane.py``) neither resumes it nor counts it as finished; restoring the line
makes both accept it again. A lane ``--set`` of a key a study line sets (the twins'
``model.conv_impl=gemm``) does not reach that study run's training; a queue entry's it does.
The hashes the tests expect are composed here, independently of the code under test.
"""
from __future__ import annotations

import json
from pathlib import Path
import sys

import pytest

from scripts.campaign import lane
from scripts.campaign import queue as campaign_queue
from scripts.campaign.jobs import ROOT, composer
from scripts.cpu import precision_report as report
from tests.test_campaign_lane import QUEUE_KEYS, STUDY_STEPS, digits_lane, digits_study, queue_dir  # noqa: F401
from tests.test_cpu_precision import NAME, RUN_LIST, fake_lane  # noqa: F401 -- fixtures


def protocol_of(entry: dict, extra: list[str] = ()) -> str:
    """The protocol hash ``entry`` composes to (the oracle: composed here, not by the code under test)."""
    with composer() as compose:
        cfg, _ = campaign_queue.compose_entry(compose, [*entry["overrides"], *extra], entry["experiment"])
    return campaign_queue.config_sha(campaign_queue.composed_config(cfg))


def entries_of(name: str, path) -> dict[str, dict]:
    queue, _ = campaign_queue.load(campaign_queue.DEFAULT_DIR)
    return {e["key"].split("/", 1)[1]: e for e in lane.study_entries(name, path, queue)}


def edited(src, dst, run: str, change: str):
    """A copy of run list ``src`` at ``dst`` with ``change`` added to ``run``'s line."""
    lines = [ln + f" {change}" if ln.startswith(f"{run}|") else ln for ln in src.read_text().splitlines()]
    assert sum(ln.startswith(f"{run}|") for ln in lines) == 1
    dst.write_text("\n".join(lines) + "\n")
    return dst


# ----------------------------------------------------------------------------- the report


def test_the_report_refuses_a_run_of_an_edited_line_and_partial_lists_it(fake_lane, tmp_path, monkeypatch, capsys):
    run = "auc_lp_lr0.01_bf16_s1"
    before = protocol_of(entries_of(NAME, RUN_LIST)[run])
    held = lane.LaneRun(fake_lane / "studies" / NAME / run, {"key": f"{NAME}/{run}", "config_sha": before})
    held.save()                                            # the lane began it under the committed line
    now_list = edited(RUN_LIST, tmp_path / "runs.txt", run, "objective.epsilon=0.1")
    now = protocol_of(entries_of(NAME, now_list)[run])
    assert now != before
    monkeypatch.setattr(lane, "STUDIES", ((NAME, now_list),))   # the line edited after the run finished
    out = tmp_path / "out"
    assert report.main(["--lane-dir", str(fake_lane), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("precision_report: ReportError: 1 of 8 runs were trained under another protocol than "
                          f"their line in {now_list} composes to now: {run} (its folder holds protocol {before}, "
                          f"its line composes to {now}); delete each such folder")
    assert "so the CPU lane trains it afresh, or restore the run list" in err and "\n" not in err
    assert not out.exists()

    assert report.main(["--lane-dir", str(fake_lane), "--out", str(out), "--partial"]) == 0
    table = (out / "table.md").read_text()
    assert table.startswith("# cpu_precision: fp32 vs bf16 twins (PARTIAL)")
    assert (f"**Verdict.** PARTIAL: 1 of 8 mismatched, left out (a folder of another protocol than its line "
            f"composes to now: {run} {before}, line {now}); no verdict.") in table
    assert "| auc_lp (lr 0.01) | 1 | 8000/mismatched | 61.00 | - | - |" in table   # its numbers left out
    assert sorted(p.name for p in (out / "runs").iterdir()) == \
        sorted(p.name for p in (fake_lane / "studies" / NAME).iterdir() if p.name != run)

    monkeypatch.setattr(lane, "STUDIES", ((NAME, RUN_LIST),))   # the line restored: its run again
    answer = report.report(fake_lane, tmp_path / "again", log=lambda m: None)
    assert answer.startswith("bf16 moves the metrics") and len(list((tmp_path / "again" / "runs").iterdir())) == 8


# ----------------------------------------------------------------------------- the lane


def test_the_lane_neither_resumes_nor_counts_as_finished_a_run_of_an_edited_line(digits_study, monkeypatch):
    camp, lane_dir = digits_study
    (name, path), = lane.STUDIES
    committed = path.read_text()
    before = {run: protocol_of(e) for run, e in entries_of_digits(camp, name, path).items()}
    for run in ("ce_fp32", "ce_bf16"):
        held = lane.LaneRun.of(lane_dir, f"{name}/{run}")
        held.info = {"key": f"{name}/{run}", "config_sha": before[run], "steps": STUDY_STEPS}
        held.save()
    finished = lane.LaneRun.of(lane_dir, f"{name}/ce_fp32")
    (finished.folder / "results.json").write_text(json.dumps({"final": {"step": STUDY_STEPS}}))
    (lane.LaneRun.of(lane_dir, f"{name}/ce_bf16").folder / "last.pt").write_bytes(b"a checkpoint")
    edited(path, path, "ce_fp32", "seed=3")
    edited(path, path, "ce_bf16", "seed=3")
    now = {run: protocol_of(e) for run, e in entries_of_digits(camp, name, path).items()}
    assert all(now[r] != before[r] for r in now)

    started = []
    sup = lane.Lane(lane_dir, camp, jobs=2, log=lambda m: None)
    sup.start_run = lambda entry, code, commit: started.append(entry["key"])
    sup.fill(ROOT, "0" * 40)
    assert started == QUEUE_KEYS                               # neither study run resumed nor trained over
    assert f"holds protocol {before['ce_bf16']}, the entry is {now['ce_bf16']}: neither resumed" in \
        sup.refused[f"{name}/ce_bf16"]
    assert sup.refused[f"{name}/ce_fp32"].startswith(        # finished, but not counted as finished
        f"finished under protocol {before['ce_fp32']}, its line in {path.name} composes to {now['ce_fp32']} "
        f"now: not counted as finished; delete {finished.folder} so the lane trains it afresh")
    assert state_of(lane_dir, camp, f"{name}/ce_fp32") == "refused"   # what `cpu status` shows, not "finished"

    path.write_text(committed)                                 # the lines restored
    started.clear()
    sup = lane.Lane(lane_dir, camp, jobs=1, log=lambda m: None)
    sup.start_run = lambda entry, code, commit: started.append(entry["key"])
    sup.fill(ROOT, "0" * 40)
    assert started == [f"{name}/ce_bf16"] and sup.refused == {}   # resumed; the finished one is finished
    assert state_of(lane_dir, camp, f"{name}/ce_fp32") == "finished"


def state_of(lane_dir: Path, camp: Path, key: str) -> str:
    """The state column of ``key``'s row in the lane's status."""
    row, = [ln for ln in lane.status_lines(lane_dir, camp) if ln.startswith(f"{key} ")]
    return row.split()[1]


def entries_of_digits(camp, name, path) -> dict[str, dict]:
    queue, _ = campaign_queue.load(camp)
    return {e["key"].split("/", 1)[1]: e for e in lane.study_entries(name, path, queue)}


# ----------------------------------------------------------------------------- --set and a study's pins


TRAIN_COMMAND = lane.train_command   # the lane's own, not a test's stand-in


def launched(sup: lane.Lane, entry: dict, monkeypatch) -> list[str]:
    """The train.py overrides ``sup`` starts ``entry`` with (the training itself replaced by a no-op)."""
    seen = []
    monkeypatch.setattr(lane, "train_command",
                        lambda *a: seen.append(TRAIN_COMMAND(*a)) or [sys.executable, "-c", "pass"])
    sup.start_run({**entry, "config_sha": "0" * 16}, ROOT, "0" * 40)
    sup.children.pop(entry["key"]).wait()
    cmd, = seen
    return [o for o in cmd[cmd.index(str(ROOT / "train.py")) + 1:] if not o.startswith(("experiment=", "hydra."))]


def test_a_lane_set_does_not_override_what_a_study_line_pins(tmp_path, monkeypatch):
    queue, _ = campaign_queue.load(campaign_queue.DEFAULT_DIR)
    twin = entries_of(NAME, RUN_LIST)["ce_lr0.1_bf16_s0"]
    base = next(e for e in queue["entries"] if e["key"] == twin["base"])
    sets = ["model.conv_impl=stock", "trainer.log_every=7"]
    log = []
    sup = lane.Lane(tmp_path / "lane", campaign_queue.DEFAULT_DIR, jobs=1, extra=sets, log=log.append)
    sup.queue = queue
    with composer() as compose:   # Hydra applies a key's last override: the composed run is what trains
        for entry, impl in ((twin, "gemm"), (base, "stock")):
            cfg, _ = campaign_queue.compose_entry(compose, launched(sup, entry, monkeypatch), entry["experiment"])
            assert cfg.model.conv_impl == impl and cfg.trainer.log_every == 7
    assert any("left out --set model.conv_impl=stock: its study line sets that key" in m for m in log)
    info = json.loads((lane.run_folder(tmp_path / "lane", twin["key"]) / "lane.json").read_text())
    # what it ran with, recorded (a new lane run's optimizer step is compiled: lane.optimizer_override)
    assert info["segments"][-1]["overrides"] == ["trainer.log_every=7", "trainer.optimizer_impl=compiled"]
    assert lane.study_extra(twin, sets) == (["trainer.log_every=7"], ["model.conv_impl=stock"])
    assert lane.study_extra(base, sets) == (sets, [])


def test_a_hydra_prefix_does_not_carry_a_set_past_a_study_pin():
    """``++KEY=V`` (force) and ``~KEY`` (delete) would undo the pin in Hydra as ``KEY=V`` would."""
    twin = entries_of(NAME, RUN_LIST)["ce_lr0.1_bf16_s0"]
    sets = ["++model.conv_impl=stock", "~trainer.precision", "+trainer.extra_key=1"]
    assert lane.study_extra(twin, sets) == (["+trainer.extra_key=1"], sets[:2])


def test_partial_report_removes_a_stale_copy_of_a_run_no_longer_finished(tmp_path, monkeypatch):
    """A copy an earlier report made under ``runs/<run>/`` goes when the run is no longer one the
    report places (here: its folder is gone, so it is unfinished)."""
    from scripts.cpu import precision_report
    out = tmp_path / "out"
    stale = out / "runs" / "ghost"
    stale.mkdir(parents=True)
    (stale / "metrics.csv").write_text("step\n")

    class Run:
        name, finished = "ghost", False
    monkeypatch.setattr(precision_report, "study_runs", lambda lane_dir, campaign_dir, committed=None: [Run()])
    monkeypatch.setattr(precision_report, "check_protocols", lambda runs, partial: None)
    monkeypatch.setattr(precision_report, "check_finished", lambda runs, partial: runs)
    monkeypatch.setattr(precision_report, "table_text", lambda runs, unfinished: ("table", "partial"))
    monkeypatch.setattr(precision_report, "curves", lambda runs: {})
    assert precision_report.report(tmp_path / "lane", out, partial=True, log=lambda *a: None) == "partial"
    assert not stale.exists() and (out / "table.md").read_text() == "table"
