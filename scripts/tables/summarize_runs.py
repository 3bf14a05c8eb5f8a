"""One Markdown row per run folder: the last evaluation in its metrics.csv.

    python -m scripts.tables.summarize_runs results/f1_catdog/gpu_sweep1 results/f1_catdog/gpu_sweep2

A folder argument is either a run folder (holds metrics.csv) or a folder of run folders. Runs
stopped early (no results.json) are reported at their last evaluation, with the step reached.
``eval.py`` records beside a run (``eval_<split>[_bntrain].json``) add a column each, e.g.
``test_bntrain_auc`` (``--extra-metric auc``), and ``--best`` adds the test metric at the best
validation evaluation (``best_val`` in results.json) and that evaluation's own validation value;
``--step N`` reports the evaluation at step N (runs stopped by a wall-clock budget at different steps
compared at a common one); ``--columns`` picks metrics.csv's columns (default: the six below), e.g.
the paper tables' headline cell:

    python -m scripts.tables.summarize_runs results/paper_tables/runs --root results/paper_tables/runs \
        --columns test_auc,val_auc,test_bntrain_auc --best
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

COLUMNS = ["val_auc", "val_f1", "val_acc", "test_auc", "test_f1", "test_acc"]


def run_folders(paths: list[Path]) -> list[Path]:
    found = []
    for path in paths:
        if (path / "metrics.csv").is_file():
            found.append(path)
        else:
            found.extend(sorted(p.parent for p in path.glob("*/metrics.csv")))
    return found


def last_row(run: Path, step: int | None = None) -> dict[str, str]:
    """The last evaluation, or the one at ``step`` (empty when the run did not reach it)."""
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    if step is not None:
        rows = [r for r in rows if int(r["step"]) == step]
    return rows[-1] if rows else {}


def extra_values(run: Path, metric: str, best: bool) -> dict[str, float]:
    """``{<split>[_bntrain]_<metric>: value}`` from eval.py records; ``best_val_step`` and
    ``best_val_val_<metric>`` and ``best_val_test_<metric>`` from results.json when ``best``."""
    out = {}
    for path in sorted(run.glob("eval_*.json")):
        value = json.loads(path.read_text()).get("metrics", {}).get(metric)
        if value is not None:
            out[f"{path.stem[len('eval_'):]}_{metric}"] = value
    if best and (run / "results.json").is_file():
        best_row = json.loads((run / "results.json").read_text()).get("best_val") or {}
        if f"test_{metric}" in best_row:
            out["best_val_step"] = best_row["step"]
            if f"val_{metric}" in best_row:
                out[f"best_val_val_{metric}"] = best_row[f"val_{metric}"]
            out[f"best_val_test_{metric}"] = best_row[f"test_{metric}"]
    return out


def render(runs: list[Path], root: Path, metric: str = "auc", best: bool = False,
           step: int | None = None, columns: list[str] | None = None) -> str:
    extras = [extra_values(run, metric, best) for run in runs]
    found = {k for e in extras for k in e}
    best_cols = [k for k in ("best_val_step", f"best_val_val_{metric}", f"best_val_test_{metric}") if k in found]
    columns = list(columns or COLUMNS) + sorted(found - set(best_cols)) + best_cols
    lines = ["| run | steps | finished | " + " | ".join(columns) + " |",
             "|---|---:|---|" + "---:|" * len(columns)]
    for run, extra in zip(runs, extras):
        row = {**last_row(run, step), **extra}
        cells = [(f"{row[c]}" if c == "best_val_step" else f"{float(row[c]):.3f}")
                 if row.get(c) not in (None, "") else "" for c in columns]
        full = run.resolve()
        name = full.relative_to(root) if full.is_relative_to(root) else run
        done = "yes" if (run / "results.json").is_file() else "stopped"
        lines.append(f"| {name} | {row.get('step', '')} | {done} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="run names are shown relative to it")
    ap.add_argument("--extra-metric", default="auc", help="metric read from eval_*.json records")
    ap.add_argument("--best", action="store_true", help="add the test metric at the best val evaluation")
    ap.add_argument("--step", type=int, help="report the evaluation at this step (runs cut at different steps)")
    ap.add_argument("--columns", type=lambda s: [c for c in s.split(",") if c],
                    help=f"comma-separated metrics.csv columns (default: {','.join(COLUMNS)})")
    args = ap.parse_args()
    runs = run_folders(args.folders)
    if not runs:
        raise SystemExit(f"no metrics.csv under {[str(p) for p in args.folders]}")
    print(render(runs, args.root.resolve(), args.extra_metric, args.best, args.step, args.columns))


if __name__ == "__main__":
    main()
