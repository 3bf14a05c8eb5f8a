"""Learned surrogate losses (Grabocka et al. 2019) against cross-entropy on CPU data obtainable
here: scikit-learn's digits (binary 0-4 vs 5-9) and the synthetic teacher data of Song et al.
NOT the paper's nine tabular datasets (results/surrogate_cpu/README.md says why and how to run them).

    OMP_NUM_THREADS=1 python -m results.surrogate_cpu.study          # train what is missing, print the table
    OMP_NUM_THREADS=1 python -m results.surrogate_cpu.study --table  # only table.md and curves.png

(from the repository root: a module of the namespace package ``results``, so ``train`` imports.)

Every run trains through ``lpmetrics.run.loop.train`` (the code ``python train.py`` runs), into
``results/surrogate_cpu/runs/<dataset>/<method>/seed<k>/`` (metrics.csv, results.json; no
checkpoints). A run folder that already holds results.json is not trained again.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from lpmetrics.run.loop import train

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

DATASETS = ("digits", "synthetic")
SEEDS = (0, 1, 2)
# Shared by every method, ce included. Adam for the model as in the paper (§4.1), but at 1e-3: the
# paper's 1e-5 is for 300k iterations and these runs have 400. Batch 100 = the paper's N.
COMMON = ["device=cpu", "logger=csv", "trainer.checkpoints=false", "trainer.batch_size=100",
          "trainer.max_steps=400", "trainer.eval_every=100", "optimizer._target_=torch.optim.Adam",
          "optimizer.lr=1e-3", "~optimizer.momentum", "optimizer.weight_decay=0"]
# The surrogate step: Algorithm 1's fresh scores in both; the step size either the paper's
# (Adam 1e-5, clipped at 1e-5: the objective's defaults) or the short-run option (1e-3, no clip).
FAST = ["objective.lr_beta=1e-3", "objective.clip_beta=null"]
LABEL = {"universal": "SL-U", "scratch": "SL-S", "refined": "SL-R"}


def methods(extra: bool = True) -> dict[str, list[str]]:
    """The main grid (ce, SL-U/S/R x target with the short-run step size), then, with ``extra``,
    SL-S/SL-R with the paper's surrogate step size (SL-U takes no surrogate step)."""
    out = {"ce": ["objective=ce"]}
    for target in ("auc", "f1"):
        for mode in ("universal", "scratch", "refined"):
            out[f"{LABEL[mode]}-{target}"] = ["objective=surrogate", f"objective.target={target}",
                                              f"objective.mode={mode}"] + FAST
    if extra:
        for target in ("auc", "f1"):
            for mode in ("scratch", "refined"):
                out[f"{LABEL[mode]}-{target}-paper-lr"] = [
                    "objective=surrogate", f"objective.target={target}", f"objective.mode={mode}"]
    return out


def run_dir(dataset: str, method: str, seed: int) -> Path:
    return HERE / "runs" / dataset / method / f"seed{seed}"


def plan() -> list[tuple[str, str, int]]:
    """Seed-major order, main grid first: a study cut short still has whole seeds of every method."""
    main, extra = methods(extra=False), [m for m in methods() if m not in methods(extra=False)]
    return [(d, m, s) for group in (list(main), extra) for s in SEEDS for d in DATASETS for m in group]


def train_missing() -> None:
    for dataset, method, seed in plan():
        out = run_dir(dataset, method, seed)
        if (out / "results.json").is_file():
            continue
        overrides = methods()[method]
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("config", overrides=COMMON + overrides + [f"dataset={dataset}", f"seed={seed}"])
        start = time.process_time()
        final = train(cfg, out, choices={"objective": overrides[0].split("=")[1],
                                               "dataset": dataset})["final"]
        print(f"[study] {dataset} {method} seed {seed}: test AUC {final['test_auc']:.4f} "
              f"F1 {final['test_f1']:.4f} ({time.process_time() - start:.1f} s CPU)", flush=True)


COLUMNS = [("test_auc", "AUC"), ("test_f1", "F1"), ("test_mcc", "MCC"), ("test_jaccard", "JAC"),
           ("test_eer", "EER"), ("test_acc", "1 - MCR")]


def table() -> str:
    lines = []
    for dataset in DATASETS:
        lines += [f"\n**{dataset}** (test split, step 400, mean ± std over seeds {list(SEEDS)}; step ms: median training step, wall clock on a shared 2-core machine)\n",
                  "| method | " + " | ".join(name for _, name in COLUMNS) + " | step ms |",
                  "|---|" + "---:|" * (len(COLUMNS) + 1)]
        for method in methods():
            finals, secs = [], []
            for seed in SEEDS:
                path = run_dir(dataset, method, seed) / "results.json"
                if path.is_file():
                    res = json.loads(path.read_text())
                    finals.append(res["final"])
                    secs.append(res["timing_ms_median"]["step"])
            if not finals:
                lines.append(f"| {method} | " + " | ".join("pending" for _ in COLUMNS) + " | |")
                continue
            cells = []
            for key, _ in COLUMNS:
                vals = [f[key] for f in finals]
                spread = f" ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else ""
                cells.append(f"{statistics.fmean(vals):.3f}{spread}" + ("" if len(vals) == len(SEEDS) else f" (n={len(vals)})"))
            lines.append(f"| {method} | " + " | ".join(cells) + f" | {statistics.fmean(secs):.1f} |")
    return "\n".join(lines) + "\n"


def figure(path: Path) -> None:
    """Test AUC and F1 against steps, mean over seeds, one panel per dataset and metric."""
    import csv

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(DATASETS), figsize=(6 * len(DATASETS) + 2.5, 7), squeeze=False)
    for col, dataset in enumerate(DATASETS):
        for color, method in enumerate(methods()):
            curves = [list(csv.DictReader(open(run_dir(dataset, method, seed) / "metrics.csv")))
                      for seed in SEEDS if (run_dir(dataset, method, seed) / "results.json").is_file()]
            if not curves:
                continue
            steps = [int(r["step"]) for r in curves[0]]
            style = "-" if method == "ce" else ("--" if method.endswith("paper-lr") else
                                                ":" if method.startswith("SL-U") else "-.")
            for row, key in enumerate(("test_auc", "test_f1")):
                mean = [statistics.fmean(float(c[i][key]) for c in curves) for i in range(len(steps))]
                axes[row][col].plot(steps, mean, style, marker="o", ms=3, color=plt.cm.tab20(color),
                                    label=f"{method} (n={len(curves)})" if row == col == 0 else None)
                axes[row][col].set(title=f"{dataset}: {key}", xlabel="step", ylim=(0, 1))
    fig.legend(loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1 - 2.5 / (6 * len(DATASETS) + 2.5), 1))
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="store_true", help="only write table.md and curves.png from the run folders")
    if not ap.parse_args().table:
        train_missing()
    text = table()
    (HERE / "table.md").write_text(text)
    figure(HERE / "curves.png")
    print(text)
