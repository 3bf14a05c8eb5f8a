"""``python -m scripts.campaign status [--windows]``: how far each table is, and the device commands it still needs.

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

from scripts.campaign import queue as campaign_queue
from scripts.campaign.cost import choose, pack_cost
from scripts.tables import queue_order
from scripts.tables.queue_cells import read_json

RATES = "rates.json"   # the committed probe the planner prices pending runs with (beside queue.json)


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
    order while they fit ``margin * budget_s`` (:func:`cost.choose`, priced by
    :func:`cost.pack_cost`), until every priced run is placed or the rest fit no command."""
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
    state = {k: v for k, (v, _) in queue_order.states(queue, ledger, folder).items()}
    tables = list(dict.fromkeys(t for e in queue["entries"] for t in e["tables"]))
    counts = ", ".join(f"{sum(v == s for v in state.values())} {s}" for s in queue_order.STATES)
    lines = [f"queue {queue['version']}: {len(state)} entries; {counts}; {len(ledger['attempts'])} stopped "
             f"attempt(s); {len(ledger['extra'])} extra run(s)",
             "(waiting: its lr is chosen once seed 0 of its cell is folded; not needed: another lr was chosen)",
             "", "| table | entries | done | diverged | pending | waiting | not needed | host only |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for t in tables:
        mine = [e for e in queue["entries"] if t in e["tables"]]
        st = [state[e["key"]] for e in mine]
        host = sum(1 for e in mine if state[e["key"]] in ("pending", "waiting") and e.get("runs_on", "device") != "device")
        lines.append(f"| {t} | {len(mine)} | " + " | ".join(str(st.count(s)) for s in queue_order.STATES) + f" | {host} |")
    todo = queue_order.ordered_pending(queue, ledger, folder)
    broken = [e["key"] for e in todo if e.get("config_sha") is None]
    good = [e for e in todo if e.get("config_sha") is not None and e.get("runs_on", "device") == "device"]
    if good:
        lines += ["", f"next: {good[0]['stage']}: {good[0]['block']} ({good[0]['where']['dataset.name']}: "
                      "carry its data pack)"]
    if broken:
        lines.append(f"not composing (skipped by plan): {', '.join(broken)}")
    if with_windows:
        lines += ["", *windows_table(queue, ledger, folder, read_json(folder / RATES, "rates file"))]
    return "\n".join(lines)


def still_needed(queue: dict, ledger: dict, folder: Path) -> list[dict]:
    """The runs still to train, in plan order: every pending entry, then for each waiting cell
    and seed one stand-in (the lr is not chosen yet; its lrs cost the same), and every waiting
    anchor entry: one per cell in its own stage (the anchor's lr), the others in their ``later``
    stage (each is trained once either way)."""
    state = queue_order.states(queue, ledger, folder)
    out = queue_order.ordered_pending(queue, ledger, folder)
    order = {name: i for i, name in enumerate(queue.get("stages", []))}
    seen, waiting = set(), []
    for i, e in enumerate(queue["entries"]):
        if state[e["key"]][0] != "waiting":
            continue
        if e.get("rule") == "anchor":
            first = e.get("cell") not in seen
            seen.add(e.get("cell"))
            stage = e.get("stage") if first else e.get("later") or e.get("stage")
            waiting.append((order.get(stage, len(order)), i, {**e, "stage": stage}))
        elif (e.get("cell"), e.get("seed")) not in seen:
            seen.add((e.get("cell"), e.get("seed")))
            waiting.append((order.get(e.get("stage"), len(order)), i, e))
    return out + [e for _, _, e in sorted(waiting, key=lambda t: t[:2])]


def windows_table(queue: dict, ledger: dict, folder: Path, rates: dict) -> list[str]:
    """Device commands still needed per stage and in all, counting only runs a device command can
    train (``runs_on`` device); host-only runs are counted apart (a run that fills two tables
    counts once, in its stage)."""
    needed = still_needed(queue, ledger, folder)
    device = [e for e in needed if e.get("config_sha") is not None and e.get("runs_on", "device") == "device"]
    host = [e for e in needed if e.get("config_sha") is not None and e.get("runs_on", "device") != "device"]
    stages = list(dict.fromkeys([*queue.get("stages", []), *(e.get("stage") for e in needed)]))
    parts = [(s, [e for e in device if e.get("stage") == s]) for s in stages] + [("all device runs", device)]
    assumed = ", ".join(f"{o} as {like}" for o, like in rates.get("assume", {}).items())
    out = [f"Device commands still needed at {rates['source']}: each of {rates['budget_s']:g} s, "
           f"{rates['margin']:g} of it planned, as the planner packs them"
           + (f"; priced by assumption (not measured): {assumed}" if assumed else ""), "",
           "| stage | runs still needed | priced | device hours (training) | commands | fit no command |",
           "|---|---:|---:|---:|---:|---:|"]
    for what, entries in parts:
        if not entries:
            continue
        w = windows(entries, rates)
        priced = w["runs"] - sum(w["unpriced"].values())
        out.append(f"| {what} | {w['runs']} | {priced} | {w['hours']} | {w['windows']} | {w['unfit']} |")
    if host:
        by: dict[str, int] = {}
        for e in host:
            by[e["objective"]] = by.get(e["objective"], 0) + 1
        out += ["", f"Host-only runs still needed, never planned for a device command ({len(host)}): "
                + ", ".join(f"{o} {n}" for o, n in by.items())
                + " (their loss needs the host every step; `plan` lists each with its reason)"]
    return out
