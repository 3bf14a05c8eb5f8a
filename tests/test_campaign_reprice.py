"""scripts/campaign/cost.py and cli.py: once the pack-mode selector has timed the real first pack,
the plan is priced again with what it measured, and a kept run that would no longer finish by the
deadline is dropped (left pending, not marked planned); the evaluation the probe and the selector
time is the pack's as the launcher makes it (every run, val and test, test in both BatchNorm modes),
and the plan prices a pack of N's evaluation on the line through the probe's packs of 1 and N.

The numbers are an H200 window's (ResNet-18, CIFAR-10, two ``ce`` runs of 40k steps, planned from
the previous command's probe): the plan projected 189.1 s of 216 s, the selector chose ``loop`` at
2.44 ms per run-step (the probe's line said 1.75), each evaluation of the pack took ~3.75 s (priced
2 x 1.23 s), and both runs stopped at step 35,899 of 40,000."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lpmetrics.packed.launch import Job
from scripts.campaign import cli as campaign
from scripts.campaign import cost
from scripts.campaign import gpu_tables
from scripts.campaign import queue as campaign_queue

# the H200 window's speed (the first command's probe, gemm mode, pack of 8) and selector timing
SPEED = {"pack_n": 8, "mode": "gemm", "step_ms_per_run_ce": 1.1375257499999236,
         "step_ms_solo_ce": 2.5673840000024484, "eval_ms": 1227.4082980000003,
         "families": {"ce": "torch.optim.SGD"}}
KEYS = ["cifar10_nk0.1_ce_lr0.001_s0", "cifar10_nk0.2_ce_lr0.1_s0"]
RATES = {"vmap": 2.5289, "gemm": 2.5785, "loop": 2.4404}


def entry(key: str, steps: int = 40000) -> dict:
    return {"key": key, "objective": "ce", "steps": steps, "block": key}


def record(runs: list[str], chosen: str = "loop", eval_ms: float | None = None, fell_back=None) -> dict:
    """A selector's record as :func:`packed.select.select_mode` writes it."""
    out = {"chosen": chosen, "fell_back": fell_back, "runs": list(runs), "pack_size": len(runs),
           "why": "fastest passing candidate",
           "candidates": [{"mode": m, "passed": True, "ms_per_run_step": r} for m, r in RATES.items()]}
    if eval_ms is not None:
        out["evaluation"] = {"ms": eval_ms, "why": None}
    return out


def plan_of(entries: list[dict], speed: dict = SPEED, budget_s: float = 270.0, eval_every: int = 2000) -> dict:
    return {**campaign.make_plan(entries, speed, budget_s, eval_every), "speed": speed}


def test_the_windows_plan_is_what_the_probe_priced():
    plan = plan_of([entry(k) for k in KEYS])
    assert plan["kept"] == KEYS and plan["projected_s"] == pytest.approx(189.1) and plan["available_s"] == 216.0


def test_the_selectors_timing_drops_the_run_that_would_not_finish(capsys):
    entries = [entry(k) for k in KEYS]
    plan = plan_of(entries)
    stay = campaign.reprice_plan(plan, entries, record(KEYS), {e["key"]: e for e in entries}, 2000, 216.0)
    assert [e["key"] for e in stay] == KEYS[:1] and plan["kept"] == KEYS[:1]
    r = plan["reprice"]
    # a pack of two at 2.44 ms a run-step: 195.2 s of steps, + 40 evaluations at 1.227 s
    assert r["projected_before_s"] == pytest.approx(189.1)
    assert r["projected_repriced_s"] == pytest.approx(40 * 2 * 2.4404 + 40 * 1.2274, abs=0.1)
    assert r["projected_repriced_s"] > 216.0 >= r["projected_after_s"] == plan["projected_s"]
    assert [d["key"] for d in r["dropped"]] == KEYS[1:] and "would not finish" in r["dropped"][0]["why"]
    assert r["measured"]["mode"] == "loop" and r["measured"]["ms_per_run_step"] == 2.4404
    assert list(plan["cost_alone_s"]) == KEYS[:1]
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("re-price: loop pack of 2") and KEYS[1] in lines[0]


def test_runs_that_fit_at_the_measured_rate_are_all_kept():
    entries = [entry(k) for k in KEYS]
    plan = plan_of(entries, budget_s=400.0)   # 320 s available: 244 s re-priced fits
    stay = campaign.reprice_plan(plan, entries, record(KEYS), {e["key"]: e for e in entries}, 2000, 320.0)
    assert stay == entries and plan["kept"] == KEYS and plan["reprice"]["dropped"] == []
    assert plan["projected_s"] == plan["reprice"]["projected_after_s"] == pytest.approx(244.3, abs=0.1)


def test_the_measured_evaluation_prices_the_pack_and_what_is_left_of_it():
    """The pack's evaluation as the selector timed it (3.75 s for two) replaces 2 x 1.227 s; after
    the drop the lone run keeps its measured share of the step and of the evaluation."""
    entries = [entry(k) for k in KEYS]
    timed, why = cost.timed_pack(record(KEYS, eval_ms=3750.0), SPEED, {e["key"]: e for e in entries})
    assert why == "" and timed.runs == frozenset(KEYS)
    cost_of = cost.pack_cost(SPEED, 2000, timed)
    assert cost_of(entries) == pytest.approx(40 * 2 * 2.4404 + 20 * 3.75)   # exactly what was measured
    a, b = cost.line(SPEED["step_ms_per_run_ce"], SPEED["step_ms_solo_ce"], 8)   # 1.634 + 0.933 N
    alone = 40 * (a + timed.step * b) + 20 * 3.75 / 2
    assert cost_of(entries[:1]) == pytest.approx(alone) and alone < 216.0 < cost_of(entries)
    # a run outside the timed pack keeps the probe's price
    other = entry("cifar10_nk0.4_ce_lr0.1_s0")
    assert cost_of([other]) == pytest.approx(cost.pack_cost(SPEED, 2000)([other]))


def test_nothing_measured_nothing_repriced(capsys):
    entries = [entry(k) for k in KEYS]
    for rec, why in ((record(KEYS, chosen="vmap", fell_back="no passing candidate was timed"), "fell back"),
                     (record(["some_other_run"]), "not all priced queue entries"),
                     ({**record(KEYS), "candidates": []}, "no timing of its choice")):
        plan = plan_of(entries)
        assert campaign.reprice_plan(plan, entries, rec, {e["key"]: e for e in entries}, 2000, 216.0) == entries
        assert plan["kept"] == KEYS and why in plan["reprice"]["why"] and plan["projected_s"] == pytest.approx(189.1)
    assert all(line.startswith("re-price: none") for line in capsys.readouterr().out.strip().splitlines())


def test_the_evaluation_of_a_pack_of_n_lies_on_the_line_through_the_probes_packs_of_1_and_n():
    """The probe times a pack of 8's evaluation (eval_ms: a run's share) and a pack of one's
    (eval_ms_solo); a pack of N pays a + b N, not N lone evaluations."""
    speed = {**SPEED, "step_ms_per_run_ce": 0.0, "step_ms_solo_ce": 0.0, "eval_ms": 500.0, "eval_ms_solo": 1200.0}
    cost_of = cost.pack_cost(speed, eval_every=1000)
    b = (8 * 500.0 - 1200.0) / 7
    for n in (1, 2, 8):
        assert cost_of([entry(f"r{i}", steps=1000) for i in range(n)]) == pytest.approx((1200.0 - b + b * n) / 1000)
    # a speed without the solo point (a rates file, an older probe): N evaluations of eval_ms
    older = {k: v for k, v in speed.items() if k != "eval_ms_solo"}
    assert cost.pack_cost(older, eval_every=1000)([entry(f"r{i}", steps=1000) for i in range(3)]) == pytest.approx(1.5)


def test_the_probe_times_the_packs_evaluation_as_the_launcher_makes_it(compose_cfg, monkeypatch):
    """Per run its val and test in its BatchNorm mode and test in the other, the logits from one
    pass of the pack per (split, mode); eval_ms is a run's share of that."""
    from lpmetrics.packed import evaluate as packed_evaluate
    from lpmetrics.run import evaluation
    from lpmetrics.run.builders import resolve_device
    calls = {"passes": [], "evaluate": []}
    real_pass, real_evaluate = packed_evaluate.pack_predict, evaluation.evaluate
    monkeypatch.setattr(packed_evaluate, "pack_predict", lambda packed, data, **kw: (
        calls["passes"].append((packed.n, kw["bn_mode"])), real_pass(packed, data, **kw))[1])
    monkeypatch.setattr(evaluation, "evaluate", lambda model, bundle, split, *a, **k: (
        calls["evaluate"].append(split), real_evaluate(model, bundle, split, *a, **k))[1])
    overrides = ["dataset=digits", "model=mlp", "device=cpu", "objective=ce"]
    cfg = compose_cfg(overrides)
    speed = gpu_tables.measure(cfg, overrides, resolve_device("cpu"), 3, 1, ["ce"])
    assert sorted(calls["passes"]) == [(3, "eval"), (3, "eval"), (3, "train")]   # val, test; test BN-train
    assert sorted(calls["evaluate"]) == ["test"] * 3 + ["val"] * 3
    assert speed["eval_ms"] == pytest.approx(speed["eval_ms_pack"] / 3) and speed["eval_ms"] > 0


def test_the_selector_times_its_chosen_packs_evaluation(compose_cfg, tmp_path):
    from lpmetrics.packed import select
    sets = ["dataset=digits", "model=mlp", "device=cpu", "logger=csv", "trainer.checkpoints=false"]
    jobs = [Job(compose_cfg([*sets, "objective=ce", f"seed={s}"]), tmp_path / f"ce{s}", {}, f"ce{s}") for s in (0, 1)]
    rec = select.select_mode(jobs, modes=["loop"])
    assert rec["chosen"] == "loop" and rec["evaluation"]["ms"] > 0 and rec["evaluation"]["why"] is None
    json.dumps(rec)


# -- the device command on the CPU, the window's costs scaled to digits at 6 steps ------------------

STEPS = 6
SECTION = campaign_queue.Section(
    ("binary",), "table1_binary", {"dataset.neg_keep": ["0.1"], "dataset": ["digits"], "seed": ["0"],
                                   "optimizer.lr": ["0.1", "0.01"], "objective": ["ce"]}, block=1)


@pytest.fixture(scope="module")
def queue_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("campaign")
    queue = campaign_queue.build((SECTION,), extra=("model=mlp", f"trainer.max_steps={STEPS}"), log=lambda m: None)
    campaign_queue.write_json(d / "queue.json", queue)
    return d


def scaled_speed() -> dict:
    """The window's speed for runs of 6 steps evaluated every 3: every projection as at 40k / 2000."""
    return {**SPEED, "step_ms_per_run_ce": SPEED["step_ms_per_run_ce"] * 40000 / STEPS,
            "step_ms_solo_ce": SPEED["step_ms_solo_ce"] * 40000 / STEPS, "eval_ms": SPEED["eval_ms"] * 10}


@pytest.mark.parametrize("select", [True, False])
def test_run_drops_after_the_selection_and_trains_what_stays(queue_dir, tmp_path, monkeypatch, select):
    keys = [e["key"] for e in json.loads((queue_dir / "queue.json").read_text())["entries"]]
    (tmp_path / "speed.json").write_text(json.dumps(scaled_speed()))
    seen = []

    def fake_select(jobs, args):   # the window's timing, on the real first pack
        seen.append([j.name for j in jobs])
        return {**record([j.name for j in jobs]),
                "candidates": [{"mode": m, "passed": True, "ms_per_run_step": r * 40000 / STEPS}
                               for m, r in RATES.items()]}
    monkeypatch.setattr(campaign, "select_pack_mode", fake_select)
    out = tmp_path / "out"
    args = ["--dir", str(queue_dir), "run", "--out", str(out), "--budget-s", "270", "--device", "cpu",
            "--eval-every", "3", "--speed", str(tmp_path / "speed.json"),
            "--select-mode" if select else "--no-select-mode"]
    assert campaign.main(args) == 0
    plan = json.loads((out / "plan.json").read_text())
    with gzip.open(out / "runs.jsonl.gz", "rt") as f:
        trained = [json.loads(line)["name"] for line in f]
    if not select:   # no selection: the plan as before, nothing re-priced
        assert "reprice" not in plan and plan["kept"] == keys == trained and not seen
        return
    assert seen == [keys] and plan["kept"] == keys[:1] == trained    # what gpu_window.sh marks planned
    assert [d["key"] for d in plan["reprice"]["dropped"]] == keys[1:]
    assert plan["outcome"] == {keys[0]: f"done at step {STEPS}"}
    assert plan["reprice"]["projected_repriced_s"] > plan["reprice"]["available_s"] >= plan["projected_s"]
