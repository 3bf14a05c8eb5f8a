"""``python -m scripts.cpu.precision_report``: the table and curves of the CPU lane's bf16 study.

    python -m scripts.cpu.precision_report [--lane-dir ~/lpmetrics_lane] [--out results/cpu_precision] [--partial]

The study (``scripts/studies/cpu_precision_runs.txt``, trained by the CPU lane as a stage:
``scripts/campaign/lane.py``) asks whether ``trainer.precision=bf16`` changes what a run learns:
per objective and seed, an fp32 run and its bf16 twin that share initial weights and batches. This
reads their run folders, ``<lane dir>/studies/cpu_precision/<run>/`` (a run the lane folder never
began: its copy under ``--out``, committed by an earlier report), and writes into ``--out``:

* ``runs/<run>/metrics.csv`` and ``results.json`` of each finished run (never a checkpoint; an
  absolute path in ``results.json`` is cut to its last component: a committed file names no
  machine's folders);
* ``table.md``: per objective and seed, fp32 vs bf16 test AUC and val AUC at the last evaluation
  and the best val AUC, with the gap between the twins; per objective and metric the seed spread
  ``|seed 0 - seed 1|`` in each precision; the verdict;
* ``curves.png``: val AUC against step, both precisions (:func:`scripts.tables.plot_curves.plot`).

The verdict rule, fixed before the data: bf16 moves the metrics by more than the seed spread when,
for some objective and metric, a twin gap ``|bf16 - fp32|`` exceeds that objective's fp32 seed
spread (the reference is the precision the tables use now), or when one twin diverged and the other
did not. Then the tables' CPU runs stay fp32. Otherwise, where some metric could not be compared
(a run has no value of it: it diverged before its first evaluation), no verdict. Two seeds give one
spread per objective: a coarse yardstick, so "within" says the study saw no effect larger than seed
noise, not that there is none.

While a run is unfinished it refuses (:class:`ReportError`, one line) unless ``--partial``, which
reads each run's evaluations so far, labels the table partial and gives no verdict.

Each run must be its line's run now: where a folder's ``lane.json`` records another protocol hash
than the line composes to today (the run list was edited after the run began; the lane's own
comparison, :func:`scripts.campaign.lane.protocol_held`), the report refuses, naming the run and
both hashes: delete that folder so the lane trains it afresh, or restore the line. ``--partial``
lists such runs as mismatched and leaves their folders out of the table, the curves and the copies.
A folder without that record is not compared (the lane writes it into every folder it starts).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scripts.campaign import lane
from scripts.campaign import queue as campaign_queue
from scripts.campaign.jobs import composer
from scripts.tables.plot_curves import plot   # one curve style for every results folder

STUDY = "cpu_precision"
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "results" / STUDY
PRECISIONS = ("fp32", "bf16")
#: (label, metrics.csv column, which evaluation): what the table compares
METRICS = (("test AUC", "test_auc", "last"), ("val AUC", "val_auc", "last"), ("best val AUC", "val_auc", "best"))


class ReportError(RuntimeError):
    """The study's runs cannot be reported (yet); the message says why and what to do."""


@dataclass
class StudyRun:
    """One run of the study: who it is (from the run list) and what its folder holds."""
    name: str
    objective: str
    lr: str
    precision: str
    seed: int
    steps: int
    folder: Path
    rows: list[dict] = field(default_factory=list)
    results: dict | None = None
    protocol: str | None = None   # what its line composes to now (where its folder records one to compare)
    foreign: str | None = None    # the protocol its folder records, where that is not its line's

    @property
    def diverged(self) -> bool:
        return bool((self.results or {}).get("diverged"))

    @property
    def finished(self) -> bool:
        """Its ``results.json`` says it reached the study's length, or diverged (an outcome too)."""
        final = (self.results or {}).get("final") or {}
        return self.diverged or final.get("step") == self.steps

    @property
    def step(self) -> int | None:
        return int(self.rows[-1]["step"]) if self.rows else None

    def value(self, column: str, which: str) -> tuple[float, int] | None:
        """(value, step) of ``column`` at the last evaluation, or its best (the first maximum)."""
        pts = [(float(r[column]), int(r["step"])) for r in self.rows if r.get(column) not in (None, "")]
        if not pts:
            return None
        return pts[-1] if which == "last" else max(pts, key=lambda p: (p[0], -p[1]))


def study_runs(lane_dir: Path, campaign_dir: Path = campaign_queue.DEFAULT_DIR,
               committed: Path | None = None) -> list[StudyRun]:
    """The study's runs in its list's order, each with what its run folder holds so far; a folder
    that records another protocol than its line composes to now holds nothing of its line's run.
    A run this lane folder never began is read from its committed copy, ``<committed>/runs/<run>/``,
    where there is one (a new machine's lane folder is empty; the lane never trains such a run
    again: :func:`scripts.campaign.lane.answered`), so the report regenerates from the commits."""
    path = dict(lane.STUDIES)[STUDY]
    queue, _ = campaign_queue.load(campaign_dir)
    out = []
    with contextlib.ExitStack() as stack:
        compose = None   # composing takes ~0.5 s a line: only where a folder records a protocol
        for entry in lane.study_entries(STUDY, path, queue):
            if entry.get("error"):
                raise ReportError(f"{entry['key']}: {entry['error']}")
            over = entry["overrides"]
            run = StudyRun(entry["key"].split("/", 1)[1], lane.override_value(over, "objective"),
                           lane.override_value(over, "optimizer.lr"), lane.override_value(over, "trainer.precision"),
                           int(lane.override_value(over, "seed")), entry["steps"],
                           lane.run_folder(lane_dir, entry["key"]))
            held = lane.LaneRun.of(lane_dir, entry["key"])
            copy = lane.LaneRun(committed / "runs" / run.name) if committed is not None else None
            if not held.folder.is_dir() and copy is not None and copy.results() is not None:
                run.folder, run.rows, run.results = copy.folder, copy.rows(), copy.results()
                out.append(run)
                continue
            if held.info.get("config_sha"):
                compose = compose or stack.enter_context(composer())
                why, run.foreign = lane.protocol_held(entry, held, compose)
                if why:
                    raise ReportError(f"{entry['key']}: {why}")
                run.protocol = entry["config_sha"]
            if not run.foreign:
                run.rows, run.results = held.rows(), held.results()
            out.append(run)
    return out


def check_protocols(runs: list[StudyRun], partial: bool) -> list[StudyRun]:
    """The runs whose folder holds another protocol than their line; a :class:`ReportError` if
    there are any and not ``partial``."""
    off = [r for r in runs if r.foreign]
    if off and not partial:
        path = dict(lane.STUDIES)[STUDY]
        where = ", ".join(f"{r.name} (its folder holds protocol {r.foreign}, its line composes to {r.protocol})"
                          for r in off)
        raise ReportError(f"{len(off)} of {len(runs)} runs were trained under another protocol than their line in "
                          f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} composes to now: "
                          f"{where}; delete each such folder (in {off[0].folder.parent}) so the CPU lane trains it "
                          "afresh, or restore the run list; --partial reports the others")
    return off


def check_finished(runs: list[StudyRun], partial: bool) -> list[StudyRun]:
    """The unfinished runs; a :class:`ReportError` if there are any and not ``partial``."""
    left = [r for r in runs if not r.finished]
    if left and not partial:
        where = ", ".join(f"{r.name} ({'not started' if r.step is None else f'step {r.step} of {r.steps}'})"
                          for r in left)
        raise ReportError(f"{len(left)} of {len(runs)} runs are unfinished: {where}; wait for the CPU lane "
                          "(`python -m scripts.campaign cpu status`) or pass --partial for a labelled partial table")
    return left


# ----------------------------------------------------------------------------- the copies


def portable(value):
    """``value`` (parsed JSON) with every absolute path cut to its last component."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str) and (os.path.isabs(value) or value.startswith("~")):
        return Path(value).name
    return value


def copy_run(run: StudyRun, out: Path) -> Path:
    """``metrics.csv`` and ``results.json`` of a finished run into ``out/runs/<run>/``."""
    dest = out / "runs" / run.name
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run.folder / "metrics.csv", dest / "metrics.csv")
    campaign_queue.write_json(dest / "results.json", portable(run.results))
    return dest


# ----------------------------------------------------------------------------- the numbers


def twins(runs: list[StudyRun]) -> dict[tuple[str, str, int], dict[str, StudyRun]]:
    """``{(objective, lr, seed): {precision: run}}``, objectives in the list's order, then seeds."""
    out: dict = {}
    for r in runs:
        out.setdefault((r.objective, r.lr, r.seed), {})[r.precision] = r
    first = list(dict.fromkeys((o, lr) for o, lr, _ in out))
    return dict(sorted(out.items(), key=lambda kv: (first.index(kv[0][:2]), kv[0][2])))


def gap(a: StudyRun | None, b: StudyRun | None, column: str, which: str) -> float | None:
    """``|a - b|`` of a metric, or ``None`` where either run has no value."""
    va, vb = (r.value(column, which) if r else None for r in (a, b))
    return None if va is None or vb is None else abs(va[0] - vb[0])


def spreads(runs: list[StudyRun]) -> list[dict]:
    """Per objective and metric: the seed spread in each precision and each seed's twin gap, and
    whether a twin gap exceeds the fp32 spread (the verdict rule: module docstring)."""
    pairs = twins(runs)
    out = []
    for objective, lr in dict.fromkeys((o, lr) for o, lr, _ in pairs):
        seeds = sorted(s for o, l, s in pairs if (o, l) == (objective, lr))
        if len(seeds) != 2:
            raise ReportError(f"{objective} lr {lr} has seeds {seeds} in the run list: the seed spread "
                              "here is |seed a - seed b| of two seeds")
        for label, column, which in METRICS:
            row = {"objective": objective, "lr": lr, "metric": label, "seeds": seeds}
            for p in PRECISIONS:
                a, b = (pairs[(objective, lr, s)].get(p) for s in seeds)
                row[f"spread_{p}"] = gap(a, b, column, which)
            row["twin"] = {s: gap(*(pairs[(objective, lr, s)].get(p) for p in PRECISIONS), column, which)
                           for s in seeds}
            ref = row["spread_fp32"]
            row["exceeds"] = None if ref is None or None in row["twin"].values() else \
                any(g > ref for g in row["twin"].values())
            out.append(row)
    return out


def split_divergence(runs: list[StudyRun]) -> list[str]:
    """The twin pairs where one run diverged and the other did not."""
    return [f"{o} lr {lr} seed {s}" for (o, lr, s), pair in twins(runs).items()
            if len({r.diverged for r in pair.values()}) > 1]


def verdict(runs: list[StudyRun], rows: list[dict], unfinished: list[StudyRun]) -> str:
    """The one-paragraph answer the table supports, and no more."""
    if unfinished:
        left, off = [r for r in unfinished if not r.foreign], [r for r in unfinished if r.foreign]
        parts = [f"{len(left)} of {len(runs)} runs unfinished ({', '.join(r.name for r in left)})"] if left else []
        if off:
            parts.append(f"{len(off)} of {len(runs)} mismatched, left out (a folder of another protocol than its "
                         "line composes to now: " +
                         "; ".join(f"{r.name} {r.foreign}, line {r.protocol}" for r in off) + ")")
        return f"PARTIAL: {'; '.join(parts)}; no verdict."
    split = split_divergence(runs)
    over = [r for r in rows if r["exceeds"]]
    if split or over:
        why = [f"{r['objective']} {r['metric']}: twin gaps {fmt_gaps(r)} vs fp32 seed spread "
               f"{pct(r['spread_fp32'])}" for r in over] + [f"{p}: one twin diverged" for p in split]
        return ("bf16 moves the metrics by more than the seed spread (" + "; ".join(why) +
                "): the tables' CPU runs stay fp32.")
    unmeasured = [f"{r['objective']} {r['metric']}" for r in rows if r["exceeds"] is None]
    if unmeasured:   # a run without the value (e.g. diverged before its first evaluation): not within
        return ("No verdict: no twin gap is beyond its fp32 seed spread where one was measured, but "
                f"{', '.join(unmeasured)} could not be compared (a run has no such value).")
    return ("Every bf16 twin gap is within its objective's fp32 seed spread, for every metric: at two "
            "seeds bf16 shows no effect larger than seed noise (one spread per objective: a coarse "
            "yardstick, not a proof of no effect).")


# ----------------------------------------------------------------------------- the table


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def fmt_gaps(row: dict) -> str:
    return "/".join(pct(g) for g in row["twin"].values())


def cell(run: StudyRun | None, column: str, which: str) -> str:
    v = run.value(column, which) if run else None
    if v is None:
        return "-"
    return pct(v[0]) + (f" ({v[1]})" if which == "best" else "") + (" div" if run.diverged else "")


def twin_table(runs: list[StudyRun]) -> list[str]:
    head = ["objective", "seed", "steps fp32/bf16"]
    for label, _, _ in METRICS:
        head += [f"{label} fp32", f"{label} bf16", "abs Δ"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for (objective, lr, seed), pair in twins(runs).items():
        a, b = pair.get("fp32"), pair.get("bf16")
        cells = [f"{objective} (lr {lr})", str(seed),
                 "/".join("mismatched" if r and r.foreign else str(r.step) if r and r.step is not None else "-"
                          for r in (a, b))]
        for _, column, which in METRICS:
            cells += [cell(a, column, which), cell(b, column, which), pct(gap(a, b, column, which))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def spread_table(rows: list[dict]) -> list[str]:
    lines = ["| objective | metric | seed spread fp32 | seed spread bf16 | twin abs Δ per seed | beyond the fp32 spread |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        beyond = {None: "-", True: "**yes**", False: "no"}[r["exceeds"]]
        lines.append(f"| {r['objective']} (lr {r['lr']}) | {r['metric']} | {pct(r['spread_fp32'])} | "
                     f"{pct(r['spread_bf16'])} | {fmt_gaps(r)} | {beyond} |")
    return lines


def table_text(runs: list[StudyRun], unfinished: list[StudyRun]) -> tuple[str, str]:
    """(``table.md``'s text, the verdict)."""
    rows = spreads(runs)
    answer = verdict(runs, rows, unfinished)
    steps = runs[0].steps if runs else None
    text = [f"# cpu_precision: fp32 vs bf16 twins{' (PARTIAL)' if unfinished else ''}", "",
            "Written by `python -m scripts.cpu.precision_report" + (" --partial" if unfinished else "") + "`" +
            "; do not edit. AUC in %; `last` = the run's last evaluation"
            f" (step {steps} once finished), best val = the highest val AUC of its evaluations (its step);"
            " abs Δ = |bf16 − fp32| of twins (same initial weights and batches); seed spread = "
            "|seed 0 − seed 1| within a precision.", "",
            *twin_table(runs), "", *spread_table(rows), "", f"**Verdict.** {answer}", ""]
    return "\n".join(text), answer


def curves(runs: list[StudyRun]) -> dict[str, list[list[tuple]]]:
    """``{setting: [per-seed [(step, val AUC)]]}`` for :func:`plot`."""
    out: dict = {}
    for r in runs:
        pts = [(int(x["step"]), float(x["val_auc"])) for x in r.rows if x.get("val_auc") not in (None, "")]
        if pts:
            out.setdefault(f"{r.objective} lr {r.lr} {r.precision}", []).append(pts)
    return out


def report(lane_dir: Path, out: Path, partial: bool = False, campaign_dir: Path = campaign_queue.DEFAULT_DIR,
           log=print) -> str:
    """Write ``out``'s copies, ``table.md`` and ``curves.png``; return the verdict."""
    runs = study_runs(lane_dir, campaign_dir, committed=out)
    check_protocols(runs, partial)
    unfinished = check_finished(runs, partial)   # with --partial, the mismatched runs among them
    for r in runs:
        if r.finished:
            if r.folder != out / "runs" / r.name:   # else read from that copy itself
                copy_run(r, out)
        else:   # unfinished or of another protocol: no copy from an earlier report stays behind
            shutil.rmtree(out / "runs" / r.name, ignore_errors=True)
    text, answer = table_text(runs, unfinished)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text)
    groups = curves(runs)
    if groups:
        plot(groups, "val_auc", out / "curves.png",
             "CIFAR-10 91 % positives: fp32 vs bf16 twins" + (" (partial)" if unfinished else ""))
    log(text)
    return answer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lane-dir", type=Path, default=lane.DEFAULT_LANE_DIR, help="the CPU lane's folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--partial", action="store_true",
                    help="report unfinished runs too, labelled partial; list runs of another protocol than their line")
    args = ap.parse_args(argv)
    try:
        report(args.lane_dir.expanduser(), args.out, args.partial)
    except (ReportError, lane.LaneError) as err:
        print(f"precision_report: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
