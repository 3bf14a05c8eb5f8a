#!/usr/bin/env bash
# Copy the progress of the CPU headline runs (scripts/studies/headline_runs.txt; folders with checkpoints
# live outside the repository, default ~/runs/headline_cifar10) into
# results/paper_tables/cpu_headline/<run>/ with scripts/tables/snapshot_runs.sh (metrics, config,
# evaluation lines, last progress line; never checkpoints). A run that reached 40k steps is
# folded instead: python -m scripts.campaign fold-cpu <run folder>.
#   bash scripts/studies/headline_snapshot.sh [RUNS_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/tables/snapshot_runs.sh "${1:-$HOME/runs/headline_cifar10}" results/paper_tables/cpu_headline
