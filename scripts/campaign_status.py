"""``campaign.py status [--windows]``: how far each table is, and the device commands it still needs.

The rates (``results/paper_tables/rates.json``) are committed measurements, not a probe: ms per
run-step per objective as a (low, high) range, seconds per evaluation, the command budget and the
planner's margin. Objectives without a rate are counted, not priced.
"""
from __future__ import annotations

import math
from pathlib import Path

import campaign_queue
from campaign_cells import TERMINAL, read_json
from campaign_fold import RATES


def windows(entries: list[dict], rates: dict) -> dict:
    """Hours of device time and device commands still needed for ``entries``: (low, high) each."""
    usable = rates["budget_s"] * rates["margin"]
    total, unpriced = [0.0, 0.0], {}
    for e in entries:
        ms = rates["ms_per_run_step"].get(e["objective"])
        if ms is None:
            unpriced[e["objective"]] = unpriced.get(e["objective"], 0) + 1
            continue
        n_eval = math.ceil(e["steps"] / rates["eval_every"])
        for i in (0, 1):
            total[i] += e["steps"] * ms[i] / 1000 + n_eval * rates["eval_s"]
    return {"runs": len(entries), "hours": [round(t / 3600, 1) for t in total],
            "windows": [math.ceil(t / usable) for t in total], "unpriced": unpriced}


def status(folder: Path, with_windows: bool = False) -> str:
    queue, ledger = campaign_queue.load(folder)
    runs = ledger["runs"]
    state = {e["key"]: runs[e["key"]]["status"] if e["key"] in runs else "pending" for e in queue["entries"]}
    tables = list(dict.fromkeys(t for e in queue["entries"] for t in e["tables"]))
    lines = [f"queue {queue['version']}: {len(state)} runs; "
             + ", ".join(f"{sum(v == s for v in state.values())} {s}" for s in (*TERMINAL, "pending"))
             + f"; {len(ledger['attempts'])} stopped attempt(s); {len(ledger['extra'])} extra run(s)",
             "", "| table | queued | done | diverged | pending |", "|---|---:|---:|---:|---:|"]
    for t in tables:
        mine = [state[e["key"]] for e in queue["entries"] if t in e["tables"]]
        lines.append(f"| {t} | {len(mine)} | {mine.count('done')} | {mine.count('diverged')} | {mine.count('pending')} |")
    todo = [e for e in queue["entries"] if state[e["key"]] == "pending"]
    broken = [e["key"] for e in todo if e.get("config_sha") is None]
    good = [e for e in todo if e.get("config_sha") is not None]
    if good:
        lines += ["", f"next: {good[0]['block']} ({good[0]['where']['dataset.name']}: carry its data pack)"]
    if broken:
        lines.append(f"not composing (skipped by plan): {', '.join(broken)}")
    if with_windows:
        lines += ["", *windows_table(good, tables, read_json(folder / RATES, "rates file"))]
    return "\n".join(lines)


def windows_table(todo: list[dict], tables: list[str], rates: dict) -> list[str]:
    """Device commands still needed: the first pending cell, each table, everything (a run that
    fills two tables counts in both rows, once in the total)."""
    first_cell = todo[0]["block"].rsplit("/seed=", 1)[0] if todo else None
    parts = [(f"first cell ({first_cell})", [e for e in todo if e["block"].rsplit("/seed=", 1)[0] == first_cell])]
    parts += [(t, [e for e in todo if t in e["tables"]]) for t in tables] + [("all pending", todo)]
    out = [f"Device commands still needed at {rates['source']}: each of {rates['budget_s']:g} s, "
           f"{rates['margin']:g} of it planned; low = {rates['sources']['low']}; high = {rates['sources']['high']}; "
           f"{rates['sources']['assumed']}.", "",
           "| runs of | pending | priced | device hours | commands |", "|---|---:|---:|---:|---:|"]
    for what, entries in parts:
        w = windows(entries, rates)
        priced = w["runs"] - sum(w["unpriced"].values())
        out.append(f"| {what} | {w['runs']} | {priced} | {w['hours'][0]}-{w['hours'][1]} | "
                   f"{w['windows'][0]}-{w['windows'][1]} |")
    return out
