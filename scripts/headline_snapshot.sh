#!/usr/bin/env bash
# Copy the progress of the CPU headline runs (scripts/headline_runs.txt; folders with checkpoints
# live outside the repository, default ~/runs/headline_cifar10) into
# results/paper_tables/cpu_headline/<run>/: metrics.csv, the resolved config, the evaluation lines
# of the log and the last progress line. Never checkpoints. A run that reached 40k steps is
# folded instead: python scripts/campaign.py fold-cpu <run folder>.
#   bash scripts/headline_snapshot.sh [RUNS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
src="${1:-$HOME/runs/headline_cifar10}"
dst=results/paper_tables/cpu_headline
for run in "$src"/*/; do
  name=$(basename "$run"); out="$dst/$name"; mkdir -p "$out"
  [ -f "$run/metrics.csv" ] && cp "$run/metrics.csv" "$out/"
  [ -f "$run/results.json" ] && cp "$run/results.json" "$out/"
  [ -f "$run/.hydra/config.yaml" ] && cp "$run/.hydra/config.yaml" "$out/config.yaml"
  if [ -f "$run/train.log" ]; then
    # tqdm redraws with carriage returns: keep evaluation lines, launches and the last progress line
    tr '\r' '\n' < "$run/train.log" | grep -E '^ *step=|resum|Error|error' > "$out/evals.log" || true
    tr '\r' '\n' < "$run/train.log" | grep -E '^train:' | tail -n 1 > "$out/progress.txt" || true
  fi
done
ls "$dst"
