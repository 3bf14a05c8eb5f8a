"""Regenerate the paper's tables from run folders (reads only results.json).

    python scripts/make_tables.py multirun/2026-11-25/10-00-00 [more folders] --table binary
    python scripts/make_tables.py outputs --table multiclass --out results/tables/table2.md

Rows: objective; columns: dataset x imbalance level; cells: test metric in % at the final step
(mean ± std over seeds where several seeds ran). The paper's numbers are printed beside ours.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

# Facts from Meng et al. 2021 (seed 002, Tables 1 and 2), test AUC in %.
PAPER = {
    "binary": {  # (dataset, neg_keep) -> {objective: AUC %}
        **{("catdog", k): v for k, v in zip((0.1, 0.2, 0.4, 1.0), [
            {"ce": 67.6, "ppd_sg": 79.1, "ppd_adagrad": 77.3, "auc_lp": 78.6},
            {"ce": 74.6, "ppd_sg": 81.5, "ppd_adagrad": 80.6, "auc_lp": 81.3},
            {"ce": 85.1, "ppd_sg": 85.5, "ppd_adagrad": 83.7, "auc_lp": 85.6},
            {"ce": 87.4, "ppd_sg": 87.1, "ppd_adagrad": 86.3, "auc_lp": 87.8}])},
        **{("cifar10", k): v for k, v in zip((0.1, 0.2, 0.4, 1.0), [
            {"ce": 65.2, "ppd_sg": 69.8, "ppd_adagrad": 69.7, "auc_lp": 72.5},
            {"ce": 73.3, "ppd_sg": 73.9, "ppd_adagrad": 74.1, "auc_lp": 74.4},
            {"ce": 78.1, "ppd_sg": 79.1, "ppd_adagrad": 78.4, "auc_lp": 78.3},
            {"ce": 83.7, "ppd_sg": 82.6, "ppd_adagrad": 83.1, "auc_lp": 82.7}])},
        **{("cifar100", k): v for k, v in zip((0.1, 0.2, 0.4, 1.0), [
            {"ce": 57.8, "ppd_sg": 56.5, "ppd_adagrad": 56.2, "auc_lp": 58.2},
            {"ce": 58.4, "ppd_sg": 58.9, "ppd_adagrad": 59.0, "auc_lp": 60.5},
            {"ce": 62.2, "ppd_sg": 61.6, "ppd_adagrad": 62.6, "auc_lp": 64.5},
            {"ce": 66.3, "ppd_sg": 65.2, "ppd_adagrad": 67.6, "auc_lp": 69.0}])},
        **{("stl10", k): v for k, v in zip((0.1, 0.2, 0.4, 1.0), [
            {"ce": 63.5, "ppd_sg": 70.7, "ppd_adagrad": 68.5, "auc_lp": 68.4},
            {"ce": 67.1, "ppd_sg": 71.6, "ppd_adagrad": 72.4, "auc_lp": 71.1},
            {"ce": 72.7, "ppd_sg": 75.1, "ppd_adagrad": 76.7, "auc_lp": 76.7},
            {"ce": 80.8, "ppd_sg": 77.4, "ppd_adagrad": 78.5, "auc_lp": 81.6}])},
    },
    "multiclass": {  # (dataset, drop_rate) -> {objective: AUC^ova %}
        **{("cifar100", d): v for d, v in zip((0.9, 0.8, 0.6, 0.0), [
            {"ce": 54.3, "auc_ova_lp": 58.4}, {"ce": 59.4, "auc_ova_lp": 59.2},
            {"ce": 62.7, "auc_ova_lp": 64.1}, {"ce": 63.5, "auc_ova_lp": 65.7}])},
        **{("stl10", d): v for d, v in zip((0.9, 0.8, 0.6, 0.0), [
            {"ce": 66.9, "auc_ova_lp": 72.9}, {"ce": 68.0, "auc_ova_lp": 72.5},
            {"ce": 74.8, "auc_ova_lp": 75.7}, {"ce": 81.0, "auc_ova_lp": 82.7}])},
    },
}
TABLES = {  # table -> (metric key in results.json, imbalance config key)
    "binary": ("test_auc", "neg_keep"),
    "multiclass": ("test_auc_ova", "drop_rate"),
    "multiclass_mu": ("test_auc_mu", "drop_rate"),
    "f1": ("test_f1", "neg_keep"),
}


def collect(folders: list[Path], table: str) -> dict:
    metric, level_key = TABLES[table]
    cells: dict = defaultdict(list)
    for path in sorted(p for folder in folders for p in folder.rglob("results.json")):
        res = json.loads(path.read_text())
        cfg = res["config"]
        if metric not in res["final"]:
            continue
        name = res.get("choices", {}).get("objective") or cfg["objective"]["_target_"].rsplit(".", 1)[-1]
        key = (cfg["dataset"]["name"], float(cfg["dataset"][level_key]), name)
        cells[key].append(100 * res["final"][metric])
    return cells


def render(cells: dict, table: str) -> str:
    columns = sorted({(d, lvl) for d, lvl, _ in cells}, key=lambda c: (c[0], -c[1]))
    rows = sorted({o for _, _, o in cells})
    head = "| objective | " + " | ".join(f"{d} {lvl:g}" for d, lvl in columns) + " |"
    out = [head, "|---|" + "---:|" * len(columns)]
    for obj in rows:
        vals = []
        for d, lvl in columns:
            xs = cells.get((d, lvl, obj), [])
            cell = "-" if not xs else f"{statistics.fmean(xs):.1f}" + (
                f" ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else "")
            ref = PAPER.get(table, {}).get((d, lvl), {}).get(obj)
            vals.append(cell + (f" (paper {ref})" if ref is not None else ""))
        out.append(f"| {obj} | " + " | ".join(vals) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--table", choices=sorted(TABLES), default="binary")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    text = render(collect(args.folders, args.table), args.table)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
