"""The cells a campaign queue expects in a table, for ``scripts/tables/make_tables.py``'s "pending".

The queue (``queue.json``, written by ``python -m scripts.campaign queue``) lists every run the paper's
tables need; each entry names the tables it fills, its objective and the values that place it
(``"where"``: ``dataset.name``, ``dataset.neg_keep``, ``dataset.drop_rate``, ``objective.epsilon``).
The ledger (``ledger.json`` beside it, written by ``python -m scripts.campaign fold``) lists the entries done.
This module only reads them (plain JSON), so the tables engine (``make_tables.py``) needs nothing from the campaign, which
imports it from here (:mod:`scripts.campaign` may import :mod:`scripts.tables`, never the reverse).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

QUEUE_FILE, LEDGER_FILE = "queue.json", "ledger.json"
RUNS_DIR = "runs"             # run folders, one per queue key (or extra run), under the queue's folder
TERMINAL = ("done", "diverged")   # ledger statuses that take an entry off the queue


class QueueFileError(ValueError):
    """A queue or ledger file that cannot be read as one."""


def read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise QueueFileError(f"cannot read the {what} {path}: {err}; regenerate it with "
                             "`python -m scripts.campaign queue` (queue) or restore it from git") from err
    if not isinstance(data, dict):
        raise QueueFileError(f"{path} holds a {type(data).__name__}, not a {what}")
    return data


def find_queue(folders: list[Path]) -> Path | None:
    """The first ``queue.json`` directly inside one of ``folders``."""
    return next((f / QUEUE_FILE for f in folders if (f / QUEUE_FILE).is_file()), None)


def done_keys(queue_path: Path, folder_names: set[str]) -> set[str]:
    """Queue keys taken off the queue: those with a run folder among ``folder_names`` and those
    the ledger beside the queue marks done or diverged (a diverged run has no folder)."""
    ledger_path = Path(queue_path).parent / LEDGER_FILE
    ledger = read_json(ledger_path, "ledger") if ledger_path.is_file() else {}
    return set(folder_names) | {k for k, rec in ledger.get("runs", {}).items() if rec.get("status") in TERMINAL}


def entry_where(entry: dict, level: str, pivot: str | None) -> tuple:
    """The column (``(dataset, level)`` or ``(dataset, level, pivot value)``) of a queue entry."""
    w = entry["where"]
    return (w["dataset.name"], float(w[f"dataset.{level}"]), *([float(w[pivot])] if pivot else []))


def arm_of(entry: dict) -> str | None:
    """The regime an entry overrides (``regime=augmented``: a second arm of a table), ``None``
    for its experiment's own (the paper's regime)."""
    return next((o.split("=", 1)[1] for o in entry.get("overrides", []) if o.startswith("regime=")), None)


def row_name(entry: dict) -> str:
    """The table row of an entry: its objective, with its arm where it is not the paper's regime
    (``ce (regime=augmented)``), so the two arms never share a cell or a paper number."""
    arm = arm_of(entry)
    return entry["objective"] + (f" (regime={arm})" if arm else "")


def row_arm(row: str) -> str | None:
    """The arm a row name (:func:`row_name`, perhaps with more keys after it) belongs to:
    ``"ce (regime=augmented)"`` -> ``"augmented"``; ``None`` for the paper's regime."""
    found = re.search(r"\bregime=([^,)]+)", row)
    return found.group(1) if found else None


def expected_cells(queue: dict, table: str, level: str, pivot: str | None, done: set[str],
                   state: dict | None = None) -> dict[tuple, tuple[int, int]]:
    """``{(where, objective): (runs queued, runs done)}`` for the entries that fill ``table``
    (an entry that did not compose has no place: ``python -m scripts.campaign status`` lists it). With ``state``
    (:func:`queue_order.states`) only the runs the lr rules want count: a ``not needed`` entry
    counts nothing, and the ``waiting`` entries of one cell and seed count once (one lr of them
    will be chosen)."""
    out: dict[tuple, list[int]] = {}
    seen: set = set()
    for e in queue.get("entries", []):
        if table not in e.get("tables", []) or not e.get("where"):
            continue
        st = (state or {}).get(e["key"], ("pending", None))[0]
        if st == "not needed" and e["key"] not in done:
            continue
        if st == "waiting" and e.get("rule") == "chosen":
            group = (e.get("cell"), e.get("seed"))
            if group in seen:
                continue
            seen.add(group)
        count = out.setdefault((entry_where(e, level, pivot), row_name(e)), [0, 0])
        count[0] += 1
        count[1] += e["key"] in done
    return {k: (n, d) for k, (n, d) in out.items()}


def queued_labels(runs: list, keys: set[str]) -> dict[str, str]:
    """``{objective: row label}`` of the placed runs whose folder is a queue key: queued cells
    with no run yet join that row, not a new one."""
    return {r.name: r.label for r in runs if r.path.parent.name in keys}
