"""``python -m scripts.campaign fold | fold-cpu | status``: returned files -> run folders and the ledger.

``fold OUT...`` reads each ``runs.jsonl.gz`` a device command returned. It refuses (and writes
nothing) if a record comes from another queue version, names no queue entry, or ran a protocol
other than its entry's (the differing keys are listed). Then per record: a run that reached its
entry's steps becomes ``runs/<key>/`` (``results.json``, ``metrics.csv``, ``campaign.json``) and is
marked done in ``ledger.json``; a run that diverged is marked ``diverged`` (a result: that lr
fails; no folder, so no table pools a shorter run); a run stopped earlier (the deadline) is
recorded under ``attempts`` and stays pending. Every record is identified by its content hash, so
folding the same files again changes nothing; a second run of an entry already done is reported
and the first kept. A returned folder's ``plan.json`` and ``machine.txt`` are kept under
``windows/<run id>/``.

``fold-cpu RUN_DIR...`` folds a finished ``train.py`` run folder (only at the queue's 40k steps)
marked as a CPU run whose lr came from the 5k study, not the grid: as its queue entry when its
protocol is one, else as an extra run ``runs/cpu_<folder name>/``.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from scripts.campaign import queue as campaign_queue
from scripts.campaign import status as campaign_status
from scripts.campaign.jobs import composer
from scripts.campaign.status import RATES
from scripts.tables.make_tables import protocol
from scripts.tables.queue_cells import LEDGER_FILE, RUNS_DIR, TERMINAL

CPU_NOTE = "CPU run; lr from the 5k study (results/lp_vs_ce_cifar10/), not the grid"
WINDOWS_DIR = "windows"   # per device command: its plan.json and machine.txt


class FoldError(ValueError):
    """Returned files the campaign folder cannot take; nothing was written."""


def outcome_text(outcome, steps: int) -> str:
    """One run's outcome as plan.json records it."""
    if isinstance(outcome, Exception):
        return f"not run: {type(outcome).__name__}: {outcome}"
    return status_of(outcome, steps)[0] + f" at step {(outcome.get('final') or {}).get('step')}"


def status_of(res: dict | None, steps: int) -> tuple[str, str | None]:
    """(done | diverged | stopped, why) of a returned ``results.json``."""
    if not res or not res.get("final"):
        return "stopped", "no evaluation (or no results.json)"
    if res.get("diverged"):
        return "diverged", str(res["diverged"].get("reason"))
    step = res["final"].get("step")
    if res.get("stopped") or step != steps:
        return "stopped", f"{(res.get('stopped') or {}).get('reason', 'short')} at step {step} of {steps}"
    return "done", None


def trained_nothing(p: Path) -> bool:
    """A returned OUT folder whose command planned no run (its ``plan.json`` keeps none: nothing
    was pending or fitted, e.g. a window's second command): it has no ``runs.jsonl.gz``."""
    plan = p / "plan.json"
    return p.is_dir() and not (p / "runs.jsonl.gz").exists() and plan.is_file() and \
        json.loads(plan.read_text()).get("kept") == []


def read_records(paths: list[Path], log=print) -> list[dict]:
    records = []
    for p in map(Path, paths):
        if trained_nothing(p):
            log(f"fold: {p}: its command planned no run (plan.json keeps none): nothing to fold there")
            continue
        f = p / "runs.jsonl.gz" if p.is_dir() else p
        if not f.is_file():
            raise FoldError(f"{p}: no runs.jsonl.gz (give the returned OUT folder or the file itself)")
        with gzip.open(f, "rt") as fh:
            records += [json.loads(line) for line in fh if line.strip()]
    return records


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def config_diff(entry: dict, config: dict) -> str:
    """The keys in which a returned run's protocol differs from its entry's (composed again)."""
    try:
        with composer() as compose:
            cfg, _ = campaign_queue.compose_entry(compose, entry["overrides"], entry["experiment"])
        want, got = protocol(campaign_queue.composed_config(cfg)), protocol(config)
    except Exception as err:   # noqa: BLE001 -- only the message's detail is lost
        return f"(the entry does not compose here: {campaign_queue.first_line(err)})"
    return "; ".join(f"{k}: queued {want.get(k)!r}, ran {got.get(k)!r}"
                     for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k))[:2000]


def write_run(folder: Path, name: str, res: dict, metrics_csv: str, meta: dict) -> None:
    d = folder / RUNS_DIR / name
    d.mkdir(parents=True, exist_ok=True)
    campaign_queue.write_json(d / "results.json", res)
    if not (d / "metrics.csv").is_file() or (d / "metrics.csv").read_text() != metrics_csv:
        (d / "metrics.csv").write_text(metrics_csv)
    campaign_queue.write_json(d / "campaign.json", meta)


def _machine(res: dict) -> dict:
    prov = res.get("provenance") or {}
    return {"device": prov.get("device_name") or res.get("device"), "commit": prov.get("git_commit", "unrecorded")}


def fold(paths: list[Path], folder: Path, log=print) -> dict[str, int]:
    """Fold returned ``runs.jsonl.gz`` files into ``folder``; returns counts per outcome."""
    queue, ledger = campaign_queue.load(folder)
    entries = {e["key"]: e for e in queue["entries"]}
    records = read_records(paths, log)
    problems = []
    for rec in records:
        key, res = rec.get("name"), rec.get("results")
        if rec.get("queue_version") != queue["version"]:
            problems.append(f"{key}: from queue version {rec.get('queue_version')}, this folder's queue is "
                            f"{queue['version']}: fold it into a campaign folder of that version")
        elif key not in entries:
            problems.append(f"{key}: no such entry in queue {queue['version']}")
        elif res and campaign_queue.config_sha(res["config"]) != entries[key]["config_sha"]:
            problems.append(f"{key}: its config differs from its queue entry: {config_diff(entries[key], res['config'])}")
    if problems:
        raise FoldError(f"refused {len(records)} record(s), nothing folded:\n  " + "\n  ".join(problems))
    counts = {"done": 0, "diverged": 0, "stopped": 0, "unchanged": 0, "duplicate": 0}
    for rec in records:
        key, res, sha = rec["name"], rec.get("results"), digest(rec)
        status, why = status_of(res, entries[key]["steps"])
        info = {"status": status, "kind": rec.get("kind", "gpu"), "record_sha": sha, "source": rec.get("run_id"),
                "step": ((res or {}).get("final") or {}).get("step"), **_machine(res or {})}
        old = ledger["runs"].get(key)
        if old is not None or any(a["record_sha"] == sha for a in ledger["attempts"]):
            same = (old or {}).get("record_sha") == sha or old is None
            counts["unchanged" if same else "duplicate"] += 1
            if not same:
                log(f"fold: {key} is already {old['status']} (record {old['record_sha']}); kept that, "
                    f"ignored {status} record {sha}")
            continue
        counts[status] += 1
        if status == "stopped":
            ledger["attempts"].append({"key": key, **info, "why": why})
            continue
        if status == "done":
            write_run(folder, key, res, rec["metrics_csv"],
                      {"key": key, "queue_version": queue["version"], "kind": info["kind"],
                       "source": info["source"], "tables": entries[key]["tables"]})
        else:
            info["why"] = why
        ledger["runs"][key] = info
    campaign_queue.write_json(folder / LEDGER_FILE, ledger)
    keep_window_notes(paths, records, folder)
    log(f"fold: {', '.join(f'{v} {k}' for k, v in counts.items() if v)} ({len(records)} records)")
    return counts


def keep_window_notes(paths: list[Path], records: list[dict], folder: Path) -> None:
    """Each returned folder's ``plan.json`` and ``machine.txt`` (small, no machine paths) under
    ``windows/<run id>/``: what each command planned, probed and ran on, beside the runs."""
    for p in map(Path, paths):
        run_ids = {r.get("run_id") for r in records} if p.is_dir() else set()
        plan = p / "plan.json"
        if not plan.is_file() or not run_ids:
            continue
        run_id = json.loads(plan.read_text()).get("run_id")
        if run_id not in run_ids:
            continue
        d = folder / WINDOWS_DIR / str(run_id).replace(":", "-")
        d.mkdir(parents=True, exist_ok=True)
        for name in ("plan.json", "machine.txt"):
            src, dst = p / name, d / name
            if src.is_file() and (not dst.is_file() or dst.read_bytes() != src.read_bytes()):
                dst.write_bytes(src.read_bytes())


def fold_cpu(run_dirs: list[Path], folder: Path, note: str = CPU_NOTE, log=print, entry_only: bool = False,
             meta: dict | None = None) -> dict[str, int]:
    """Fold finished train.py run folders (at the queue's steps) as CPU runs.

    A run that diverged (``results.json`` ``diverged``) and is a queue entry is recorded as
    ``diverged``, as :func:`fold` records a device run's. ``entry_only``: a run whose protocol is no
    queue entry's is refused (the CPU lane's runs), not folded as an extra run. ``meta``: more
    fields for each run's ``campaign.json`` (the lane's launch and fold commits)."""
    queue, ledger = campaign_queue.load(folder)
    by_sha = {e["config_sha"]: e for e in queue["entries"] if e.get("config_sha")}
    ledger.setdefault("runs", {})
    ledger.setdefault("extra", {})
    steps = max(e["steps"] for e in by_sha.values())
    counts = {"done": 0, "diverged": 0, "extra": 0, "unchanged": 0, "duplicate": 0}
    for d in map(Path, run_dirs):
        metrics = d / "metrics.csv"
        if not (d / "results.json").is_file():
            last = metrics.read_text().strip().splitlines()[-1].split(",")[0] if metrics.is_file() else "none"
            raise FoldError(f"{d}: no results.json, the run is not finished (last evaluation at step {last} of "
                            f"{steps}); resume it (train.py resume=true) and fold it when it reaches {steps}")
        res = json.loads((d / "results.json").read_text())
        entry = by_sha.get(campaign_queue.config_sha(res["config"]))
        if entry is None and entry_only:
            raise FoldError(f"{d}: its protocol is no entry of queue {queue['version']}; not folded")
        if entry is not None and res.get("diverged"):
            if entry["key"] in ledger["runs"]:   # folded before (or done elsewhere): keep that record
                counts["unchanged" if ledger["runs"][entry["key"]].get("record_sha") == digest(res) else "duplicate"] += 1
                continue
            why = str(res["diverged"].get("reason"))
            ledger["runs"][entry["key"]] = {"status": "diverged", "kind": "cpu", "source": d.name, "why": why,
                                            "record_sha": digest(res), "step": (res.get("final") or {}).get("step"),
                                            "note": note, **_machine(res), **(meta or {})}
            counts["diverged"] += 1
            log(f"fold-cpu: {d} -> {entry['key']} diverged ({why})")
            continue
        step, max_steps = (res.get("final") or {}).get("step"), res["config"]["trainer"]["max_steps"]
        if step != steps or max_steps != steps:
            raise FoldError(f"{d}: ran {step} of {max_steps} steps; the campaign folds runs of {steps} steps only")
        name = entry["key"] if entry else f"cpu_{d.name}"
        sha = digest({"results": res, "metrics_csv": metrics.read_text()})
        book = ledger["runs"] if entry else ledger["extra"]
        if name in book:
            same = book[name]["record_sha"] == sha
            counts["unchanged" if same else "duplicate"] += 1
            if not same:
                log(f"fold-cpu: {name} is already {book[name]['status']}; kept that, ignored {d}")
            continue
        write_run(folder, name, res, metrics.read_text(),
                  {"key": name if entry else None, "queue_version": queue["version"], "kind": "cpu", "note": note,
                   "source": d.name, "tables": entry["tables"] if entry else [], **(meta or {})})
        book[name] = {"status": "done", "kind": "cpu", "record_sha": sha, "source": d.name, "step": step,
                      "note": note, **_machine(res)}
        counts["done" if entry else "extra"] += 1
        log(f"fold-cpu: {d} -> {RUNS_DIR}/{name}" + ("" if entry else " (not a queue entry: an extra run)"))
    campaign_queue.write_json(folder / LEDGER_FILE, ledger)
    return counts


def add_parsers(sub) -> None:
    f = sub.add_parser("fold", help="returned runs.jsonl.gz -> runs/<key>/ and ledger.json")
    f.add_argument("paths", nargs="+", type=Path, help="returned OUT folders or runs.jsonl.gz files")
    c = sub.add_parser("fold-cpu", help="finished train.py run folders (40k steps) -> runs/, marked CPU")
    c.add_argument("run_dirs", nargs="+", type=Path)
    c.add_argument("--note", default=CPU_NOTE, help="why this run and its lr (recorded in campaign.json)")
    s = sub.add_parser("status", help="done / pending per table")
    s.add_argument("--windows", action="store_true",
                   help=f"and the device commands still needed at the rates in {RATES}")


def main(args) -> int:
    """``fold`` / ``fold-cpu`` / ``status``; a :class:`FoldError` reaches the command line
    (:func:`scripts.campaign.cli.main`: one typed line, exit 1)."""
    folder = Path(args.dir)
    if args.cmd == "fold":
        fold(args.paths, folder)
    elif args.cmd == "fold-cpu":
        fold_cpu(args.run_dirs, folder, args.note)
    else:
        print(campaign_status.status(folder, args.windows))
    return 0
