#!/usr/bin/env bash
# One run of the LP-AUC vs cross-entropy study (results/lp_vs_ce_cifar10/README.md).
# Usage: scripts/studies/lp_vs_ce_run.sh NAME [overrides...]
#   e.g. scripts/studies/lp_vs_ce_run.sh ce_s0 objective=ce seed=0
# CIFAR-10, 91 % positives, the paper's schedule, 5,000 steps, eval every 500, one CPU thread
# (env STUDY_DIR, STEPS, EVAL_EVERY change the folder and length: another study, same protocol).
# The log is appended to, so a resumed run (resume=true) keeps its history.
set -euo pipefail
cd "$(dirname "$0")/../.."
name="$1"; shift
out="${STUDY_DIR:-results/lp_vs_ce_cifar10}/$name"
mkdir -p "$out"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" DATA_ROOT="${DATA_ROOT:-../shared/data}"
"${PYTHON:-.venv/bin/python}" train.py dataset=cifar10 dataset.neg_keep=0.1 \
    trainer.max_steps="${STEPS:-5000}" trainer.eval_every="${EVAL_EVERY:-500}" "$@" \
    hydra.run.dir="$out" >> "$out/train.log" 2>&1
