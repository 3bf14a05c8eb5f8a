"""packed/select.py: each window chooses its pack's forward mode. On the CPU (digits, the MLP:
``gemm`` is recorded as unavailable there): exact modes pass the gate, a candidate perturbed past
the gate fails it and is never timed nor chosen, one that raises is recorded and left out, the
budget is kept (a tiny one still returns the default, with the reason), any error falls back to
the default; ``python -m scripts.campaign run --select-mode`` selects before the probe, prices and trains that
mode and records the selector in plan.json."""
from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lpmetrics.packed import select
from lpmetrics.packed.launch import Job
from lpmetrics.packed.model import PackedModels

from scripts.campaign import cli as campaign
from scripts.campaign import queue as campaign_queue

ROOT = Path(__file__).resolve().parents[1]

SET = ["dataset=digits", "model=mlp", "device=cpu", "logger=csv", "trainer.checkpoints=false"]


@pytest.fixture
def jobs(compose_cfg, tmp_path):
    """A pack of three: ce at two seeds and auc_lp (one optimizer: one pack)."""
    return [Job(compose_cfg([*SET, f"objective={o}", f"seed={s}"]), tmp_path / f"{o}{s}", {}, f"{o}{s}")
            for o, s in (("ce", 0), ("ce", 1), ("auc_lp", 0))]


def rows(record: dict) -> dict:
    return {c["mode"]: c for c in record["candidates"]}


@pytest.fixture
def perturbed(monkeypatch):
    """``perturbed(mode, how)``: the packed forward of ``mode`` returns ``how(logits)``."""
    call = PackedModels.__call__

    def patch(mode, how):
        monkeypatch.setattr(PackedModels, "__call__",
                            lambda self, x: how(call(self, x)) if self.mode == mode else call(self, x))
    return patch


def test_exact_modes_pass_and_the_fastest_passing_mode_is_chosen(jobs):
    record = select.select_mode(jobs)
    json.dumps(record)   # plan.json takes it as it is
    got = rows(record)
    assert list(got) == ["vmap", "gemm", "loop", "streams"] and record["pack_size"] == 3
    assert got["gemm"]["why"].startswith("not available") and got["gemm"]["ms_per_run_step"] is None
    assert record["gate"]["reference"] == "lone run in float32 vs float64 (CPU: no TF32)"
    assert all(0 < r < 1e-5 for r in record["gate"]["reference_distance"])   # float32 rounding, nonzero
    for mode in ("loop", "streams"):   # each run's own kernels: its lone steps bit for bit, on any CPU
        assert got[mode]["gate_distance"] == [0.0, 0.0, 0.0] and got[mode]["passed"]
    # vmap's batched kernels may round otherwise than a lone run's, by CPU: bit-equal on an Intel
    # Xeon (MKL), 5e-9 to 1.2e-8 on an AMD EPYC (2026-11-29); within float32 rounding either way
    assert got["vmap"]["passed"] and all(0 <= d < 1e-6 for d in got["vmap"]["gate_distance"])
    for mode in ("vmap", "loop", "streams"):
        assert got[mode]["ms_per_run_step"] > 0 and got[mode]["timed_steps"] == select.REPS
    fastest = min(("vmap", "loop", "streams"), key=lambda m: got[m]["ms_per_run_step"])
    assert record["chosen"] == fastest and record["fell_back"] is None and fastest in record["why"]


def test_a_candidate_perturbed_past_the_gate_fails_it_and_is_not_chosen(jobs, perturbed):
    perturbed("vmap", lambda logits: logits * 1.001)   # 0.1 %: an error, not rounding
    record = select.select_mode(jobs, modes=["vmap", "loop"])
    got = rows(record)
    assert not got["vmap"]["passed"] and got["vmap"]["why"].startswith("failed the gate")
    assert got["vmap"]["gate_ratio"] > select.K and min(got["vmap"]["gate_distance"]) > 1e-6
    assert got["vmap"]["ms_per_run_step"] is None   # never timed
    assert got["loop"]["passed"] and record["chosen"] == "loop" and record["fell_back"] is None


def test_a_non_finite_candidate_fails_the_gate(jobs, perturbed):
    perturbed("vmap", lambda logits: logits * float("nan"))
    got = rows(select.select_mode(jobs, modes=["vmap", "loop"]))
    assert not got["vmap"]["passed"] and got["vmap"]["gate_ratio"] == float("inf")


def test_a_candidate_that_raises_is_recorded_and_left_out(jobs, perturbed):
    def boom(logits):
        raise RuntimeError("no kernel for this")
    perturbed("vmap", boom)
    record = select.select_mode(jobs, modes=["vmap", "loop"])
    got = rows(record)
    assert got["vmap"]["why"] == "raised: RuntimeError: no kernel for this" and not got["vmap"]["passed"]
    assert record["chosen"] == "loop" and record["fell_back"] is None


def test_no_passing_candidate_and_any_error_fall_back_to_the_default(jobs, perturbed, compose_cfg, tmp_path):
    perturbed("vmap", lambda logits: logits * 1.5)
    record = select.select_mode(jobs, modes=["vmap"])
    assert record["chosen"] == "loop" == record["default"] and record["fell_back"].startswith("no passing")
    bad = Job(compose_cfg([*SET, "model=resnet18"]), tmp_path / "bad", {}, "bad")   # flat digits: no ResNet
    record = select.select_mode([bad])
    assert record["chosen"] == "loop" and record["fell_back"].startswith("the selector raised: ConfigError")
    json.dumps(record)


def test_a_tiny_budget_still_chooses_and_says_why(jobs):
    record = select.select_mode(jobs, budget_s=1e-6)
    assert record["chosen"] == "loop" and record["fell_back"].startswith("no passing candidate was timed")
    assert {r["mode"]: r["why"] for r in record["candidates"]} == {
        "vmap": "not gated: the budget ran out", "gemm": rows(record)["gemm"]["why"],
        "loop": "not gated: the budget ran out", "streams": "not gated: the budget ran out"}


def test_timing_stops_when_the_budget_runs_out_and_chooses_among_what_was_timed():
    """Whole rounds, interleaved: the budget ends during the first round (warm-up and one timed
    step of each candidate, 0.1 s a step), so each is timed once; one that raises is dropped."""
    class Runner:
        sync_free = False

        def __init__(self, fail=False):
            self.fail, self.steps = fail, []

        def step(self, x, y, step):
            if self.fail:
                raise RuntimeError("out of memory")
            time.sleep(0.1)
            self.steps.append(step)
    trial = SimpleNamespace(batches=[(torch.zeros(2, 1), torch.zeros(2))], device=torch.device("cpu"),
                            names=["a", "b"])
    runners = {"vmap": Runner(), "gemm": Runner(fail=True), "loop": Runner()}
    got = {k: {"ms_per_run_step": None} for k in runners}
    kept = dict(runners)
    select._time_rounds(kept, trial, got, deadline=time.monotonic() + 0.3)
    for mode in ("vmap", "loop"):
        assert got[mode]["timed_steps"] == 1 and got[mode]["ms_per_run_step"] >= 0.1 * 1000 / 2 * 0.9
        assert runners[mode].steps == list(range(select.STEPS, select.STEPS + select.WARM + 1))
    assert got["gemm"] == {"ms_per_run_step": None, "why": "raised while timed: RuntimeError: out of memory"}


def test_the_tf32_switch_sets_both_flags_and_restores_them():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    for on in (True, False):
        with select._tf32(on):
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (on, on)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_reference_is_tf32_on_vs_off_and_loop_passes(compose_cfg, tmp_path):
    jobs = [Job(compose_cfg([*SET, "device=cuda", f"objective={o}"]), tmp_path / o, {}, o) for o in ("ce", "auc_lp")]
    record = select.select_mode(jobs, budget_s=120)
    got = rows(record)
    assert record["device"].startswith("cuda") and record["default"] == "vmap"
    assert record["gate"]["reference"] == "lone run with TF32 on vs off (CUDA, float32)"
    assert got["loop"]["passed"] and got["loop"]["ms_per_run_step"] > 0
    assert record["fell_back"] is None and got[record["chosen"]]["passed"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_streams_equals_lone_runs_bit_for_bit_and_replays_as_a_graph(compose_cfg, tmp_path):
    """Per-run streams: each run's forward and backward on its own CUDA stream, the whole pack
    step captured as one CUDA graph (``cuda_graph=True`` times the replay), each run bitwise
    its lone twin."""
    jobs = [Job(compose_cfg([*SET, "device=cuda", f"objective={o}", f"seed={s}"]), tmp_path / f"{o}{s}", {}, f"{o}{s}")
            for o, s in (("ce", 0), ("ce", 1), ("auc_lp", 0))]
    got = rows(select.select_mode(jobs, budget_s=120, cuda_graph=True, modes=["streams"]))
    assert got["streams"]["gate_distance"] == [0.0, 0.0, 0.0] and got["streams"]["passed"], got["streams"]
    assert got["streams"]["ms_per_run_step"] > 0


def test_the_probe_times_the_mode_it_is_given(compose_cfg):
    from scripts.campaign import gpu_tables
    cfg = compose_cfg([*SET, "objective=ce"])
    speed = gpu_tables.measure(cfg, [*SET, "objective=ce"], torch.device("cpu"), 2, 1, ["ce"],
                               "table1_binary", mode="vmap")
    assert speed["mode"] == "vmap" and speed["step_ms_per_run_ce"] > 0
    with pytest.raises(ValueError, match="mode must be one of"):
        gpu_tables.measure(cfg, [], torch.device("cpu"), 2, 1, ["ce"], mode="fast")


@pytest.mark.parametrize("how", ["probe", "rates", "off"])
def test_campaign_run_selects_then_trains_the_chosen_mode(how, tmp_path, capsys):
    """``probe``: the selector runs before the probe, which times its choice; ``rates`` (``--speed``,
    no probe): it runs on the first planned pack; ``off`` (the CPU's default): mode ``auto``."""
    section = campaign_queue.Section(
        ("binary",), "table1_binary", {"dataset.neg_keep": ["0.1"], "dataset": ["digits"], "seed": ["0"],
                                       "optimizer.lr": ["0.1"], "objective": ["ce", "auc_lp"]}, block=2)
    d = tmp_path / "campaign"
    campaign_queue.write_json(d / "queue.json", campaign_queue.build(
        (section,), extra=("model=mlp", "trainer.max_steps=4"), log=lambda m: None))
    (tmp_path / "speed.json").write_text(json.dumps({"step_ms_per_run_ce": 1.0, "step_ms_per_run_auc_lp": 2.0,
                                                     "eval_ms": 10.0}))
    flags = {"probe": ["--probe-n", "2", "--probe-reps", "1", "--select-mode"],
             "rates": ["--speed", str(tmp_path / "speed.json"), "--select-mode"],
             "off": ["--speed", str(tmp_path / "speed.json")]}[how]
    out = tmp_path / "out"
    assert campaign.main(["--dir", str(d), "run", "--out", str(out), "--budget-s", "300", "--device", "cpu",
                          "--eval-every", "2", *flags]) == 0
    plan = json.loads((out / "plan.json").read_text())
    chosen = plan["pack_mode"]["chosen"]
    assert len(plan["kept"]) == 2 and set(plan["outcome"].values()) == {"done at step 4"}
    with gzip.open(out / "runs.jsonl.gz", "rt") as f:
        assert {json.loads(line)["results"]["packed"]["mode"] for line in f} == {chosen}
    if how == "off":
        assert chosen == "auto" and plan["pack_mode"]["why"].startswith("selector off")
        return
    assert chosen in ("vmap", "loop", "streams") and plan["pack_mode"]["fell_back"] is None
    assert {c["mode"] for c in plan["pack_mode"]["candidates"]} == {"vmap", "gemm", "loop", "streams"}
    assert plan["pack_mode"]["runs"] == plan["kept"]
    assert f"pack mode: {chosen}" in capsys.readouterr().out
    probed = plan["speed"].get("mode")
    assert plan["pack_mode"]["probed_mode"] == probed == (chosen if how == "probe" else None)


def test_streams_equals_lone_runs_bit_for_bit_on_images_where_loop_rounds(compose_cfg, tmp_path, data_root):
    """The exact fallback: each run's own kernels with its batch in the lone run's (channels-last)
    layout; on the CPU the runs go one after another, which is what a stream pack does per run."""
    img = ["dataset=cifar10", f"dataset.root={data_root}", "model=resnet18", "model.conv_impl=stock",  # torchvision's kernels
           "device=cpu", "logger=csv",
           "trainer.checkpoints=false", "trainer.batch_size=8"]
    jobs = [Job(compose_cfg([*img, f"objective={o}"]), tmp_path / o, {}, o) for o in ("ce", "auc_lp")]
    got = rows(select.select_mode(jobs, modes=["loop", "streams"], budget_s=600))
    assert got["streams"]["gate_distance"] == [0.0, 0.0] and got["streams"]["passed"]
    assert max(got["loop"]["gate_distance"]) > 0.0   # contiguous rows: rounding, within the gate
    assert got["loop"]["passed"]


def test_streams_must_be_bitwise_a_rounding_sized_difference_fails_it(jobs, perturbed):
    perturbed("streams", lambda logits: logits * (1 + 2 ** -22))   # a rounding, not an error
    got = rows(select.select_mode(jobs, modes=["loop", "streams"]))
    assert got["loop"]["passed"] and not got["streams"]["passed"]
    assert "bit for bit" in got["streams"]["why"] or "failed the gate" in got["streams"]["why"]


def test_a_streams_pack_steps_each_runs_own_optimizer_and_objective(jobs, tmp_path):
    trial = select.trial_from_jobs(jobs, tmp_path / "trial")
    stepper = trial.packed_step("streams")
    assert stepper.update is None and "streams" in stepper.update_note
