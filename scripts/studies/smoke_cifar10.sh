#!/usr/bin/env bash
# Run every objective for a few steps on CIFAR-10 through train.py and summarise the run folders.
#   DATA_ROOT=../shared/data bash scripts/studies/smoke_cifar10.sh [steps] [objective ...]
# Binary objectives run on neg_keep=0.1 (91 % positives); the multi-class ones on task=multiclass.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
STEPS=${1:-200}; shift || true
OBJECTIVES=${*:-ce auc_lp f1_lp fbeta_lp jaccard_lp prec_at_recall_lp auc_ova_lp auc_mu_lp ppd_sg ppd_adagrad direct_ap surrogate auc_cvxpy f1_cvxpy auc_blackbox}
OUT=results/smoke_cifar10; mkdir -p $OUT
for obj in $OBJECTIVES; do
  case $obj in
    auc_ova_lp|auc_mu_lp) data="dataset.task=multiclass dataset.drop_rate=0.9" ;;
    *) data="dataset.neg_keep=0.1" ;;
  esac
  echo "== $obj"
  $PY train.py dataset=cifar10 $data objective=$obj trainer.max_steps=$STEPS \
      trainer.eval_every=$STEPS hydra.run.dir=$OUT/$obj > $OUT/$obj.stdout.log 2>&1 \
      || { echo "FAILED: $obj (see $OUT/$obj.stdout.log)"; continue; }
done
$PY - "$OUT" <<'PY'
import json, sys
from pathlib import Path
rows = ["| objective | task | test AUC / AUC_mu | test F1 | step ms (median) |", "|---|---|---:|---:|---:|"]
for p in sorted(Path(sys.argv[1]).glob("*/results.json")):
    r = json.loads(p.read_text()); f = r["final"]; t = r["config"]["dataset"]["task"]
    auc = f.get("test_auc", f.get("test_auc_mu"))
    rows.append(f"| {p.parent.name} | {t} | {auc:.4f} | {f.get('test_f1', float('nan')):.4f} | {r['timing_ms_median']['step']:.0f} |")
text = "\n".join(rows)
print(text); (Path(sys.argv[1]) / "summary.md").write_text(text + "\n")
PY
