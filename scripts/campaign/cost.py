"""The planner's cost model and choice: how long a set of queued runs takes as packs, and which
whole blocks (then single runs) fit a command's budget. Shared by ``plan`` / ``run``
(:mod:`scripts.campaign.cli`) and ``status --windows`` (:mod:`scripts.campaign.status`), which
counts the commands still needed by running this same choice on the pending runs.
"""
from __future__ import annotations

import math
from itertools import groupby

from scripts.campaign import gpu_tables   # whole_blocks: the block rule gpu_tables plans with


def pack_cost(speed: dict, eval_every: int):
    """``cost_of(entries)``: seconds to train ``entries`` as packs, with their evaluations.

    Per objective, one step of a pack of N runs costs ``a + b N`` ms (``a``: the pack's fixed work,
    kernel launches and host time, which dominate small packs; ``b``: each run's share), fitted
    from the probe at N = 1 (``step_ms_solo_<objective>``) and at N = ``pack_n``. Runs whose
    objectives use one optimizer class share a pack (``families``; the launcher splits packs on
    ``optimizer._target_``) and pay the largest ``a`` once. Without a solo probe (a rates file) a = 0."""
    n, families = speed.get("pack_n") or 1, speed.get("families", {})

    def ab(objective: str) -> tuple[float, float]:
        per, solo = speed[f"step_ms_per_run_{objective}"], speed.get(f"step_ms_solo_{objective}")
        if solo is None or n < 2:
            return 0.0, per
        b = max(0.0, (n * per - solo) / (n - 1))
        return max(0.0, solo - b), b

    def cost_of(entries: list[dict]) -> float:
        packs: dict[tuple, list] = {}
        for e in entries:
            packs.setdefault((families.get(e["objective"], e["objective"]), e["steps"]), []).append(ab(e["objective"]))
        total = 0.0
        for (_, steps), coeffs in packs.items():
            evals = len(coeffs) * math.ceil(steps / min(eval_every, steps)) * speed["eval_ms"]
            total += (steps * (max(a for a, _ in coeffs) + sum(b for _, b in coeffs)) + evals) / 1000
        return total
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
