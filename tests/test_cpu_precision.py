"""The CPU lane's bf16 study (``scripts/studies/cpu_precision_runs.txt``) and its report
(``scripts/cpu/precision_report.py``).

The runs are the queue's CIFAR-10 91 % entries with only the study's changes, each fp32 run and its
bf16 twin compose to configs that differ in ``trainer.precision`` alone, and, trained through
``train.py``'s loop on a tiny CIFAR-shaped source, the twins start from equal weights and draw
equal batches. The report, on fake finished run folders, gives the hand-computed table and
verdict, copies no checkpoint and no absolute path, and refuses unfinished runs unless ``--partial``.
"""
from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch

from lpmetrics.run import loop
from scripts.campaign import lane
from scripts.campaign import queue as campaign_queue
from scripts.campaign.jobs import composer
from scripts.cpu import precision_report as report
from scripts.tables.make_tables import flatten

(NAME, RUN_LIST), = lane.STUDIES
CHANGED = {"seed", "trainer.precision", "trainer.max_steps", "trainer.eval_every", "model.conv_impl"}


@pytest.fixture(scope="module")
def study():
    queue, _ = campaign_queue.load(campaign_queue.DEFAULT_DIR)
    return queue, lane.study_entries(NAME, RUN_LIST, queue)


def composed(entry: dict, extra: list[str] = ()) -> dict:
    with composer() as compose:
        cfg, _ = campaign_queue.compose_entry(compose, [*entry["overrides"], *extra], entry["experiment"])
    return flatten(campaign_queue.composed_config(cfg))


def test_the_runs_are_the_queues_entries_with_only_the_studys_changes(study):
    queue, runs = study
    entries = {e["key"]: e for e in queue["entries"]}
    assert len(runs) == 8 and not any(r.get("error") for r in runs)
    first = {o: lr for o, lr in reversed(lane.FIRST)}   # the lr each objective is queued first at
    for run in runs:
        base = entries[run["base"]]
        objective = lane.override_value(run["overrides"], "objective")
        assert base["where"]["dataset.name"] == "cifar10" and base["where"]["dataset.neg_keep"] == 0.1
        assert base["stage"] == "table1_seed0" and base["experiment"] == run["experiment"] == "table1_binary"
        assert base["lr"] == first[objective] and "augmented" not in base["key"]
        kept = [o for o in run["overrides"] if o.split("=", 1)[0] not in CHANGED]
        assert kept == [o for o in base["overrides"] if o.split("=", 1)[0] not in CHANGED]
        assert run["steps"] == 8000
    assert {(lane.override_value(r["overrides"], "objective"), lane.override_value(r["overrides"], "seed"),
             lane.override_value(r["overrides"], "trainer.precision")) for r in runs} == \
        {(o, s, p) for o in ("ce", "auc_lp") for s in ("0", "1") for p in ("fp32", "bf16")}


def test_twins_compose_to_configs_that_differ_in_precision_alone(study):
    queue, runs = study
    entries = {e["key"]: e for e in queue["entries"]}
    by_name = {r["key"].split("/", 1)[1]: r for r in runs}
    for name, run in by_name.items():
        if "_fp32_" not in name:
            continue
        fp32, bf16 = composed(run), composed(by_name[name.replace("_fp32_", "_bf16_")])
        assert {k for k in fp32.keys() | bf16.keys() if fp32.get(k) != bf16.get(k)} == {"trainer.precision"}
        assert fp32["model.conv_impl"] == "gemm" and fp32["trainer.max_steps"] == 8000
        assert fp32["trainer.eval_every"] == 1000 and fp32["scheduler.milestones"] == "[2000, 10000, 25000]"
        assert fp32["dataset.augment"] is False and fp32["dataset.normalize"] == "per_image"   # regime=paper
        base = composed(entries[run["base"]])
        if fp32["seed"] == 0:   # the queue's entry itself but for the run length and the pinned path
            assert {k for k in base.keys() | fp32.keys() if base.get(k) != fp32.get(k)} == \
                {"trainer.max_steps", "model.conv_impl"}
        if "objective.epsilon" in fp32:   # the LP's epsilon: its queue entry's
            assert fp32["objective.epsilon"] == entries[run["base"]]["where"]["objective.epsilon"]


TINY = ["dataset.source._target_=tests.test_cpu_gemm_train.tiny_cifar", "dataset.val_size=40",
        "trainer.max_steps=3", "trainer.eval_every=3", "trainer.batch_size=32", "device=cpu",
        "trainer.eval_batch_size=64", "trainer.bntrain_batch_size=16", "logger=csv"]


PREPARE, NEXT = loop.prepare_run, loop.BatchStream.__next__


def first_steps(compose_cfg, entry: dict, run_dir, monkeypatch) -> tuple[dict, list[list[int]]]:
    """(initial state_dict, the indices of each batch) of ``entry``'s run, shrunk to 3 steps."""
    state, batches = {}, []
    real_prepare, real_next = PREPARE, NEXT   # the loop's own, not an earlier call's spies

    def prepare(*a, **k):
        run, ckpt = real_prepare(*a, **k)
        state.update({k: v.detach().clone() for k, v in run.model.state_dict().items()})
        return run, ckpt

    def next_batch(self):
        k = self.step % self.per_epoch
        out = real_next(self)
        batches.append(self._perm[k * self.batch_size:(k + 1) * self.batch_size].tolist())
        return out
    monkeypatch.setattr(loop, "prepare_run", prepare)
    monkeypatch.setattr(loop.BatchStream, "__next__", next_batch)
    res = loop.train(compose_cfg([f"experiment={entry['experiment']}", *entry["overrides"], *TINY]), run_dir)
    assert res["conv_impl"]["impl"] == "gemm"
    return state, batches


@pytest.mark.parametrize("name", ["ce_lr0.1_fp32_s0", "auc_lp_lr0.01_fp32_s1"])
def test_twins_share_initial_weights_and_batches(study, compose_cfg, tmp_path, monkeypatch, name):
    by_name = {r["key"].split("/", 1)[1]: r for r in study[1]}
    w32, b32 = first_steps(compose_cfg, by_name[name], tmp_path / "fp32", monkeypatch)
    w16, b16 = first_steps(compose_cfg, by_name[name.replace("fp32", "bf16")], tmp_path / "bf16", monkeypatch)
    assert len(b32) == 3 and b32 == b16
    assert w32.keys() == w16.keys() and all(torch.equal(w32[k], w16[k]) for k in w32)
    # the spies see what a run draws: another seed starts elsewhere and draws other batches
    other = {**by_name[name], "overrides": lane.changed(by_name[name]["overrides"], ["seed=7"])}
    w_o, b_o = first_steps(compose_cfg, other, tmp_path / "other", monkeypatch)
    assert b_o != b32 and not all(torch.equal(w32[k], w_o[k]) for k in w32 if w32[k].is_floating_point())


# ----------------------------------------------------------------------------- the report

#: per (objective, seed, precision): (test AUC at 8k, val AUC at 8k, (best val AUC, its step))
FAKE = {("ce", 0, "fp32"): (0.70, 0.69, (0.71, 5000)), ("ce", 0, "bf16"): (0.72, 0.70, (0.735, 6000)),
        ("ce", 1, "fp32"): (0.66, 0.65, (0.68, 3000)), ("ce", 1, "bf16"): (0.67, 0.66, (0.66, 8000)),
        ("auc_lp", 0, "fp32"): (0.60, 0.59, (0.62, 2000)), ("auc_lp", 0, "bf16"): (0.65, 0.63, (0.63, 8000)),
        ("auc_lp", 1, "fp32"): (0.61, 0.60, (0.615, 4000)), ("auc_lp", 1, "bf16"): (0.615, 0.605, (0.605, 8000))}


def fake_run(folder, objective, seed, precision, upto: int = 8000, finished: bool = True) -> None:
    """A run folder as the lane leaves it: metrics.csv every 1,000 steps (val 0.5 except the best
    and the last), results.json once finished (with an absolute path), checkpoints."""
    test, val, (best, at) = FAKE[(objective, seed, precision)]
    folder.mkdir(parents=True)
    with open(folder / "metrics.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, ["step", "val_auc", "test_auc"])
        w.writeheader()
        for step in range(1000, upto + 1, 1000):
            v = val if step == 8000 else best if step == at else 0.5
            w.writerow({"step": step, "val_auc": v, "test_auc": test if step == 8000 else 0.55})
    (folder / "last.pt").write_bytes(b"checkpoint")
    if finished:
        (folder / "results.json").write_text(json.dumps({
            "final": {"step": 8000, "val_auc": val, "test_auc": test},
            "config": {"seed": seed, "dataset": {"root": str(folder / "data")}, "trainer": {"precision": precision}}}))


@pytest.fixture
def fake_lane(tmp_path):
    lane_dir = tmp_path / "lane"
    for obj, lr in (("ce", "0.1"), ("auc_lp", "0.01")):
        for seed in (0, 1):
            for p in ("fp32", "bf16"):
                fake_run(lane_dir / "studies" / NAME / f"{obj}_lr{lr}_{p}_s{seed}", obj, seed, p)
    return lane_dir


def test_the_report_table_is_the_hand_computed_one(fake_lane, tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main(["--lane-dir", str(fake_lane), "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert capsys.readouterr().out.strip() == table.strip()
    lines = table.splitlines()
    # |0.72-0.70| = 2.00, |0.70-0.69| = 1.00, best 71.00 at 5000 vs 73.50 at 6000: 2.50
    assert "| ce (lr 0.1) | 0 | 8000/8000 | 70.00 | 72.00 | 2.00 | 69.00 | 70.00 | 1.00 | 71.00 (5000) | " \
           "73.50 (6000) | 2.50 |" in lines
    assert "| auc_lp (lr 0.01) | 1 | 8000/8000 | 61.00 | 61.50 | 0.50 | 60.00 | 60.50 | 0.50 | 61.50 (4000) | " \
           "60.50 (8000) | 1.00 |" in lines
    # seed spreads: ce test fp32 |0.70-0.66| = 4.00, bf16 |0.72-0.67| = 5.00; twin gaps 2.00 / 1.00: within
    assert "| ce (lr 0.1) | test AUC | 4.00 | 5.00 | 2.00/1.00 | no |" in lines
    # ce best val: fp32 |0.71-0.68| = 3.00, bf16 |0.735-0.66| = 7.50; twin gaps 2.50 / 2.00: within
    assert "| ce (lr 0.1) | best val AUC | 3.00 | 7.50 | 2.50/2.00 | no |" in lines
    # auc_lp test: fp32 spread |0.60-0.61| = 1.00, twin gaps 5.00 / 0.50: beyond
    assert "| auc_lp (lr 0.01) | test AUC | 1.00 | 3.50 | 5.00/0.50 | **yes** |" in lines
    # auc_lp best val: fp32 |0.62-0.615| = 0.50, twin gaps |0.63-0.62| = |0.605-0.615| = 1.00: beyond too
    assert ("**Verdict.** bf16 moves the metrics by more than the seed spread (auc_lp test AUC: twin gaps "
            "5.00/0.50 vs fp32 seed spread 1.00; auc_lp val AUC: twin gaps 4.00/0.50 vs fp32 seed spread 1.00; "
            "auc_lp best val AUC: twin gaps 1.00/1.00 vs fp32 seed spread 0.50): the tables' CPU runs stay fp32."
            in table)
    assert (out / "curves.png").stat().st_size > 0


def bf16_auc_lp_within_the_spread(fake_lane, monkeypatch):
    """Rewrite both auc_lp bf16 twins so that every auc_lp twin gap is within the fp32 seed spread."""
    monkeypatch.setitem(FAKE, ("auc_lp", 0, "bf16"), (0.605, 0.595, (0.62, 2000)))
    monkeypatch.setitem(FAKE, ("auc_lp", 1, "bf16"), (0.612, 0.601, (0.615, 4000)))
    for seed in (0, 1):
        folder = fake_lane / "studies" / NAME / f"auc_lp_lr0.01_bf16_s{seed}"
        shutil.rmtree(folder)
        fake_run(folder, "auc_lp", seed, "bf16")


def test_within_the_spread_the_verdict_claims_no_more_than_two_seeds_show(fake_lane, tmp_path, monkeypatch):
    bf16_auc_lp_within_the_spread(fake_lane, monkeypatch)
    answer = report.report(fake_lane, tmp_path / "out", log=lambda m: None)
    assert answer.startswith("Every bf16 twin gap is within its objective's fp32 seed spread")
    assert "not a proof of no effect" in answer


def test_the_copies_hold_no_checkpoint_and_no_absolute_path(fake_lane, tmp_path):
    out = tmp_path / "out"
    report.report(fake_lane, out, log=lambda m: None)
    names = sorted(p.name for p in (out / "runs").iterdir())
    assert len(names) == 8
    for name in names:
        src, dst = fake_lane / "studies" / NAME / name, out / "runs" / name
        assert sorted(p.name for p in dst.iterdir()) == ["metrics.csv", "results.json"]
        assert (dst / "metrics.csv").read_bytes() == (src / "metrics.csv").read_bytes()
        text = (dst / "results.json").read_text()
        assert str(tmp_path) not in text and json.loads(text)["config"]["dataset"]["root"] == "data"


def test_unfinished_runs_are_refused_unless_partial(fake_lane, tmp_path, capsys):
    folder = fake_lane / "studies" / NAME / "auc_lp_lr0.01_bf16_s1"
    shutil.rmtree(folder)
    fake_run(folder, "auc_lp", 1, "bf16", upto=5000, finished=False)
    shutil.rmtree(fake_lane / "studies" / NAME / "ce_lr0.1_bf16_s1")
    out = tmp_path / "out"
    assert report.main(["--lane-dir", str(fake_lane), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("precision_report: ReportError: 2 of 8 runs are unfinished: ce_lr0.1_bf16_s1 (not started), "
                   "auc_lp_lr0.01_bf16_s1 (step 5000 of 8000); wait for the CPU lane (`python -m scripts.campaign "
                   "cpu status`) or pass --partial for a labelled partial table")
    assert not out.exists()
    assert report.main(["--lane-dir", str(fake_lane), "--out", str(out), "--partial"]) == 0
    table = (out / "table.md").read_text()
    assert table.startswith("# cpu_precision: fp32 vs bf16 twins (PARTIAL)")
    assert "**Verdict.** PARTIAL: 2 of 8 runs unfinished (ce_lr0.1_bf16_s1, auc_lp_lr0.01_bf16_s1); no verdict." in table
    assert "| auc_lp (lr 0.01) | 1 | 8000/5000 |" in table and "| ce (lr 0.1) | 1 | 8000/- |" in table
    assert len(list((out / "runs").iterdir())) == 6   # only finished runs are copied


def test_a_comparison_that_cannot_be_made_gives_no_verdict(fake_lane, tmp_path, monkeypatch):
    """Both ce seed-0 twins diverged before their first evaluation (no metrics, no split divergence)
    and every other gap is within its spread: the ce rows compare nothing, so 'every twin gap is
    within' would claim what was not measured."""
    bf16_auc_lp_within_the_spread(fake_lane, monkeypatch)
    for p in ("fp32", "bf16"):
        folder = fake_lane / "studies" / NAME / f"ce_lr0.1_{p}_s0"
        (folder / "metrics.csv").write_text("step,val_auc,test_auc\n")
        (folder / "results.json").write_text(json.dumps({"diverged": {"step": 700, "reason": "nan loss"},
                                                         "final": None, "config": {"seed": 0}}))
    answer = report.report(fake_lane, tmp_path / "out", log=lambda m: None)
    assert not answer.startswith("Every bf16 twin gap is within")
    assert answer.startswith("No verdict") and "ce test AUC" in answer and "auc_lp" not in answer


def test_on_a_new_machine_the_report_regenerates_from_the_committed_copies(fake_lane, tmp_path):
    """A lane folder that never began the runs (a new machine): the report reads each run's committed
    copy, writes the same table, and keeps the copies; a run begun again in the lane folder is read
    from there (unfinished: its stale copy goes, as before)."""
    out = tmp_path / "out"
    report.report(fake_lane, out, log=lambda m: None)
    table, copies = (out / "table.md").read_text(), {p: p.read_bytes() for p in out.glob("runs/*/*")}
    empty = tmp_path / "new_machine_lane"
    report.report(empty, out, log=lambda m: None)
    assert (out / "table.md").read_text() == table
    assert {p: p.read_bytes() for p in out.glob("runs/*/*")} == copies
    begun = empty / "studies" / NAME / "ce_lr0.1_fp32_s0"
    fake_run(begun, "ce", 0, "fp32", upto=3000, finished=False)
    with pytest.raises(report.ReportError, match="1 of 8 runs are unfinished: ce_lr0.1_fp32_s0 \\(step 3000"):
        report.report(empty, out, log=lambda m: None)
    report.report(empty, out, partial=True, log=lambda m: None)
    assert not (out / "runs" / "ce_lr0.1_fp32_s0").exists() and len(list((out / "runs").iterdir())) == 7
