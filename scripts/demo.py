"""`make demo`: train the MLP on imbalanced digits (83 % positives) with several objectives and
print a small table of test metrics. Runs anywhere (digits ships with scikit-learn), ~1 min on CPU.

    python -m scripts.demo [objective ...]     # default: ce auc_lp f1_lp ppd_sg
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from lpmetrics.run.loop import train

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_OBJECTIVES = ("ce", "auc_lp", "f1_lp", "ppd_sg")


def main(objectives: list[str]) -> None:
    rows = []
    for name in objectives:
        if not (ROOT / "configs" / "objective" / f"{name}.yaml").exists():
            print(f"[demo] objective={name}: no config yet, skipped")
            continue
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("config", overrides=["experiment=demo", f"objective={name}", "device=cpu"])
        start = time.perf_counter()
        results = train(cfg, ROOT / "outputs" / "demo" / name)
        final = results["final"]
        rows.append((name, final["test_auc"], final["test_ap"], final["test_f1"], final["test_acc"],
                     results["timing_ms_median"]["step"], time.perf_counter() - start))
    print("\nDigits, binary 0-4 vs 5-9, train split 83 % positive (neg_keep=0.2), MLP, 300 steps")
    print(f"{'objective':<12}{'test AUC':>10}{'test AP':>10}{'test F1':>10}{'test acc':>10}"
          f"{'ms/step':>10}{'run s':>8}")
    for name, auc, ap, f1, acc, ms, secs in rows:
        print(f"{name:<12}{auc:>10.4f}{ap:>10.4f}{f1:>10.4f}{acc:>10.4f}{ms:>10.2f}{secs:>8.1f}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT_OBJECTIVES))
