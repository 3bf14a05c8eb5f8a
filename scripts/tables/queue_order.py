"""Which queued runs are wanted, and in which order a device command takes them.

The queue (``queue.json``, :mod:`scripts.campaign.queue`) lists every run a table could need; its stages'
rules decide which are wanted, from the runs already folded (``ledger.json`` and each run's
``runs/<key>/results.json``):

* ``grid``: every lr is wanted (seed 0 of a cell: the lr grid the paper tunes over).
* ``chosen``: only the lr that seed 0 of the same cell (the same protocol but lr and seed: the
  entry's ``cell``) chose; its other lrs are ``not needed``. Until every seed-0 lr of that cell is
  done or diverged the choice is open and the entry is ``waiting``.
* ``anchor``: the lr that seed 0 of another cell chose (``anchor_cell``: the eps ablation takes
  the lr Table 1's eps = 0.01 LP chose in the same Cat&Dog cell); the other lrs are wanted too,
  later, in the stage ``later`` names; ``waiting`` until the anchor cell's choice is made.

The choice is the tables' per-cell rule (``scripts/tables/make_tables.py``, rule 3) on seed 0 alone: the
highest final validation metric (the entry's ``metric``, e.g. ``val_auc``), ties to the smaller
lr; a diverged run ranks below every finished one. So the seeds a table pools were all trained at
the lr the table reports, and nothing is trained for an lr no table will show.

Every function here reads files only (plain JSON), so ``make_tables.py`` can count what a cell
still needs without the campaign's imports (the campaign imports this module from here).
"""
from __future__ import annotations

import json
from pathlib import Path

from scripts.tables.queue_cells import RUNS_DIR, TERMINAL

STATES = ("done", "diverged", "pending", "waiting", "not needed")


def _final_metric(folder: Path, key: str, metric: str) -> float | None:
    try:
        res = json.loads((folder / RUNS_DIR / key / "results.json").read_text())
    except (OSError, ValueError):
        return None
    value = (res.get("final") or {}).get(metric)
    return None if value is None else float(value)


def chosen_lrs(queue: dict, ledger: dict, folder: Path) -> dict[str, float]:
    """``{cell: lr}`` for every cell whose seed-0 runs (every lr queued for it) are all done or
    diverged: the lr with the best final validation metric, ties to the smaller lr."""
    runs = ledger.get("runs", {})
    cells: dict[str, list[dict]] = {}
    for e in queue.get("entries", []):
        if e.get("cell") and e.get("seed") == 0:
            cells.setdefault(e["cell"], []).append(e)
    out = {}
    for cell, entries in cells.items():
        if not all(runs.get(e["key"], {}).get("status") in TERMINAL for e in entries):
            continue

        def rank(e):
            value = None
            if runs[e["key"]]["status"] == "done":
                value = _final_metric(folder, e["key"], e["metric"])
            return (float("-inf") if value is None else value, -e["lr"])
        out[cell] = max(entries, key=rank)["lr"]
    return out


def states(queue: dict, ledger: dict, folder: Path) -> dict[str, tuple[str, str | None]]:
    """``{key: (state, stage)}``: the state (:data:`STATES`) of every entry and the stage it is
    planned in (``None`` unless pending); entries that did not compose are pending (plan skips them)."""
    runs = ledger.get("runs", {})
    chosen = chosen_lrs(queue, ledger, folder)
    out: dict[str, tuple[str, str | None]] = {}
    for e in queue.get("entries", []):
        status = runs.get(e["key"], {}).get("status")
        stage = e.get("stage")
        if status in TERMINAL:
            out[e["key"]] = (status, None)
            continue
        rule = e.get("rule", "grid")
        if rule == "chosen":
            lr = chosen.get(e.get("cell"))
            out[e["key"]] = ("waiting", None) if lr is None else \
                (("pending", stage) if lr == e["lr"] else ("not needed", None))
        elif rule == "anchor":
            lr = chosen.get(e.get("anchor_cell"))
            out[e["key"]] = ("waiting", None) if lr is None else \
                ("pending", stage if lr == e["lr"] else e.get("later") or stage)
        else:
            out[e["key"]] = ("pending", stage)
    return out


def ordered_pending(queue: dict, ledger: dict, folder: Path) -> list[dict]:
    """The wanted runs not done yet, in the order commands take them: by stage (the queue's
    ``stages`` order; an anchor entry's other lrs in its ``later`` stage), then queue order."""
    state = states(queue, ledger, folder)
    order = {name: i for i, name in enumerate(queue.get("stages", []))}
    todo = [(order.get(state[e["key"]][1], len(order)), i, e) for i, e in enumerate(queue.get("entries", []))
            if state[e["key"]][0] == "pending"]
    return [e for _, _, e in sorted(todo, key=lambda t: t[:2])]


def needed_count(queue: dict, ledger: dict, folder: Path, entries: list[dict]) -> int:
    """How many of ``entries`` will be trained: each pending one, and one per (cell, seed) of the
    waiting ones (the lr still to be chosen); not needed ones count nothing."""
    state = states(queue, ledger, folder)
    waiting = {(e.get("cell"), e.get("seed")) for e in entries if state[e["key"]][0] == "waiting"
               and e.get("rule") == "chosen"}
    waiting_anchor = sum(1 for e in entries if state[e["key"]][0] == "waiting" and e.get("rule") == "anchor")
    return sum(1 for e in entries if state[e["key"]][0] == "pending") + len(waiting) + waiting_anchor
