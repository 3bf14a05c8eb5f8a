"""``campaign.py status [--windows]``: how far each table is, and the device commands it still needs.

The rates (``results/paper_tables/rates.json``) are a committed probe, not a new one: the speed
dict a window's probe wrote (``windows/<run id>/plan.json`` ``speed``: ms per step of a pack of
one and per run in a pack of ``pack_n``, per objective, and ms per evaluation), the command
budget, the planner's margin, and the objectives priced by assumption. The commands still needed
are counted by running the planner itself on the pending runs (:func:`windows`): a run starts and
finishes inside one command, so a pack's step time bounds how many runs share a command.
Objectives without a rate are counted, not priced.
"""
from __future__ import annotations

from pathlib import Path

import campaign_queue
from campaign_cells import TERMINAL, read_json
from campaign_fold import RATES


def speed_of(rates: dict) -> dict:
    """The probe-format speed dict of ``rates`` with the assumed objectives priced as their
    stand-in (``assume``: ``{objective: measured objective}``)."""
    speed = {**rates["speed"], "families": dict(rates["speed"].get("families", {}))}
    for obj, like in rates.get("assume", {}).items():
        for kind in ("step_ms_per_run_", "step_ms_solo_"):
            if f"{kind}{like}" in speed:
                speed[f"{kind}{obj}"] = speed[f"{kind}{like}"]
        if like in speed.get("families", {}):
            speed.setdefault("families", {})[obj] = speed["families"][like]
    return speed


def windows(entries: list[dict], rates: dict) -> dict:
    """Device hours and commands still needed for ``entries``, as the planner would take them:
    one dataset per command (the first pending one's), whole blocks then single runs in queue
    order while they fit ``margin * budget_s`` (:func:`campaign.choose`, priced by
    :func:`campaign.pack_cost`), until every priced run is placed or the rest fit no command."""
    from campaign import choose, pack_cost   # late: campaign imports this module's neighbours
    speed = speed_of(rates)
    cost_of = pack_cost(speed, rates["eval_every"])
    usable = rates["budget_s"] * rates["margin"]
    priced = [e for e in entries if f"step_ms_per_run_{e['objective']}" in speed]
    unpriced: dict[str, int] = {}
    for e in entries:
        if e not in priced:
            unpriced[e["objective"]] = unpriced.get(e["objective"], 0) + 1
    todo, commands, seconds = list(priced), 0, 0.0
    while todo:
        dataset = todo[0]["where"]["dataset.name"] if "where" in todo[0] else None
        mine = [e for e in todo if dataset is None or e["where"]["dataset.name"] == dataset]
        kept, cost = choose(mine, cost_of, usable)
        if not kept:
            break
        commands, seconds = commands + 1, seconds + cost
        ids = {id(e) for e in kept}
        todo = [e for e in todo if id(e) not in ids]
    return {"runs": len(entries), "hours": round(seconds / 3600, 1), "seconds": round(seconds, 1), "windows": commands,
            "unfit": len(todo), "unpriced": unpriced}


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
           f"{rates['margin']:g} of it planned, as the planner packs them; {rates['note']}", "",
           "| runs of | pending | priced | device hours (training) | commands | fit no command |",
           "|---|---:|---:|---:|---:|---:|"]
    for what, entries in parts:
        w = windows(entries, rates)
        priced = w["runs"] - sum(w["unpriced"].values())
        out.append(f"| {what} | {w['runs']} | {priced} | {w['hours']} | {w['windows']} | {w['unfit']} |")
    return out
