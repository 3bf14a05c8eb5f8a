#!/usr/bin/env bash
# One offline dataset's Table-1 block (4 levels x ce/auc_lp/ppd_sg/ppd_adagrad x lr grid x seeds,
# 40k steps) on a fresh lent GPU, packed, within one device command; see scripts/campaign/gpu_tables.py.
#
#   OUT=<folder> DATA_ROOT=<folder with the pack> bash scripts/campaign/gpu_tables.sh cifar10|catdog
#
# Env: BUDGET (wall seconds for planning + training + export, default 480: the device tool stops a
# command at 10 minutes, and a hard timeout here at BUDGET + 40 s keeps it under 9), STEPS (40000),
# EVAL_EVERY (10000), SEEDS ("0 1 2"), LRS ("0.1 0.01 0.001"), DEVICE (auto), OBJECTIVES
# ("ce auc_lp ppd_sg ppd_adagrad"; auc_lp_capture: auc_lp without host syncs), EXTRA (more
# overrides, e.g. "model=mlp"), PY (python3). Hydra/OmegaConf missing on the machine: wheels in
# .whl/ are installed into a temporary folder first (scripts/campaign/device_env.sh).
# Leaves under OUT only: machine.txt, plan.json, runs.jsonl.gz (metrics + results.json per run),
# tables.md, gpu_tables.log. Here: python -m scripts.campaign.gpu_tables unpack OUT/runs.jsonl.gz --into <dir>.
set -u
DATASET=${1:?usage: OUT=... bash scripts/campaign/gpu_tables.sh cifar10|catdog}
. "$(dirname "$0")/device_env.sh"   # OUT, PY, ROOT, wheels, machine_txt
BUDGET=${BUDGET:-480}
machine_txt "$OUT/machine.txt"
set -f   # word lists below, never globs (an override like x=[1,2] stays as typed)
read -r -a seeds <<< "${SEEDS:-0 1 2}"; read -r -a lrs <<< "${LRS:-0.1 0.01 0.001}"
read -r -a extra <<< "${EXTRA:-}"
read -r -a objectives <<< "${OBJECTIVES:-ce auc_lp ppd_sg ppd_adagrad}"
timeout --signal=TERM $((${BUDGET%.*} + 40)) $PY -m scripts.campaign.gpu_tables run --dataset "$DATASET" \
    --out "$OUT" --budget-s "$BUDGET" --steps "${STEPS:-40000}" --eval-every "${EVAL_EVERY:-10000}" \
    --seeds "${seeds[@]}" --lrs "${lrs[@]}" --device "${DEVICE:-auto}" --objectives "${objectives[@]}" \
    ${extra[0]:+--set "${extra[@]}"} 2>&1 | tee "$OUT/gpu_tables.log"
exit "${PIPESTATUS[0]}"
