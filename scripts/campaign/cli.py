"""The paper's tables at 40k steps, one device command at a time (DESIGN.md, "The campaign").

    python -m scripts.campaign queue [--check]          # (re)write results/paper_tables/queue.json
    python -m scripts.campaign status [--windows]       # done / pending per table; windows still needed
    python -m scripts.campaign plan [--speed S.json]    # what the next command would train, and why
    OUT=<folder> bash scripts/campaign/gpu_campaign.sh           # on the lent GPU: python -m scripts.campaign run --out $OUT
    python -m scripts.campaign fold <returned OUT folder or runs.jsonl.gz>...
    python -m scripts.campaign fold-cpu <finished train.py run folder>...
    python -m scripts.campaign cpu start|status|fold|stop    # the CPU lane (scripts/campaign/lane.py)

A window is one command of at most 10 minutes and nothing large comes back, so every run starts
and finishes inside one command. ``run``: takes the pending queue entries of one dataset (the
first pending entry's: one data pack travels per command), probes a packed step of each of their
objectives and one evaluation on this device (:func:`gpu_tables.measure`), keeps whole blocks (a
cell's runs of one seed: every lr and objective) in queue order while they fit 80 % of the budget,
then single runs of the next block that still fit whole -- never a shortened run --, checks each
kept entry still composes to its queued protocol (an entry that does not is reported with its key
and skipped); where the pack-mode selector timed the first pack, prices the kept runs again with
its measurement and drops from the end those that no longer fit (they stay pending); and trains
them as packs (:func:`packed.launch.train_packed`) under a deadline with ``trainer.checkpoints=false``.
It writes only ``plan.json`` and ``runs.jsonl.gz`` (each run's ``results.json`` and ``metrics.csv``,
tagged with the queue version) under ``--out``. ``fold``
(:mod:`scripts.campaign.fold`) turns them into run folders under ``results/paper_tables/runs/`` and the
ledger; a run stopped before its 40k steps is recorded there as an attempt, not as done.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from scripts.campaign import cost as campaign_cost
from scripts.campaign import fold as campaign_fold
from scripts.campaign import gpu_tables   # the probe, the margin, export
from scripts.campaign import lane as campaign_lane
from scripts.campaign import queue as campaign_queue
from scripts.campaign import status as campaign_status
from scripts.campaign import submit as campaign_submit
from scripts.campaign.cost import choose, pack_cost
from scripts.campaign.jobs import ROOT, composer
from scripts.tables import queue_order
from scripts.tables.queue_cells import LEDGER_FILE, QUEUE_FILE, RUNS_DIR, QueueFileError

EVAL_EVERY = 2000   # 20 evaluations per 40k run: best-val selection, at ~1/15 of the step time on an H100


#: ``run --fused-update`` -> :class:`packed.optim.PackedSGD`'s ``fused``
FUSED_UPDATE = {"off": False, "auto": "auto", "on": True}

def pending(queue: dict, ledger: dict, folder: Path) -> list[dict]:
    """The wanted queue entries not done (nor diverged), in the order commands take them
    (:func:`queue_order.ordered_pending`: stages, the lr rules)."""
    return queue_order.ordered_pending(queue, ledger, folder)


def candidates(entries: list[dict], dataset: str | None = None) -> tuple[list[dict], list[tuple[str, str]]]:
    """The composable device entries of one dataset (``dataset``, default the first such pending
    one's), and (key, why) of every entry left out (:func:`campaign_submit.runnable`: it did not
    compose when the queue was made, or it runs on the host, so no device command can train it)."""
    good, left = campaign_submit.runnable(entries)
    if not good:
        return [], left
    dataset = dataset or good[0]["where"]["dataset.name"]
    return [e for e in good if e["where"]["dataset.name"] == dataset], left


def make_plan(entries: list[dict], speed: dict, budget_s: float, eval_every: int,
              verify=None) -> dict:
    """Choose, then ``verify(entry)`` each chosen entry (``None`` = fine, else why not); an entry
    that fails is reported and skipped and the choice is made again without it."""
    skipped: list[tuple[str, str]] = []
    priced = []
    for e in entries:
        if f"step_ms_per_run_{e['objective']}" in speed:
            priced.append(e)
        else:
            skipped.append((e["key"], f"objective {e['objective']} was not probed"))
    cost_of = pack_cost(speed, eval_every)
    avail = gpu_tables.MARGIN * budget_s
    while True:
        kept, total = choose(priced, cost_of, avail)
        bad = [(e, why) for e in kept for why in [verify(e) if verify else None] if why]
        if not bad:
            break
        skipped += [(e["key"], why) for e, why in bad]
        priced = [e for e in priced if e not in [b for b, _ in bad]]
    cheapest = min((cost_of([e]) for e in priced), default=None)
    return {"kept": [e["key"] for e in kept], "projected_s": round(total, 1), "budget_s": round(budget_s, 1),
            "available_s": round(avail, 1), "skipped": [{"key": k, "why": w} for k, w in skipped],
            "cost_alone_s": {e["key"]: round(cost_of([e]), 1) for e in kept},
            "note": None if kept else (f"nothing fits: the cheapest pending run needs {cheapest:.0f} s alone, "
                                       f"{avail:.0f} s available" if cheapest else "nothing pending")}


def probe(entries: list[dict], extra: list[str], args) -> tuple[dict, object]:
    """Speeds of the objectives of the first ``--probe-window`` candidates on this device: a pack
    of ``--probe-n`` and a pack of one (:func:`pack_cost`), and which objectives share a pack.
    Where the selector is on (:func:`select_wanted`), it first chooses the forward mode on the
    first pack of the first ``--probe-n`` candidates (``args.pack_select``), and the probe times
    that mode (``mode`` in the speed), so the plan prices what will train."""
    import torch

    from lpmetrics.run.builders import resolve_device
    first = entries[0]
    overrides = [*first["overrides"], *extra]
    cfg = gpu_tables.compose_job(overrides, first["experiment"])
    device = resolve_device(cfg.device)
    if select_wanted(args, device):
        try:   # a stale entry must not cost the window: the plan's verifier reports it later
            with tempfile.TemporaryDirectory(prefix="campaign_select_") as work:
                args.pack_select = select_pack_mode(
                    campaign_submit.jobs_of(entries[:args.probe_n], extra, Path(work))[0], args)
        except Exception as err:   # noqa: BLE001 -- the default mode, and why
            why = f"the selector's pack did not build: {campaign_queue.first_line(err)}"
            print(f"pack mode: auto ({why})", flush=True)
            args.pack_select = {"chosen": "auto", "why": why, "fell_back": why}
        args.pack_mode = args.pack_select["chosen"]
    objectives = list(dict.fromkeys(e["objective"] for e in entries[:args.probe_window]))
    speed = measure_each(cfg, overrides, device, args.probe_n, args, objectives, first["experiment"])
    probed = [o for o in objectives if f"step_ms_per_run_{o}" in speed]
    solo = measure_each(cfg, overrides, device, 1, args, probed, first["experiment"])
    speed.update({f"step_ms_solo_{o}": solo[f"step_ms_per_run_{o}"] for o in probed if f"step_ms_per_run_{o}" in solo})
    speed["eval_ms_solo"] = solo["eval_ms"]   # a pack of one's evaluation: with eval_ms, cost.eval_line
    speed["families"] = {o: str(gpu_tables.compose_job([*overrides, f"objective={o}"], first["experiment"])
                                .optimizer._target_) for o in probed}
    speed.update(device=str(device), torch=torch.__version__)
    return speed, device


def measure_each(cfg, overrides, device, n: int, args, objectives: list[str], experiment: str) -> dict:
    """:func:`gpu_tables.measure` of ``objectives`` at pack size ``n``; if it fails, each objective
    alone (one objective's failure must not cost the window: its runs stay unpriced, skipped)."""
    graph = getattr(args, "cuda_graph", False)   # (`plan` has no --cuda-graph: eager)
    mode = getattr(args, "pack_mode", "auto")      # the selector's choice (probe), else the default
    try:
        return gpu_tables.measure(cfg, overrides, device, n, args.probe_reps, objectives, experiment,
                                  cuda_graph=graph, mode=mode)
    except Exception as err:   # noqa: BLE001
        print(f"probe (pack of {n}): {campaign_queue.first_line(err)}; probing each objective alone", flush=True)
    speed: dict = {}
    for obj in objectives:
        try:
            speed.update(gpu_tables.measure(cfg, overrides, device, n, args.probe_reps, [obj], experiment,
                                            cuda_graph=graph, mode=mode))
        except Exception as err:   # noqa: BLE001
            print(f"probe: {obj} failed at pack size {n} ({campaign_queue.first_line(err)})", flush=True)
    if "eval_ms" not in speed:
        raise RuntimeError("the probe failed for every objective: see the lines above")
    return speed


def select_wanted(args, device) -> bool:
    """``run --select-mode`` / ``--no-select-mode``; by default on for CUDA, off elsewhere (and
    never for ``plan``, which has no such flag)."""
    wanted = getattr(args, "select_mode", False)
    return device.type == "cuda" if wanted is None else bool(wanted)


def select_pack_mode(jobs: list, args) -> dict:
    """:func:`packed.select.select_mode` on the first pack of ``jobs``: its record."""
    from lpmetrics.packed.select import select_mode
    budget = {} if args.select_budget_s is None else {"budget_s": args.select_budget_s}
    record = select_mode(jobs, max_pack=args.max_pack, cuda_graph=args.cuda_graph, **budget)
    print(f"pack mode: {record['chosen']} ({record['fell_back'] or record['why']}; "
          f"{record['elapsed_s']} s)", flush=True)
    return record


def read_speed(path: Path) -> dict:
    """A probe's speed JSON, or a rates file (``rates.json``: a window's probe; an older one's
    ``ms_per_run_step`` ranges: their low end)."""
    data = json.loads(path.read_text())
    # (recorded in plan.json, which fold commits: a path inside the checkout as a relative one)
    full = path.resolve()
    where = full.relative_to(ROOT).as_posix() if full.is_relative_to(ROOT) else path.name
    if "speed" in data:   # the committed rates: a window's probe (campaign_status.speed_of)
        return {**campaign_status.speed_of(data), "from": where}
    if "ms_per_run_step" not in data:   # a probe's speed dict (e.g. a previous command's plan.json "speed")
        return {**data, "from": where}
    return {**{f"step_ms_per_run_{k}": v[0] for k, v in data["ms_per_run_step"].items()},
            "eval_ms": 1000 * data["eval_s"], "from": where}


def read_keys(path: Path) -> set[str]:
    """Queue keys, one per line (``gpu_window.sh``'s ``planned.txt``); a missing file is an error."""
    return {line.strip() for line in path.read_text().splitlines() if line.strip()}


def plan_for(args, start: float) -> tuple[dict, dict, list[dict], list[str]]:
    """(queue, plan, kept entries, extra overrides): probe, choose, verify."""
    folder = Path(args.dir)
    queue, ledger = campaign_queue.load(folder)
    extra = campaign_submit.device_overrides(args)
    waiting = pending(queue, ledger, folder)
    excluded = read_keys(Path(args.exclude)) if args.exclude else set()
    if excluded:   # trained by an earlier command on this machine, not folded into the ledger yet
        left = [e for e in waiting if e["key"] not in excluded]
        print(f"plan: {len(waiting) - len(left)} pending run(s) left out: trained by an earlier command "
              f"on this machine ({args.exclude})", flush=True)
        waiting = left
    todo, broken = candidates(waiting, args.dataset)
    for key, why in broken:
        if not why.startswith("runs on the host"):
            print(f"plan: skipped {key}: {why}", flush=True)
    host = [k for k, why in broken if why.startswith("runs on the host")]
    if host:
        print(f"plan: {len(host)} pending run(s) run on the host, never in a device command "
              f"(plan.json lists each with its reason): {', '.join(host[:4])}{' ...' if len(host) > 4 else ''}",
              flush=True)
    if not todo:
        return queue, {"kept": [], "skipped": [{"key": k, "why": w} for k, w in broken],
                       "note": "nothing pending that composes", "excluded": sorted(excluded)}, [], extra
    if args.speed:
        speed = read_speed(Path(args.speed))
    else:
        speed, _ = probe(todo, extra, args)
    budget = args.budget_s - (time.monotonic() - start)
    with composer() as compose:
        plan = make_plan(todo, speed, budget, args.eval_every, campaign_submit.verifier(compose, extra))
    plan["skipped"] = [{"key": k, "why": w} for k, w in broken] + plan["skipped"]
    plan.update(queue_version=queue["version"], dataset=todo[0]["where"]["dataset.name"], speed=speed,
                extra_overrides=extra, pending=len(waiting), excluded=sorted(excluded))
    kept = [e for e in todo if e["key"] in plan["kept"]]
    unpriced: dict[str, int] = {}
    for s in plan["skipped"][len(broken):]:
        if s["why"].endswith("was not probed"):   # one line per objective (plan.json lists each key)
            unpriced[s["why"]] = unpriced.get(s["why"], 0) + 1
        else:
            print(f"plan: skipped {s['key']}: {s['why']}", flush=True)
    for why, n in unpriced.items():
        print(f"plan: skipped {n} run(s): {why} (not among the first --probe-window candidates, "
              "or its probe failed)", flush=True)
    print(f"plan: {len(kept)} run(s) of {plan['dataset']} ({', '.join(plan['kept']) or 'none'}), projected "
          f"{plan['projected_s']} s of {plan['available_s']} s; {plan['pending']} pending in the queue"
          + (f" besides the {len(excluded)} left out" if excluded else "")
          + (f"; {plan['note']}" if plan.get("note") else ""), flush=True)
    return queue, plan, kept, extra


def run(args) -> int:
    """Plan, train the kept entries as packs under the deadline, export metrics to ``--out``.

    The forward mode: where the selector is on (:func:`select_wanted`) it runs before the probe
    (:func:`probe`), or, with rates given (``--speed``: no probe), on the first planned pack after
    the plan (its time then comes out of training, under the deadline); the packs train in the
    mode it chose, and ``plan.json``'s ``pack_mode`` holds its record with ``probed_mode`` (the
    mode the rates were measured in; ``None`` for rates without one). Where the selector ran, the
    kept runs are priced again with what it measured on the real pack (:func:`reprice_plan`); those
    that no longer fit are dropped from the end before training."""
    from lpmetrics.run.builders import resolve_device
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_id = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.pack_mode, args.pack_select = "auto", None   # probe() sets them where it selects
    queue, plan, kept, extra = plan_for(args, start)
    plan["run_id"] = run_id
    if args.pack_select is not None:
        plan["pack_mode"] = {**args.pack_select, "probed_mode": plan.get("speed", {}).get("mode")}
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    if not kept:
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="campaign_"))   # run folders stay out of OUT
    jobs, run_dirs = campaign_submit.jobs_of(kept, extra, work)
    if args.pack_select is None:
        if select_wanted(args, resolve_device(jobs[0].cfg.device)):
            args.pack_select = select_pack_mode(jobs, args)
            args.pack_mode = args.pack_select["chosen"]
        plan["pack_mode"] = {**(args.pack_select or {
            "chosen": "auto", "why": "selector off (run --select-mode to choose; on by default on CUDA)"}),
            "probed_mode": plan["speed"].get("mode")}
        (out / "plan.json").write_text(json.dumps(plan, indent=1))
    if args.pack_select is not None:   # the selector timed the real first pack: price the plan again
        left = gpu_tables.MARGIN * (args.budget_s - (time.monotonic() - start))
        kept = reprice_plan(plan, kept, args.pack_select, {e["key"]: e for e in queue["entries"]},
                            args.eval_every, left)
        jobs = [j for j in jobs if j.name in plan["kept"]]
        run_dirs = {k: d for k, d in run_dirs.items() if k in plan["kept"]}
        (out / "plan.json").write_text(json.dumps(plan, indent=1))
        if not kept:
            return 0
    reserve_s = 1.5 * last_eval_s(plan, len(jobs)) + 10   # the last evaluation at the deadline, and the export
    outcomes = campaign_submit.train_and_export(jobs, run_dirs, out, queue["version"], run_id,
                                                deadline=start + args.budget_s - reserve_s, max_pack=args.max_pack,
                                                cuda_graph=args.cuda_graph, mode=args.pack_mode,
                                                fused_update=FUSED_UPDATE[args.fused_update])
    plan["outcome"] = {j.name: campaign_fold.outcome_text(o, e["steps"]) for j, o, e in zip(jobs, outcomes, kept)}
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    failed = [j.name for j, o in zip(jobs, outcomes) if isinstance(o, Exception)]
    print(f"done: {len(jobs) - len(failed)} of {len(jobs)} runs written ("
          + ", ".join(f"{k}: {v}" for k, v in plan["outcome"].items()) + f"); {time.monotonic() - start:.0f} s",
          flush=True)
    return 1 if len(failed) == len(jobs) else 0


def reprice_plan(plan: dict, kept: list[dict], record: dict, entries: dict[str, dict], eval_every: int,
                 avail: float) -> list[dict]:
    """Price ``kept`` again once the pack-mode selector's ``record`` has timed the real first pack
    (:func:`cost.timed_pack`: its step in the chosen mode, its evaluation) and keep the longest
    queue-order prefix that fits ``avail`` seconds (what is left of the budget, under the margin):
    the probe prices a pack of N on a line through packs of 1 and ``pack_n``, and in a pack of two
    an H200 took 4.8 ms a step (``loop``) where that line gave 3.5 ms, so both runs of a planned
    189 s stopped at step 35,899 of 40,000. A dropped run stays pending: ``plan["kept"]`` no longer
    holds it, so ``gpu_window.sh`` does not mark it planned and a later command can take it.
    Records ``reprice`` in ``plan`` (projections before, re-priced and after, what was dropped
    and why), updates ``kept``, ``projected_s`` and ``cost_alone_s``, prints one line; returns
    the entries that stay."""
    before = plan["projected_s"]
    timed, why = campaign_cost.timed_pack(record, plan["speed"], entries)
    if timed is not None and not timed.runs & {e["key"] for e in kept}:
        timed, why = None, "the selector timed a pack none of the kept runs is in"
    if timed is None:
        plan["reprice"] = {"why": f"not re-priced: {why}", "projected_before_s": before}
        print(f"re-price: none ({why}); projected {before} s stands", flush=True)
        return kept
    cost_of = campaign_cost.pack_cost(plan["speed"], eval_every, timed)
    whole = cost_of(kept)
    stay, total, dropped = campaign_cost.reprice(kept, cost_of, avail)
    rate, _ = campaign_cost.chosen_rate(record)
    measured = {"mode": record["chosen"], "runs": sorted(timed.runs), "ms_per_run_step": rate,
                "eval_ms": (record.get("evaluation") or {}).get("ms"),
                "step_scale": round(timed.step, 3), "eval_scale": round(timed.evaluation, 3)}
    reason = (f"re-priced at the selector's timing the kept runs need {whole:.1f} s, {avail:.1f} s left: "
              "it would not finish (never a shortened run); it stays pending for a later command")
    plan["reprice"] = {"measured": measured, "projected_before_s": before, "projected_repriced_s": round(whole, 1),
                       "projected_after_s": round(total, 1), "available_s": round(avail, 1),
                       "dropped": [{"key": e["key"], "why": reason} for e in dropped]}
    plan.update(kept=[e["key"] for e in stay], projected_s=round(total, 1),
                cost_alone_s={k: v for k, v in plan.get("cost_alone_s", {}).items() if k in {e["key"] for e in stay}})
    if not stay:
        plan["note"] = f"nothing fits once re-priced: {whole:.0f} s needed, {avail:.0f} s left"
    print(f"re-price: {measured['mode']} pack of {len(timed.runs)} timed at {rate} ms per run-step"
          + (f", {measured['eval_ms'] / 1000:.2f} s per evaluation" if measured["eval_ms"] is not None else "")
          + f": projected {before} s -> {whole:.1f} s of {avail:.1f} s left; "
          + (f"dropped {len(dropped)} ({', '.join(e['key'] for e in dropped)}), {len(stay)} run(s) "
             f"projected {total:.1f} s" if dropped else "all kept"), flush=True)
    return stay


def last_eval_s(plan: dict, n: int) -> float:
    """Seconds of the evaluation a pack of ``n`` makes when the deadline stops it
    (:func:`cost.eval_line`), or the selector's measurement of its pack where larger."""
    e_a, e_b = campaign_cost.eval_line(plan["speed"]) if "eval_ms" in plan["speed"] else (0.0, 0.0)
    measured = (plan.get("pack_mode") or {}).get("evaluation") or {}
    return max(e_a + e_b * n, measured.get("ms") or 0.0) / 1000


#: what a user can get wrong (a folder, a file, a queue that no longer matches): one typed line, exit 1
USER_ERRORS = (QueueFileError, campaign_fold.FoldError, campaign_lane.LaneError, FileNotFoundError,
               NotADirectoryError, IsADirectoryError)


def main(argv: list[str] | None = None) -> int:
    """The command line; a user's error ends as ``campaign: <type>: <message>`` on stderr, exit 1."""
    try:
        return run_command(argv)
    except USER_ERRORS as err:
        text = " ".join(line.strip() for line in str(err).strip().splitlines())
        print(f"campaign: {type(err).__name__}: {text}", file=sys.stderr)
        return 1


def run_command(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=str(campaign_queue.DEFAULT_DIR),
                    help="the campaign folder (queue.json, ledger.json, runs/)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("queue", help="compose every queued job and write queue.json")
    q.add_argument("--check", action="store_true", help="only compare with the committed queue (exit 1 if it differs)")
    for name, text in (("plan", "print what the next device command would train"),
                       ("run", "plan, train and export (the device command)")):
        r = sub.add_parser(name, help=text)
        r.add_argument("--budget-s", type=float, default=480.0, help="wall seconds for probe + training + export")
        r.add_argument("--eval-every", type=int, default=EVAL_EVERY)
        r.add_argument("--device", default="auto")
        r.add_argument("--dataset", help="plan this dataset's entries (default: the first pending entry's)")
        r.add_argument("--speed", help="instead of a probe: a speed JSON (gpu_tables.measure's keys) or a "
                       "rates file (results/paper_tables/rates.json)")
        r.add_argument("--probe-n", type=int, default=8,
                       help="pack size of the speed probe (with a pack of 1: see scripts.campaign.cost.pack_cost)")
        r.add_argument("--probe-reps", type=int, default=3)
        r.add_argument("--probe-window", type=int, default=48,
                       help="probe the objectives of this many candidates (the rest cannot fit anyway)")
        r.add_argument("--exclude", help="a file of queue keys (one per line) to leave out as if done: "
                       "the runs an earlier command on the same machine trained, not yet folded here")
        r.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                       help="more overrides; only keys that do not define a protocol (make_tables.IGNORED)")
        if name == "run":
            r.add_argument("--out", required=True)
            r.add_argument("--work", help="run folders (default: a temporary folder)")
            r.add_argument("--max-pack", type=int, default=None)
            r.add_argument("--cuda-graph", action="store_true",
                           help="replay capturable packs from a CUDA graph (the launcher's option; the plan "
                                "is priced from the probe, which times the same replays where the pack can be captured)")
            r.add_argument("--select-mode", action=argparse.BooleanOptionalAction, default=None,
                           help="choose the packs' forward mode first (packed/select.py: each mode gated "
                                "against lone runs, then timed; the probe times the chosen one); default: "
                                "on for CUDA, off on the CPU")
            r.add_argument("--fused-update", choices=sorted(FUSED_UPDATE), default="off",
                           help="the pack-wide SGD update as one compiled pass per stacked tensor "
                                "(packed/optim.py; auto: where it compiles, else the eager kernels); "
                                "default off until a GPU has measured it")
            r.add_argument("--select-budget-s", type=float, default=None,
                           help="wall seconds for that choice (default packed.select.BUDGET_S, 60)")
    campaign_fold.add_parsers(sub)
    campaign_submit.add_parser(sub)
    campaign_lane.add_parser(sub)
    args = ap.parse_args(argv)
    if args.cmd == "queue":
        return make_queue(Path(args.dir), args.check)
    if args.cmd == "plan":
        plan_for(args, time.monotonic())
        return 0
    if args.cmd == "run":
        return run(args)
    if args.cmd == "submit":
        return campaign_submit.submit(args, Path(args.dir))
    if args.cmd == "cpu":
        return campaign_lane.main(args)
    return campaign_fold.main(args)


def make_queue(folder: Path, check: bool) -> int:
    queue = campaign_queue.build()
    path = folder / QUEUE_FILE
    if check:
        old = campaign_queue.read_json(path, "queue") if path.is_file() else {"version": None, "entries": []}
        if old.get("version") == queue["version"]:
            moved = [e["key"] for e, o in zip(queue["entries"], old["entries"])
                     if any(e.get(f) != o.get(f) for f in campaign_queue.UNVERSIONED)]
            if moved:   # the code changed where entries can run (e.g. an objective became capture-safe)
                print(f"queue {path} is version {queue['version']}, but where these entries can run changed: "
                      f"{', '.join(moved[:20])}; rewrite it with `python -m scripts.campaign queue`")
                return 1
            print(f"queue {path} is current ({queue['version']})")
            return 0
        new_keys = {e["key"]: e for e in queue["entries"]}
        changed = [e["key"] for e in old["entries"] if new_keys.get(e["key"]) != e]
        print(f"queue {path} is {old.get('version')}, the configs now give {queue['version']}; "
              f"entries that differ: {', '.join(changed[:20]) or 'order / count only'}")
        return 1
    old = campaign_queue.read_json(path, "queue") if path.is_file() else None
    ledger_path = folder / LEDGER_FILE
    if old is not None and ledger_path.is_file() and old.get("version") != queue["version"]:
        requeue_ledger(ledger_path, old, queue)   # first: if it fails, the old queue is still here
    campaign_queue.write_json(path, queue)
    print(f"wrote {path}: {len(queue['entries'])} entries, version {queue['version']}")
    return 0


def requeue_ledger(path: Path, old: dict, queue: dict) -> None:
    """Point the ledger at a new queue version. Every run it records (done, diverged or a stopped
    attempt) is attributed to the new entry of the same protocol (``config_sha``): under the same
    key (a new order, entries added or dropped around it), or under a new key (its entry was
    renamed, e.g. moved to another arm), whose run folder and ``campaign.json`` follow, with the
    old key and version kept there (``requeued``). The versions the ledger held before are kept in
    ``earlier_queue_versions``. If a recorded run has no entry of its protocol in the new queue the
    ledger is left as it was, and the runs are named (their results answer another protocol)."""
    ledger = campaign_queue.read_json(path, "ledger")
    before = {e["key"]: e for e in old["entries"]}
    by_sha = {e["config_sha"]: e for e in queue["entries"] if e.get("config_sha")}
    recorded = sorted(set(ledger.get("runs", {})) | {a["key"] for a in ledger.get("attempts", [])})
    moves = {k: by_sha[before[k]["config_sha"]]["key"] for k in recorded
             if k in before and before[k].get("config_sha") in by_sha}
    lost = [k for k in recorded if k not in moves]
    if lost:
        print(f"ledger {path} left at {ledger.get('queue_version')}: no entry of the new queue has the protocol of "
              f"{', '.join(lost[:10])}; fold their runs again into a campaign folder of the new queue, or queue "
              "the old configs")
        return
    if ledger.get("queue_version") == queue["version"]:
        return
    runs_dir = path.parent / RUNS_DIR
    moved = {k: new for k, new in moves.items() if new != k and (runs_dir / k).is_dir()}
    for k in moved:   # two phases: a run may take the key another recorded run is leaving
        (runs_dir / k).rename(runs_dir / f".requeue_{k}")
    for k, new in moves.items():
        if new == k:
            continue
        if k in moved:
            (runs_dir / f".requeue_{k}").rename(runs_dir / new)
            meta_path = runs_dir / new / "campaign.json"
            meta = campaign_queue.read_json(meta_path, "run note")
            meta.setdefault("requeued", []).append({"key": meta.get("key"), "queue_version": ledger.get("queue_version")})
            meta.update(key=new, tables=by_sha[before[k]["config_sha"]]["tables"])
            campaign_queue.write_json(meta_path, meta)
        print(f"ledger {path}: {k} -> {new} (the same protocol under its new entry)")
    ledger["runs"] = {moves[k]: v for k, v in ledger.get("runs", {}).items()}
    for attempt in ledger.get("attempts", []):
        attempt["key"] = moves[attempt["key"]]
    ledger.setdefault("earlier_queue_versions", []).append(ledger.get("queue_version"))
    ledger["queue_version"] = queue["version"]
    campaign_queue.write_json(path, ledger)
    print(f"ledger {path}: now queue {queue['version']} ({len(recorded)} recorded run(s), "
          f"{sum(k != v for k, v in moves.items())} under a new key)")


if __name__ == "__main__":
    sys.exit(main())
