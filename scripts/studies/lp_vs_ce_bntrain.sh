#!/usr/bin/env bash
# Evaluate each finished run of the LP-vs-CE study as the authors' public code does: BatchNorm on
# the statistics of each test batch of 32 (model never put in eval mode). Writes
# <run>/eval_test_bntrain.json next to the run's own (eval-mode) metrics; skips runs done already.
# Needs each run's last.pt: for runs kept outside the repository, pass their folder and copy the
# result with scripts/tables/snapshot_runs.sh.
#   DATA_ROOT=../shared/data bash scripts/studies/lp_vs_ce_bntrain.sh [RUNS_DIR]   (default results/lp_vs_ce_cifar10)
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" DATA_ROOT="${DATA_ROOT:-../shared/data}"
tmp=$(mktemp -d)
for run in "${1:-results/lp_vs_ce_cifar10}"/*/; do
  run=${run%/}
  [ -f "$run/results.json" ] && [ -f "$run/last.pt" ] && [ ! -f "$run/eval_test_bntrain.json" ] || continue
  "${PYTHON:-.venv/bin/python}" eval.py "$run" --bn-mode train --batch-size 32 --split test \
      --device cpu --out "$tmp/$(basename "$run")" > /dev/null
  cp "$tmp/$(basename "$run")/eval_test_bntrain.json" "$run/"
  echo "$run: $(tr -d '\n ' < "$run/eval_test_bntrain.json" | grep -o '"auc":[0-9.]*')"
done
rm -rf "$tmp"
