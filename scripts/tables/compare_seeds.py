"""Read a table's cells seed by seed: each objective's seeds, and one objective against the others
by same-seed differences, under a rule fixed before the seeds ran.

    python -m scripts.tables.compare_seeds results/paper_tables --table binary
    python -m scripts.tables.compare_seeds results/paper_tables --reference auc_lp --bn train

The cells are :mod:`scripts.tables.make_tables`' (the same rules: per-cell lr on validation, the
same ``--select`` and ``--bn``; cells with no run are left out). In one column (dataset and
level), two rows' runs of one ``seed`` share their initial weights and batch order (the weights
are drawn from the seed before the objective is built, and batch k is a function of the seed and
k alone), so they are compared seed by seed.

The rule (``results/paper_tables/README.md``, "How seeds 1-2 will be read"):

1. Per row: the test metric of each seed, the mean and the range (max - min).
2. Per pair (``--reference`` against every other row of the column in its arm: the paper's regime
   is never set against the augmented one): the same-seed differences, reference minus other, on
   the seeds both ran, and their mean.
3. "reference above" (or "other above") only if there are at least :data:`MIN_SEEDS` shared
   seeds, every difference has that row ahead, and the mean difference exceeds the larger of the
   two rows' ranges over those seeds; otherwise "not distinguishable", or "too few seeds".
4. The paper's number (``scripts/tables/paper_numbers.py``) beside each row's mean, and whether it
   lies within the row's range (read from :data:`MIN_SEEDS` seeds on): reported, not tested (the
   paper gives one number, no spread).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from scripts.tables import make_tables
from scripts.tables.make_tables import Cell, where_text
from scripts.tables.queue_cells import row_arm

#: the fewest shared seeds the rule reads: with three, all differences share a sign one time in
#: four when neither row is better (each difference equally likely either way)
MIN_SEEDS = 3


@dataclass(frozen=True)
class Pair:
    where: tuple
    reference: str
    other: str
    seeds: tuple          # shared seeds, sorted
    diffs: tuple          # reference - other, per shared seed, in points
    ranges: tuple         # (reference's, other's) max - min over the shared seeds

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.diffs) if self.diffs else None

    @property
    def reading(self) -> str:
        n = len(self.seeds)
        if n < MIN_SEEDS:
            return f"too few seeds ({n} shared; the rule reads {MIN_SEEDS})"
        bar = max(self.ranges)
        if all(d > 0 for d in self.diffs) and self.mean > bar:
            return f"{self.reference} above"
        if all(d < 0 for d in self.diffs) and -self.mean > bar:
            return f"{self.other} above"
        return "not distinguishable"


def _by_seed(cell: Cell) -> dict[str, float]:
    """The cell's test numbers keyed by seed (the text of the seed); a repeated seed is refused."""
    out: dict[str, float] = {}
    for r in cell.scored:
        seed = str(r.seed)
        if seed in out:
            raise ValueError(f"{cell.label} @ {where_text(cell.where)} has seed {seed} twice "
                             f"({', '.join(str(x.path.parent) for x in cell.runs)}): one run per seed to compare")
        out[seed] = r.test
    return out


def _spread(xs: list[float]) -> float:
    return max(xs) - min(xs) if xs else 0.0


def pairs(cells: list[Cell], reference: str) -> list[Pair]:
    """``reference``'s row against every other row of its arm (:func:`queue_cells.row_arm`), per
    column where both have runs."""
    columns: dict[tuple, dict[str, Cell]] = {}
    for c in cells:
        if c.scored:
            columns.setdefault(c.where, {})[c.label] = c
    out = []
    for where, rows in columns.items():
        if reference not in rows:
            continue
        ref = _by_seed(rows[reference])
        for label, cell in rows.items():
            if label == reference or row_arm(label) != row_arm(reference):
                continue
            other = _by_seed(cell)
            seeds = sorted(set(ref) & set(other), key=lambda s: (len(s), s))
            out.append(Pair(where, reference, label, tuple(seeds),
                            tuple(ref[s] - other[s] for s in seeds),
                            (_spread([ref[s] for s in seeds]), _spread([other[s] for s in seeds]))))
    return out


def _lr(cell: Cell) -> str:
    return "-" if cell.lr is None else f"{cell.lr:g}"


def render(cells: list[Cell], found: list[Pair], table: str) -> str:
    rows = ["| column | objective | lr | seeds | test per seed | mean | range | paper | paper in range |",
            "|---|---|---|---|---|---:|---:|---:|---|"]
    for c in sorted((c for c in cells if c.scored), key=lambda c: (c.where, c.label)):
        tests = _by_seed(c)
        seeds = sorted(tests, key=lambda s: (len(s), s))
        xs = [tests[s] for s in seeds]
        paper = make_tables.paper(table, c.where, c.name)
        inside = "-" if paper is None else (f"- ({len(xs)} seed{'s' * (len(xs) > 1)})" if len(xs) < MIN_SEEDS
                                            else "yes" if min(xs) <= paper <= max(xs) else "no")
        rows.append(f"| {where_text(c.where)} | {c.label} | {_lr(c)} | {', '.join(seeds)} | "
                    + ", ".join(f"{x:.1f}" for x in xs) + f" | {statistics.fmean(xs):.1f} | {_spread(xs):.1f} | "
                    + ("-" if paper is None else f"{paper:.1f}") + f" | {inside} |")
    rows += ["", "| column | reference - other | shared seeds | difference per seed | mean | ranges (ref, other) | reading |",
             "|---|---|---|---|---:|---|---|"]
    for p in sorted(found, key=lambda p: (p.where, p.other)):
        rows.append(f"| {where_text(p.where)} | {p.reference} - {p.other} | {', '.join(p.seeds) or '-'} | "
                    + (", ".join(f"{d:+.1f}" for d in p.diffs) or "-")
                    + f" | {'-' if p.mean is None else f'{p.mean:+.1f}'} | {p.ranges[0]:.1f}, {p.ranges[1]:.1f} | "
                    f"{p.reading} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="run folders or folders of run folders")
    ap.add_argument("--table", choices=list(make_tables.TABLES), default="binary")
    ap.add_argument("--reference", default="auc_lp", help="the row compared with every other (default auc_lp)")
    ap.add_argument("--select", choices=list(make_tables.SELECT), default="final")
    ap.add_argument("--bn", choices=list(make_tables.BN), default="eval")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(f"compare_seeds: {msg}", file=sys.stderr)
    try:
        missing = [str(f) for f in args.folders if not f.exists()]
        if missing:
            raise FileNotFoundError(f"no such folder: {', '.join(missing)}")
        queue_path = make_tables.find_queue(args.folders)   # rows named as the tables name them
        cells, _ = make_tables.placed(args.folders, args.table, "per-cell", log, args.select, args.bn, queue_path)
        found = pairs(cells, args.reference)
        if not found:
            labels = sorted({c.label for c in cells if c.scored})
            raise make_tables.NothingToPlaceError(f"no column has --reference {args.reference!r} beside another "
                                                  f"row with runs (rows with runs: {', '.join(labels) or 'none'})")
        text = render(cells, found, args.table)
    except (*make_tables.USER_ERRORS, ValueError) as err:
        raise SystemExit(f"compare_seeds: {type(err).__name__}: {err}") from err
    print(text)
    return text


if __name__ == "__main__":
    main()
