"""scripts/campaign/lane.py, the CPU lane: its order on the committed queue; on digits (an MLP, a
few hundred steps) it trains the queue's entries as train.py runs outside the campaign folder,
folds them with both commits recorded, resumes a run killed with SIGKILL to the same metrics.csv
as an uninterrupted run, runs nothing twice, and refuses what it must refuse."""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lpmetrics.run import request
from scripts.campaign import cli as campaign
from scripts.campaign import lane
from scripts.campaign import queue as campaign_queue
from scripts.campaign.jobs import ROOT
from scripts.tables import queue_order

STEPS = 300
SECTION = campaign_queue.Section(
    ("binary",), "table1_binary", {"dataset.neg_keep": ["0.1"], "dataset": ["digits"], "seed": ["0"],
                                   "optimizer.lr": ["0.1"], "objective": ["ce", "auc_lp"]},
    block=3, name="table1_seed0")
EXTRA = ("model=mlp", f"trainer.max_steps={STEPS}", "trainer.eval_every=100", "device=cpu")


@pytest.fixture(scope="module")
def queue_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("campaign")
    campaign_queue.write_json(d / "queue.json", campaign_queue.build((SECTION,), extra=EXTRA, log=lambda m: None))
    return d


@pytest.fixture
def digits_lane(monkeypatch, tmp_path, queue_dir):
    """A copy of the digits campaign folder and an empty lane folder; the lane takes digits' cell."""
    monkeypatch.setattr(lane, "CELLS", (("digits", 0.1),))
    monkeypatch.setattr(lane, "POLL_S", 0.5)
    monkeypatch.setattr(lane, "NICE", 0)   # at nice 19 the trainings starve behind the suite's other worker
    monkeypatch.setattr(lane, "gpu_present", lambda: False)
    monkeypatch.setattr(lane, "STUDIES", ())   # the queue alone; digits_study adds a study
    camp = tmp_path / "campaign"
    shutil.copytree(queue_dir, camp)
    yield camp, tmp_path / "lane"
    for code in tmp_path.glob("*/code/*/"):   # the lanes' code snapshots (a test's reference lane too): git worktrees
        subprocess.run(["git", "worktree", "remove", "--force", str(code)], cwd=ROOT, check=False,
                       capture_output=True)


@pytest.fixture
def digits_study(digits_lane, monkeypatch, tmp_path):
    """The digits lane with a two-run study ``prec``: fp32 and bf16 twins of the ce entry, shorter."""
    runs = tmp_path / "prec_runs.txt"
    runs.write_text("# twins\n" + "".join(
        f"ce_{p}|digits_nk0.1_ce_lr0.1_s0|trainer.precision={p} trainer.max_steps={STUDY_STEPS}\n"
        for p in ("fp32", "bf16")))
    monkeypatch.setattr(lane, "STUDIES", (("prec", runs),))
    return digits_lane


STUDY_STEPS = 200
QUEUE_KEYS = ["digits_nk0.1_ce_lr0.1_s0", "digits_nk0.1_auc_lp_lr0.1_s0"]


def cpu(camp: Path, lane_dir: Path, *args: str) -> int:
    return campaign.main(["--dir", str(camp), "cpu", *args, "--lane-dir", str(lane_dir)])


def test_the_headline_cell_comes_first_in_the_order_the_comparison_needs():
    folder = campaign_queue.DEFAULT_DIR
    queue, ledger = campaign_queue.load(folder)
    order = lane.cpu_order(queue, {**ledger, "runs": {}}, folder)
    keys = [e["key"] for e in order]
    assert keys[:4] == ["cifar10_nk0.1_ce_lr0.1_s0", "cifar10_nk0.1_auc_lp_lr0.01_s0",
                        "cifar10_nk0.1_ce_lr0.01_s0", "cifar10_nk0.1_auc_lp_lr0.001_s0"]
    first12 = order[:12]
    assert {(e["objective"], e["lr"]) for e in first12} == {(o, lr) for o in ("ce", "auc_lp", "ppd_sg", "ppd_adagrad")
                                                          for lr in (0.1, 0.01, 0.001)}
    assert all(e["where"]["dataset.name"] == "cifar10" and e["seed"] == 0 and "augmented" not in e["key"]
               for e in first12)
    # seeds 1-2 wait for seed 0's choice: the next runs are Cat&Dog's seed 0
    assert order[12]["key"] == "catdog_nk0.1_ce_lr0.1_s0" and len(order) == 24


def test_seeds_1_2_follow_at_the_lr_seed_0_chose(tmp_path):
    queue = json.loads((campaign_queue.DEFAULT_DIR / "queue.json").read_text())
    cell = [e for e in queue["entries"] if e["stage"] == "table1_seed0" and e["key"].startswith("cifar10_nk0.1_")]
    runs = {}
    for e in cell:   # every seed-0 lr folded; ce best at lr 0.01
        d = tmp_path / "runs" / e["key"]
        d.mkdir(parents=True)
        val = 0.8 if (e["objective"], e["lr"]) == ("ce", 0.01) else 0.6
        (d / "results.json").write_text(json.dumps({"final": {"val_auc": val}}))
        runs[e["key"]] = {"status": "done"}
    order = [e["key"] for e in lane.cpu_order(queue, {"runs": runs}, tmp_path)]
    # ce chose lr 0.01; the other cells tie, so the smaller lr (the tables' rule)
    assert order[:8] == [f"cifar10_nk0.1_{o}_lr{lr}_s{s}" for s in (1, 2) for o, lr in
                         (("ce", 0.01), ("auc_lp", 0.001), ("ppd_sg", 0.001), ("ppd_adagrad", 0.001))]
    assert order[8] == "catdog_nk0.1_ce_lr0.1_s0"
    assert queue_order.states(queue, {"runs": runs}, tmp_path)["cifar10_nk0.1_ce_lr0.1_s1"][0] == "not needed"


def test_the_lane_trains_folds_and_records_both_commits(digits_lane, capsys):
    camp, lane_dir = digits_lane
    assert cpu(camp, lane_dir, "start") == 0
    ledger = json.loads((camp / "ledger.json").read_text())
    assert {k: v["status"] for k, v in ledger["runs"].items()} == {
        "digits_nk0.1_ce_lr0.1_s0": "done", "digits_nk0.1_auc_lp_lr0.1_s0": "done"}
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    for key in ledger["runs"]:
        meta = json.loads((camp / "runs" / key / "campaign.json").read_text())
        assert meta["kind"] == "cpu" and meta["lane"]["launch_commits"] == [head] and meta["lane"]["fold_commit"] == head
        res = json.loads((camp / "runs" / key / "results.json").read_text())
        assert res["final"]["step"] == STEPS
    out = capsys.readouterr().out
    assert "nothing left to train" in out
    # again: nothing to train, nothing changes
    before = (camp / "ledger.json").read_bytes()
    assert cpu(camp, lane_dir, "start") == 0 and (camp / "ledger.json").read_bytes() == before
    assert cpu(camp, lane_dir, "status") == 0
    assert "folded" in capsys.readouterr().out


def wait_for(cond, timeout=120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def reference_then_one_training(camp: Path, lane_dir: Path, tmp_path: Path) -> tuple[Path, lane.Lane]:
    """The lane's runs trained uninterrupted into ``tmp_path/reference`` (each alone), then a
    supervisor of one training that has started the first of them in ``lane_dir``."""
    reference = tmp_path / "reference"
    assert cpu(camp, reference, "start") == 0
    (camp / "ledger.json").unlink()
    shutil.rmtree(camp / "runs")
    sup = lane.Lane(lane_dir, camp, jobs=1, log=lambda m: None)
    commit = lane.git("rev-parse", "HEAD")
    sup.fill(lane.code_snapshot(lane_dir, commit), commit)
    return reference, sup


@pytest.mark.slow   # ~90 s on a loaded 2-core machine: three train.py processes
def test_a_killed_run_resumes_from_its_checkpoint_to_the_uninterrupted_metrics(digits_lane, tmp_path):
    camp, lane_dir = digits_lane
    key = "digits_nk0.1_ce_lr0.1_s0"
    reference, sup = reference_then_one_training(camp, lane_dir, tmp_path)
    child = sup.children[key]
    run = lane.LaneRun.of(lane_dir, key)
    assert wait_for(lambda: (run.folder / "last.pt").is_file() or child.poll() is not None)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    if (run.folder / "results.json").is_file():
        pytest.skip("the run finished before it could be killed (a fast machine)")
    assert run.locked() is False
    assert cpu(camp, lane_dir, "start") == 0
    assert "resumed_from_step" in json.loads((run.folder / "lane.json").read_text())["segments"][-1]
    assert json.loads((run.folder / "lane.json").read_text())["segments"][-1]["resumed_from_step"] is not None
    assert (run.folder / "metrics.csv").read_text() == (reference / "runs" / key / "metrics.csv").read_text()


FAKE_TRAINING = """
import os, pathlib, signal, sys, time
folder = pathlib.Path(sys.argv[1])
def asked(*_):
    (folder / "last.pt").write_text("asked")
    with open(folder / "train.log", "a") as log:
        log.write("checkpoint at step 7 (requested: SIGUSR1)\\n")
if sys.argv[2] == "answers":
    signal.signal(signal.SIGUSR1, asked)
    (folder / ".checkpoint_request.pid").write_text(str(os.getpid()))
(folder / "ready").write_text("")
while True:
    time.sleep(0.05)
"""


def fake_training(folder: Path, answers: bool) -> subprocess.Popen:
    """A process standing for a training: it answers SIGUSR1 as train.py does (writes last.pt, logs
    the step) or, like a training of older code, has no handler and no pid file."""
    folder.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([sys.executable, "-c", FAKE_TRAINING, str(folder), "answers" if answers else "old"],
                             start_new_session=True)
    assert wait_for(lambda: (folder / "ready").is_file(), timeout=30)
    return child


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="listening_pid reads /proc")
def test_a_stop_asks_each_training_for_a_checkpoint_first(digits_lane, capsys):
    camp, lane_dir = digits_lane
    logged = []
    sup = lane.Lane(lane_dir, camp, jobs=2, log=logged.append)
    new, old = QUEUE_KEYS
    sup.children = {new: fake_training(lane.LaneRun.of(lane_dir, new).folder, answers=True),
                    old: fake_training(lane.LaneRun.of(lane_dir, old).folder, answers=False)}
    with pytest.raises(SystemExit):
        sup.terminate()
    for child in sup.children.values():
        assert child.poll() == -signal.SIGTERM   # both stopped; the old one was never sent SIGUSR1
    assert (lane.LaneRun.of(lane_dir, new).folder / "last.pt").read_text() == "asked"
    assert not (lane.LaneRun.of(lane_dir, old).folder / "last.pt").exists()
    assert f"lane: {new}: checkpoint written at step 7" in logged
    assert lane.requested_step(lane.LaneRun.of(lane_dir, new).folder) == 7


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="listening_pid reads /proc")
def test_cpu_checkpoint_asks_the_locked_trainings_and_they_go_on(digits_lane, capsys):
    camp, lane_dir = digits_lane
    run = lane.LaneRun.of(lane_dir, QUEUE_KEYS[0])
    child = fake_training(run.folder, answers=True)
    try:
        assert cpu(camp, lane_dir, "checkpoint") == 0   # not locked: not a training of this lane
        assert "0 of 0 training(s)" in capsys.readouterr().out
        with open(run.lock_path, "a+") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert cpu(camp, lane_dir, "checkpoint") == 0
        assert "1 of 1 training(s) checkpointed" in capsys.readouterr().out
        assert (run.folder / "last.pt").read_text() == "asked" and child.poll() is None   # goes on
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow   # ~60 s on a loaded 2-core machine: two train.py processes and a resume
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="listening_pid reads /proc")
def test_a_stopped_run_resumes_from_its_requested_checkpoint_to_the_uninterrupted_metrics(digits_lane, tmp_path):
    camp, lane_dir = digits_lane
    key = QUEUE_KEYS[0]
    reference, sup = reference_then_one_training(camp, lane_dir, tmp_path)
    run = lane.LaneRun.of(lane_dir, key)
    child = sup.children[key]
    assert wait_for(lambda: request.listening_pid(run.folder) == child.pid or child.poll() is not None)
    with pytest.raises(SystemExit):
        sup.terminate()
    if (run.folder / "results.json").is_file():
        pytest.skip("the run finished before it could be stopped (a fast machine)")
    asked = lane.requested_step(run.folder)
    assert asked is not None and asked % 100 != 0   # between two evaluations (eval_every=100)
    assert cpu(camp, lane_dir, "start") == 0
    assert json.loads((run.folder / "lane.json").read_text())["segments"][-1]["resumed_from_step"] == asked
    assert (run.folder / "metrics.csv").read_text() == (reference / "runs" / key / "metrics.csv").read_text()


def test_a_second_start_runs_nothing_twice(digits_lane, capsys):
    camp, lane_dir = digits_lane
    lane_dir.mkdir()
    with open(lane_dir / "lane.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 1 since then\n")
        held.flush()
        assert cpu(camp, lane_dir, "start") == 0
    assert "already running (pid 1 since then); nothing started" in capsys.readouterr().out
    assert not (lane_dir / "runs").exists()
    # a run whose training holds its lock is not started by another lane
    run = lane.LaneRun.of(lane_dir, "digits_nk0.1_ce_lr0.1_s0")
    run.folder.mkdir(parents=True)
    with open(run.lock_path, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        sup = lane.Lane(lane_dir, camp, jobs=2, log=lambda m: None)
        started = []
        sup.start_run = lambda entry, code, commit: started.append(entry["key"])
        assert run.locked()
        sup.fill(ROOT, "0" * 40)
        assert started == ["digits_nk0.1_auc_lp_lr0.1_s0"]


def test_entries_are_checked_against_the_snapshots_configs_not_the_checkouts(digits_lane, tmp_path):
    """A lane composes with the configs of the code it trains (its snapshot): a key committed in
    the checkout while it runs refuses nothing, and a snapshot whose configs differ from the
    queue's is refused, whatever the checkout holds."""
    camp, lane_dir = digits_lane
    code = tmp_path / "snapshot"
    shutil.copytree(ROOT / "configs", code / "configs")
    for configs, refused in ((ROOT / "configs", False), (code / "configs", True)):
        if refused:
            with open(configs / "config.yaml", "a") as fh:
                fh.write("\nkey_of_another_commit: 1\n")
        sup = lane.Lane(lane_dir, camp, jobs=1, log=lambda m: None)
        started = []
        sup.start_run = lambda entry, code, commit: started.append(entry["key"])
        sup.fill(configs.parent, "0" * 40)
        assert bool(sup.refused) == refused and (started == []) == refused, sup.refused
        if refused:
            assert all("composes to another protocol" in why for why in sup.refused.values())


def test_refusals_another_protocol_a_gpu_and_a_foreign_results(digits_lane, monkeypatch, capsys):
    camp, lane_dir = digits_lane
    key = "digits_nk0.1_ce_lr0.1_s0"
    run = lane.LaneRun.of(lane_dir, key)
    run.info = {"key": key, "config_sha": "0123456789abcdef"}
    run.save()
    (run.folder / "last.pt").write_bytes(b"not touched")
    sup = lane.Lane(lane_dir, camp, jobs=1, log=print)
    with campaign.composer() as compose:
        entry = next(e for e in sup.candidates() if e["key"] == key)
        assert "holds protocol 0123456789abcdef" in sup.check_entry(entry, compose)
    # a results.json of another protocol is not folded
    (run.folder / "results.json").write_text(json.dumps({"config": {"seed": 5}, "final": {"step": STEPS}}))
    assert lane.fold_finished(lane_dir, camp, log=print) == []
    assert "not folding digits_nk0.1_ce_lr0.1_s0: its protocol differs" in capsys.readouterr().out
    assert (run.folder / "last.pt").read_bytes() == b"not touched"
    monkeypatch.setattr(lane, "gpu_present", lambda: True)
    assert cpu(camp, lane_dir, "start") == 1
    assert "campaign: LaneError: this machine has a GPU" in capsys.readouterr().err


def test_an_entry_that_no_longer_composes_to_its_protocol_is_refused_with_its_key(digits_lane, capsys):
    camp, lane_dir = digits_lane
    queue = json.loads((camp / "queue.json").read_text())
    for e in queue["entries"]:
        e["config_sha"] = "fedcba9876543210"
    campaign_queue.write_json(camp / "queue.json", queue)
    assert cpu(camp, lane_dir, "start", "--once") == 0
    out = capsys.readouterr().out
    assert "refused digits_nk0.1_ce_lr0.1_s0: composes to another protocol" in out
    assert not (lane_dir / "runs").exists()


@pytest.mark.parametrize("model, expected", [
    ({"_target_": "objectives.models.resnet.resnet18"}, ["model.conv_impl=stock"]),   # begun before the key
    ({"_target_": "lpmetrics.models.resnet.resnet18", "conv_impl": "gemm"}, ["model.conv_impl=gemm"]),
    ({"_target_": "lpmetrics.models.mlp.mlp"}, []),
])
def test_a_resumed_run_keeps_its_convolution_path(tmp_path, model, expected):
    run = lane.LaneRun(tmp_path / "run")
    (run.folder / ".hydra").mkdir(parents=True)
    (run.folder / ".hydra" / "config.yaml").write_text(json.dumps({"model": model}))
    assert lane.conv_override({"key": "k"}, ROOT, run, resume=True, extra=[]) == expected
    assert lane.conv_override({"key": "k"}, ROOT, run, resume=True, extra=["model.conv_impl=stock"]) == []


@pytest.mark.parametrize("trainer, expected", [
    ({"max_steps": 40000}, ["trainer.optimizer_impl=eager"]),        # begun before the key
    ({"optimizer_impl": "compiled"}, ["trainer.optimizer_impl=compiled"]),
    ({"optimizer_impl": "eager"}, ["trainer.optimizer_impl=eager"]),
])
def test_a_resumed_run_keeps_its_optimizer_step_and_a_new_one_is_compiled(tmp_path, trainer, expected):
    run = lane.LaneRun(tmp_path / "run")
    (run.folder / ".hydra").mkdir(parents=True)
    (run.folder / ".hydra" / "config.yaml").write_text(json.dumps({"trainer": trainer}))
    assert lane.optimizer_override({"key": "k"}, ROOT, run, resume=True, extra=[]) == expected
    assert lane.optimizer_override({"key": "k"}, ROOT, run, resume=False, extra=[]) == \
        ["trainer.optimizer_impl=compiled"]
    for pinned in ({"key": "k", "overrides": ["trainer.optimizer_impl=eager"]}, {"key": "k"}):
        sets = [] if pinned.get("overrides") else ["trainer.optimizer_impl=eager"]
        assert lane.optimizer_override(pinned, ROOT, run, resume=False, extra=sets) == []
    # a resume keeps its form over a --set of another (it would be refused), and says so
    log = []
    other = "eager" if expected[0].endswith("compiled") else "compiled"
    assert lane.optimizer_override({"key": "k"}, ROOT, run, resume=True, extra=[f"trainer.optimizer_impl={other}"],
                                   log=log.append) == expected
    assert len(log) == 1 and "keeps trainer.optimizer_impl=" in log[0]


def test_fold_cpu_records_a_diverged_entry_once(queue_dir, tmp_path):
    from scripts.campaign import fold as campaign_fold
    camp = tmp_path / "campaign"
    shutil.copytree(queue_dir, camp)
    entry = json.loads((camp / "queue.json").read_text())["entries"][0]
    with campaign.composer() as compose:
        cfg, _ = campaign_queue.compose_entry(compose, entry["overrides"], entry["experiment"])
    config = campaign_queue.composed_config(cfg)
    assert campaign_queue.config_sha(config) == entry["config_sha"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"config": config, "diverged": {"reason": "loss is nan"},
                                                  "final": {"step": 120}}))
    assert campaign_fold.fold_cpu([run], camp, log=lambda m: None, entry_only=True)["diverged"] == 1
    record = json.loads((camp / "ledger.json").read_text())["runs"][entry["key"]]
    assert record["status"] == "diverged" and record["why"] == "loss is nan" and record["kind"] == "cpu"
    assert not (camp / "runs" / entry["key"]).exists()   # no folder: no table pools a shorter run
    assert campaign_fold.fold_cpu([run], camp, log=lambda m: None, entry_only=True)["unchanged"] == 1
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "results.json").write_text(json.dumps({"config": {**config, "seed": 9}, "final": {"step": STEPS}}))
    with pytest.raises(campaign_fold.FoldError, match="its protocol is no entry of queue"):
        campaign_fold.fold_cpu([foreign], camp, entry_only=True)


# ----------------------------------------------------------------------------- the studies' stage


def order(camp: Path, lane_dir: Path, **kw) -> list[str]:
    return [e["key"] for e in lane.Lane(lane_dir, camp, jobs=2, log=lambda m: None, **kw).candidates()]


def test_started_runs_then_the_study_then_the_queue(digits_study):
    camp, lane_dir = digits_study
    assert order(camp, lane_dir) == ["prec/ce_fp32", "prec/ce_bf16", *QUEUE_KEYS]
    assert order(camp, lane_dir, studies=()) == QUEUE_KEYS
    lane.LaneRun.of(lane_dir, QUEUE_KEYS[1]).folder.mkdir(parents=True)   # a queue run begun earlier
    assert order(camp, lane_dir) == [QUEUE_KEYS[1], "prec/ce_fp32", "prec/ce_bf16", QUEUE_KEYS[0]]
    assert order(camp, lane_dir, studies=()) == [QUEUE_KEYS[1], QUEUE_KEYS[0]]
    bf16 = lane.LaneRun.of(lane_dir, "prec/ce_bf16")
    bf16.folder.mkdir(parents=True)                                        # a study run begun earlier
    assert bf16.folder == lane_dir / "studies" / "prec" / "ce_bf16"
    assert order(camp, lane_dir) == [QUEUE_KEYS[1], "prec/ce_bf16", "prec/ce_fp32", QUEUE_KEYS[0]]
    (bf16.folder / "results.json").write_text(json.dumps({"final": {"step": STUDY_STEPS}}))
    assert order(camp, lane_dir) == [QUEUE_KEYS[1], "prec/ce_fp32", QUEUE_KEYS[0]]   # finished: not again


def test_on_this_machine_the_two_started_runs_then_the_precision_study(tmp_path, monkeypatch):
    """The committed queue and study list, with the two runs this machine's lane has begun (and
    no report committed: :func:`lane.answered`)."""
    monkeypatch.setattr(lane, "REPORTS", tmp_path / "no_reports")
    folder = campaign_queue.DEFAULT_DIR
    queue, ledger = campaign_queue.load(folder)
    started = ["cifar10_nk0.1_ce_lr0.1_s0", "cifar10_nk0.1_auc_lp_lr0.01_s0"]
    for key in started:
        lane.LaneRun.of(tmp_path, key).folder.mkdir(parents=True)
    keys = [e["key"] for e in lane.lane_order(queue, {**ledger, "runs": {}}, folder, tmp_path, studies=lane.STUDIES)]
    study = [f"cpu_precision/{o}_lr{lr}_{p}_s{s}" for s in (0, 1) for o, lr in (("ce", 0.1), ("auc_lp", 0.01))
             for p in ("fp32", "bf16")]
    assert keys[:10] == [*started, *study]
    assert keys[10] == "cifar10_nk0.1_ce_lr0.01_s0" and len(keys) == 24 + 8


def test_a_study_whose_report_is_committed_is_not_trained_again(digits_study, monkeypatch, tmp_path):
    """A new machine's lane folder is empty: a study run answered by its committed report
    (``results/<study>/runs/<run>/results.json``) is left out, started here or not."""
    camp, lane_dir = digits_study
    reports = tmp_path / "reports"
    monkeypatch.setattr(lane, "REPORTS", reports)
    assert order(camp, lane_dir) == ["prec/ce_fp32", "prec/ce_bf16", *QUEUE_KEYS]
    (reports / "prec" / "runs" / "ce_fp32").mkdir(parents=True)
    assert order(camp, lane_dir) == ["prec/ce_fp32", "prec/ce_bf16", *QUEUE_KEYS]   # no results.json: not answered
    (reports / "prec" / "runs" / "ce_fp32" / "results.json").write_text("{}")
    assert order(camp, lane_dir) == ["prec/ce_bf16", *QUEUE_KEYS]
    lane.LaneRun.of(lane_dir, "prec/ce_fp32").folder.mkdir(parents=True)   # begun again on this machine
    assert order(camp, lane_dir) == ["prec/ce_bf16", *QUEUE_KEYS]
    assert order(camp, lane_dir, studies=()) == QUEUE_KEYS


def test_the_committed_precision_study_is_answered_whole():
    """The committed report answers every run of the committed run list: the lane of a new machine
    trains none of them (it re-ran two for a minute on 2026-11-29 before this rule)."""
    queue, _ = campaign_queue.load(campaign_queue.DEFAULT_DIR)
    (name, path), = lane.STUDIES
    entries = lane.study_entries(name, path, queue)
    assert len(entries) == 8 and all(lane.answered(e) for e in entries)
    assert not lane.answered({"key": QUEUE_KEYS[0]})   # a queue entry is never a study's


def test_a_started_study_run_resumes_and_a_locked_one_is_not_run_twice(digits_study, monkeypatch):
    camp, lane_dir = digits_study
    begun = lane.LaneRun.of(lane_dir, "prec/ce_bf16")
    begun.folder.mkdir(parents=True)
    (begun.folder / "last.pt").write_bytes(b"a checkpoint")
    calls = []

    def command(entry, code, run, resume, extra):
        calls.append((entry["key"], resume, run.folder))
        return [sys.executable, "-c", "pass"]
    monkeypatch.setattr(lane, "train_command", command)
    monkeypatch.setattr(lane, "conv_override", lambda *a, **k: [])
    monkeypatch.setattr(lane, "optimizer_override", lambda *a, **k: [])
    sup = lane.Lane(lane_dir, camp, jobs=2, log=lambda m: None)
    sup.fill(ROOT, "0" * 40)
    assert calls == [("prec/ce_bf16", True, begun.folder),
                     ("prec/ce_fp32", False, lane_dir / "studies" / "prec" / "ce_fp32")]
    info = json.loads((begun.folder / "lane.json").read_text())
    assert info["study"] == "prec" and info["base"] == QUEUE_KEYS[0] and info["steps"] == STUDY_STEPS
    for child in sup.children.values():
        child.wait()
    sup.children.clear()
    # a training holding a study run's lock keeps every other lane off it
    with open(begun.lock_path, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        started = []
        sup.start_run = lambda entry, code, commit: started.append(entry["key"])
        sup.fill(ROOT, "0" * 40)
    assert started == ["prec/ce_fp32", QUEUE_KEYS[0]]


def test_a_study_folder_of_other_overrides_is_refused(digits_study):
    camp, lane_dir = digits_study
    run = lane.LaneRun.of(lane_dir, "prec/ce_fp32")
    run.info = {"key": "prec/ce_fp32", "config_sha": "0123456789abcdef"}
    run.save()
    sup = lane.Lane(lane_dir, camp, jobs=1, log=lambda m: None)
    with campaign.composer() as compose:
        entry = next(e for e in sup.candidates() if e["key"] == "prec/ce_fp32")
        assert "holds protocol 0123456789abcdef" in sup.check_entry(entry, compose)
        twin = next(e for e in sup.candidates() if e["key"] == "prec/ce_bf16")
        assert sup.check_entry(twin, compose) is None and twin["config_sha"] != entry["config_sha"]


def test_no_studies_leaves_the_stage_out_of_start_status_and_the_background_lane(digits_study, monkeypatch, capsys):
    camp, lane_dir = digits_study
    seen = []
    monkeypatch.setattr(lane.Lane, "supervise", lambda self, commit, once=False: seen.append(self.studies) or 0)
    assert cpu(camp, lane_dir, "start", "--no-studies") == 0 and cpu(camp, lane_dir, "start") == 0
    assert seen == [(), lane.STUDIES]
    capsys.readouterr()
    assert cpu(camp, lane_dir, "status", "--no-studies") == 0
    assert "prec/" not in capsys.readouterr().out
    assert cpu(camp, lane_dir, "status") == 0
    assert "prec/ce_fp32" in capsys.readouterr().out
    args = argparse.Namespace(dir=str(camp), jobs=2, all=False, force=False, set=[], no_studies=True)
    assert lane.background_argv(args, lane_dir)[-1] == "--no-studies"
    assert "--no-studies" not in lane.background_argv(argparse.Namespace(**{**vars(args), "no_studies": False}), lane_dir)


def test_the_lane_trains_a_study_never_folds_it_and_never_twice(digits_study, monkeypatch, capsys):
    """The study alone (no cell: the order with the queue is the test above; two trainings, not four)."""
    camp, lane_dir = digits_study
    monkeypatch.setattr(lane, "CELLS", ())
    assert cpu(camp, lane_dir, "start") == 0
    out = capsys.readouterr().out
    assert re.findall(r"lane: started (\S+) \(new", out) == ["prec/ce_fp32", "prec/ce_bf16"]
    assert "nothing left to train" in out
    assert campaign_queue.load(camp)[1]["runs"] == {} and not (camp / "runs").exists()   # never folded
    runs = {p: lane.LaneRun.of(lane_dir, f"prec/ce_{p}") for p in ("fp32", "bf16")}
    for p, run in runs.items():
        res = run.results()
        assert res["final"]["step"] == STUDY_STEPS and res["config"]["trainer"]["precision"] == p
        assert run.info["study"] == "prec" and "folded" not in run.info
    before = {p: (run.folder / "metrics.csv").read_bytes() for p, run in runs.items()}
    assert cpu(camp, lane_dir, "start") == 0                          # again: nothing trains
    assert "lane: started" not in capsys.readouterr().out
    assert {p: (run.folder / "metrics.csv").read_bytes() for p, run in runs.items()} == before
    assert all(len(lane.LaneRun.of(lane_dir, f"prec/ce_{p}").info["segments"]) == 1 for p in runs)
    assert cpu(camp, lane_dir, "status") == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("prec/")]
    assert len(rows) == 2 and all(" finished " in ln and f"{STUDY_STEPS}/{STUDY_STEPS}" in ln for ln in rows)


@pytest.mark.slow   # ~90 s on a loaded 2-core machine: three train.py processes
def test_a_killed_study_run_resumes_to_the_uninterrupted_metrics(digits_study, tmp_path, monkeypatch):
    camp, lane_dir = digits_study
    name, runs = lane.STUDIES[0]
    one = tmp_path / "one_run.txt"
    one.write_text(runs.read_text().splitlines()[1] + "\n")   # ce_fp32 alone
    monkeypatch.setattr(lane, "STUDIES", ((name, one),))
    monkeypatch.setattr(lane, "CELLS", ())                      # and no queue entry after it
    key = "prec/ce_fp32"
    reference = tmp_path / "reference"
    assert cpu(camp, reference, "start") == 0                   # uninterrupted
    sup = lane.Lane(lane_dir, camp, jobs=1, log=lambda m: None)
    commit = lane.git("rev-parse", "HEAD")
    sup.fill(lane.code_snapshot(lane_dir, commit), commit)
    child, run = sup.children[key], lane.LaneRun.of(lane_dir, key)
    assert wait_for(lambda: (run.folder / "last.pt").is_file() or child.poll() is not None)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    if (run.folder / "results.json").is_file():
        pytest.skip("the run finished before it could be killed (a fast machine)")
    assert cpu(camp, lane_dir, "start") == 0
    segments = json.loads((run.folder / "lane.json").read_text())["segments"]
    assert len(segments) == 2 and segments[-1]["resumed_from_step"] is not None
    ref = lane.run_folder(reference, key)
    assert (run.folder / "metrics.csv").read_text() == (ref / "metrics.csv").read_text()


def test_a_resumed_segment_starts_at_its_checkpoints_step_not_the_bars_last(digits_lane, monkeypatch):
    """The training stopped at step 1,520 of its bar resumes from its checkpoint at 1,000 (the last
    metrics row): the segment records 1,000, so its s/step counts the 520 steps trained again."""
    camp, lane_dir = digits_lane
    key = "digits_nk0.1_ce_lr0.1_s0"
    run = lane.LaneRun.of(lane_dir, key)
    run.folder.mkdir(parents=True)
    (run.folder / "last.pt").write_bytes(b"a checkpoint")
    (run.folder / "metrics.csv").write_text("step,val_auc\n500,0.6\n1000,0.7\n")
    (run.folder / "train.log").write_text("=== header\ntrain:  19%| | 1520/8000 [02:00<26:00,  4.17it/s]\r")
    monkeypatch.setattr(lane, "train_command", lambda *a: [sys.executable, "-c", "pass"])
    monkeypatch.setattr(lane, "conv_override", lambda *a, **k: [])
    sup = lane.Lane(lane_dir, camp, jobs=1, log=lambda m: None)
    sup.queue = campaign_queue.load(camp)[0]
    entry = next(e for e in sup.queue["entries"] if e["key"] == key)
    sup.start_run(entry, ROOT, "0" * 40)
    sup.children.pop(key).wait()
    assert json.loads((run.folder / "lane.json").read_text())["segments"][-1]["resumed_from_step"] == 1000


def test_status_rate_is_the_segments_mean_not_the_bars_moving_average(tmp_path):
    """A resumed segment's bar starts at its resume step; after a pause the bar's own rate is
    inflated, while the mean since the segment began (what an ETA needs) is elapsed / steps."""
    run = lane.LaneRun.of(tmp_path, "k")
    run.folder.mkdir(parents=True)
    bar = ("train:  12%| | 1000/8000 [00:00<?, ?it/s]\r"
           "train:  13%| | 1500/8000 [02:00<26:00,  4.17it/s]\r"
           "train:  19%| | 1520/8000 [1:01:20<9:00:00,  12.50s/it, loss=0.3]\r")   # after a 59-minute pause
    (run.folder / "train.log").write_text("=== header\n" + bar)
    assert run.progress() == (1520, 12.5)                  # no segment recorded: the bar's rate
    run.info = {"segments": [{"resumed_from_step": 0}, {"resumed_from_step": 1000}]}
    step, rate = run.progress()
    assert step == 1520 and rate == pytest.approx(3680 / 520)
    (run.folder / "train.log").write_text("=== header\n")
    assert run.progress() == (None, None)


@pytest.mark.parametrize("info, results, expected", [
    ({}, None, "-"),                                                            # queued
    ({"segments": [{"overrides": ["model.conv_impl=gemm"]},
                   {"overrides": ["model.conv_impl=mixed", "seed=1"]}]}, None, "mixed"),   # latest segment
    ({"segments": [{"overrides": []}]}, None, "-"),                             # a study line pins it
    ({"segments": [{"overrides": ["model.conv_impl=mixed"]}]},
     {"conv_impl": {"impl": "gemm"}, "config": {"trainer": {"precision": "bf16"}}}, "gemm-bf16"),
    ({}, {"config": {"model": {"conv_impl": "stock"}, "trainer": {"precision": "fp32"}}}, "stock"),
])
def test_status_names_each_runs_convolution_path(info, results, expected):
    assert lane.conv_path(info, results) == expected


@pytest.mark.parametrize("info, results, expected", [
    ({}, None, "-"),                                                                 # queued
    ({"segments": [{"overrides": ["trainer.optimizer_impl=eager"]},
                   {"overrides": ["model.conv_impl=mixed", "trainer.optimizer_impl=compiled"]}]},
     None, "compiled"),                                                              # latest segment
    ({"segments": [{"overrides": ["model.conv_impl=mixed"]}]}, None, "-"),            # begun before the key
    ({"segments": [{"overrides": ["trainer.optimizer_impl=compiled"]}]},
     {"optimizer_impl": {"requested": "compiled", "impl": "eager", "fallback": "no compiler"}}, "eager"),
])
def test_status_names_each_runs_optimizer_step(info, results, expected):
    assert lane.optimizer_form(info, results) == expected



def test_held_lists_the_begun_unfolded_queue_runs_for_a_windows_exclude(digits_study, capsys):
    camp, lane_dir = digits_study
    for key in (*QUEUE_KEYS, "prec/ce_fp32"):
        lane.LaneRun.of(lane_dir, key).folder.mkdir(parents=True)
    assert cpu(camp, lane_dir, "held") == 0
    assert capsys.readouterr().out.split() == sorted(QUEUE_KEYS)      # no study run: not a queue entry
    folded = lane.LaneRun.of(lane_dir, QUEUE_KEYS[0])
    folded.info = {"folded": "2026-11-28T00:00:00Z"}
    folded.save()
    assert cpu(camp, lane_dir, "held") == 0
    assert capsys.readouterr().out.split() == [QUEUE_KEYS[1]]
