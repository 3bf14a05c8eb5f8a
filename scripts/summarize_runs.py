"""One Markdown row per run folder: the last evaluation in its metrics.csv.

    python scripts/summarize_runs.py results/f1_catdog/gpu_sweep1 results/f1_catdog/gpu_sweep2

A folder argument is either a run folder (holds metrics.csv) or a folder of run folders. Runs
stopped early (no results.json) are reported at their last evaluation, with the step reached.
"""
from __future__ import annotations

import argparse
import csv
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


def last_row(run: Path) -> dict[str, str]:
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else {}


def render(runs: list[Path], root: Path) -> str:
    lines = ["| run | steps | finished | " + " | ".join(COLUMNS) + " |",
             "|---|---:|---|" + "---:|" * len(COLUMNS)]
    for run in runs:
        row = last_row(run)
        cells = [f"{float(row[c]):.3f}" if row.get(c) not in (None, "") else "" for c in COLUMNS]
        full = run.resolve()
        name = full.relative_to(root) if full.is_relative_to(root) else run
        done = "yes" if (run / "results.json").is_file() else "stopped"
        lines.append(f"| {name} | {row.get('step', '')} | {done} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="run names are shown relative to it")
    args = ap.parse_args()
    runs = run_folders(args.folders)
    if not runs:
        raise SystemExit(f"no metrics.csv under {[str(p) for p in args.folders]}")
    print(render(runs, args.root.resolve()))


if __name__ == "__main__":
    main()
