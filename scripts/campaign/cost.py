"""The planner's cost model and choice: how long a set of queued runs takes as packs, and which
whole blocks (then single runs) fit a command's budget. Shared by ``plan`` / ``run``
(:mod:`scripts.campaign.cli`) and ``status --windows`` (:mod:`scripts.campaign.status`), which
counts the commands still needed by running this same choice on the pending runs. After the
pack-mode selection has timed the real first pack, :func:`reprice` prices the kept runs again
with what it measured and drops those that would no longer finish.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import groupby

from scripts.campaign import gpu_tables   # whole_blocks: the block rule gpu_tables plans with


def line(per_run: float, solo: float | None, n: int) -> tuple[float, float]:
    """``(a, b)`` of ``a + b N`` ms for a pack of N, through a pack of one (``solo`` ms) and a pack
    of ``n`` (``per_run`` ms per run); without a solo point (or ``n`` < 2), ``(0, per_run)``."""
    if solo is None or n < 2:
        return 0.0, per_run
    b = max(0.0, (n * per_run - solo) / (n - 1))
    return max(0.0, solo - b), b


def eval_line(speed: dict) -> tuple[float, float]:
    """``(a, b)`` ms of one evaluation of a pack of N: ``eval_ms`` is a run's share of the probe's
    pack of ``pack_n`` (:func:`gpu_tables.measure`), ``eval_ms_solo`` a pack of one. A speed
    without ``eval_ms_solo`` (a rates file, or a probe that timed one lone model's evaluation)
    prices N evaluations of ``eval_ms`` each."""
    return line(speed["eval_ms"], speed.get("eval_ms_solo"), speed.get("pack_n") or 1)


@dataclass(frozen=True)
class Timed:
    """A pack the selector timed whole (:func:`timed_pack`): its runs (queue keys) and the factors
    on the model's per-run shares (``b``) that make the model's price of that pack what was
    measured, for its step (``step``) and its evaluation (``evaluation``). The pack's fixed parts
    (``a``) stay the probe's, so a pack of fewer of these runs (after :func:`reprice` drops some)
    keeps its fixed cost and sheds each dropped run's measured share."""

    runs: frozenset
    step: float
    evaluation: float


def _scale(measured: float, fixed: float, shares: float) -> float:
    """``s`` with ``fixed + s * shares == measured`` (at least 0); 1 where there is no share."""
    return max(0.0, (measured - fixed) / shares) if shares > 0 else 1.0


def pack_cost(speed: dict, eval_every: int, timed: Timed | None = None):
    """``cost_of(entries)``: seconds to train ``entries`` as packs, with their evaluations.

    Per objective, one step of a pack of N runs costs ``a + b N`` ms (``a``: the pack's fixed work,
    kernel launches and host time, which dominate small packs; ``b``: each run's share), fitted
    from the probe at N = 1 (``step_ms_solo_<objective>``) and at N = ``pack_n`` (:func:`line`).
    Runs whose objectives use one optimizer class share a pack (``families``; the launcher splits
    packs on ``optimizer._target_``) and pay the largest ``a`` once. Without a solo probe (a rates
    file) a = 0. An evaluation of the pack (every ``eval_every`` steps and at the end) costs
    :func:`eval_line`'s ``a + b N``. The runs of ``timed`` that are among ``entries`` form a pack
    of their own, whose shares are scaled to the measurement (:class:`Timed`)."""
    n, families = speed.get("pack_n") or 1, speed.get("families", {})
    e_a, e_b = eval_line(speed)

    def ab(objective: str) -> tuple[float, float]:
        return line(speed[f"step_ms_per_run_{objective}"], speed.get(f"step_ms_solo_{objective}"), n)

    def one_pack(members: list[dict], step_scale: float = 1.0, eval_scale: float = 1.0) -> float:
        coeffs = [ab(e["objective"]) for e in members]
        steps = max(e["steps"] for e in members)
        step_ms = max(a for a, _ in coeffs) + step_scale * sum(b for _, b in coeffs)
        eval_ms = e_a + eval_scale * e_b * len(members)
        return (steps * step_ms + math.ceil(steps / min(eval_every, steps)) * eval_ms) / 1000

    def cost_of(entries: list[dict]) -> float:
        packs: dict[tuple, list] = {}
        mine = [e for e in entries if timed is not None and e["key"] in timed.runs]
        for e in entries:
            if not (timed is not None and e["key"] in timed.runs):
                packs.setdefault((families.get(e["objective"], e["objective"]), e["steps"]), []).append(e)
        total = sum(one_pack(members) for members in packs.values())
        return total + (one_pack(mine, timed.step, timed.evaluation) if mine else 0.0)
    return cost_of


def choose(entries: list[dict], cost_of, avail: float) -> tuple[list[dict], float]:
    """Whole blocks in queue order while they fit ``avail`` seconds, then the next entries one by
    one that still fit whole (a window too short for a whole block still trains what it can)."""
    blocks = [list(g) for _, g in groupby(entries, key=lambda e: e["block"])]
    kept, total = gpu_tables.whole_blocks(blocks, cost_of, avail)
    for e in entries[len(kept):]:
        c = cost_of(kept + [e])
        if c <= avail:
            kept, total = kept + [e], c
    return kept, total


def chosen_rate(record: dict) -> tuple[float | None, str]:
    """(ms per run-step the selector measured for the mode it chose, or ``None``; why not)."""
    if record.get("fell_back"):
        return None, f"the selector fell back to {record.get('chosen')} ({record['fell_back']}): nothing measured"
    row = next((c for c in record.get("candidates", []) if c.get("mode") == record.get("chosen")), None)
    if row is None or row.get("ms_per_run_step") is None:
        return None, f"the selector has no timing of its choice {record.get('chosen')}"
    return row["ms_per_run_step"], ""


def timed_pack(record: dict, speed: dict, entries: dict[str, dict]) -> tuple[Timed | None, str]:
    """The :class:`Timed` of the selector's ``record`` (:func:`packed.select.select_mode`: the
    pack ``runs`` it timed, the chosen candidate's ``ms_per_run_step``, the pack's evaluation
    ``evaluation.ms``), priced against the model of ``speed``; ``entries`` are the queue entries
    by key. ``(None, why)`` where the record measured nothing usable."""
    rate, why = chosen_rate(record)
    if rate is None:
        return None, why
    runs = record.get("runs") or []
    unknown = [k for k in runs if k not in entries or f"step_ms_per_run_{entries[k]['objective']}" not in speed]
    if not runs or unknown:
        return None, f"the timed pack's runs are not all priced queue entries ({', '.join(unknown) or 'none'})"
    n, members = speed.get("pack_n") or 1, [entries[k] for k in runs]
    coeffs = [line(speed[f"step_ms_per_run_{e['objective']}"], speed.get(f"step_ms_solo_{e['objective']}"), n)
              for e in members]
    step = _scale(rate * len(runs), max(a for a, _ in coeffs), sum(b for _, b in coeffs))
    e_a, e_b = eval_line(speed)
    measured_eval = (record.get("evaluation") or {}).get("ms")
    evaluation = 1.0 if measured_eval is None else _scale(measured_eval, e_a, e_b * len(runs))
    return Timed(frozenset(runs), step, evaluation), ""


def reprice(kept: list[dict], cost_of, avail: float) -> tuple[list[dict], float, list[dict]]:
    """(the longest queue-order prefix of ``kept`` whose ``cost_of`` fits ``avail`` seconds, its
    cost, the entries dropped from the end). A run that would not finish by the deadline is
    wasted (never a shortened run): better left pending for a later command."""
    for end in range(len(kept), 0, -1):
        total = cost_of(kept[:end])
        if total <= avail:
            return kept[:end], total, kept[end:]
    return [], 0.0, list(kept)
