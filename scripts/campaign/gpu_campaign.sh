#!/usr/bin/env bash
# The campaign's one device command: the next queued runs of the paper's tables that
# fit this command, trained to their full 40k steps as packs; metrics only. See scripts/campaign/cli.py.
#
#   (here, before: python -m lpmetrics.run.provenance stamp -- carry .code_version.json, .whl and the data pack)
#   OUT=<folder> DATA_ROOT=<folder with the data pack> bash scripts/campaign/gpu_campaign.sh
#   (here, afterwards: python -m scripts.campaign fold <returned OUT>; then commit results/paper_tables)
#
# Which pack to carry: `python -m scripts.campaign status` names the next dataset. Env: BUDGET
# (wall seconds for probe + training + export, default 480; a hard timeout at BUDGET + 40 s keeps the
# command under the device's 600 s), EVAL_EVERY (2000), DEVICE (auto), CAMPAIGN_DIR
# (results/paper_tables: its queue.json and ledger.json say what is pending), PROBE_N (8),
# MAX_PACK, CUDA_GRAPH (1: replay capturable packs from a CUDA graph), SPEED (a speed JSON instead of
# the probe: a previous command's plan.json "speed" on the same machine), EXCLUDE (a file of queue
# keys to leave out: the runs an earlier command on the same machine trained), DATASET (plan only
# this dataset's runs: the one whose data pack the machine has), EXTRA (more overrides,
# only keys that define no protocol, e.g. "trainer.eval_batch_size=1024"), PY (python3).
# Hydra/OmegaConf missing on the machine: wheels from .whl/ (scripts/campaign/device_env.sh).
# Leaves under OUT only: machine.txt, plan.json, runs.jsonl.gz, campaign.log.
set -u
. "$(dirname "$0")/device_env.sh"   # OUT, PY, ROOT, wheels, machine_txt
BUDGET=${BUDGET:-480}
machine_txt "$OUT/machine.txt"
set -f   # word lists below, never globs (an override like x=[1,2] stays as typed)
read -r -a extra <<< "${EXTRA:-}"
timeout --signal=TERM $((${BUDGET%.*} + 40)) $PY -m scripts.campaign --dir "${CAMPAIGN_DIR:-$ROOT/results/paper_tables}" \
    run --out "$OUT" --budget-s "$BUDGET" --eval-every "${EVAL_EVERY:-2000}" --device "${DEVICE:-auto}" \
    --probe-n "${PROBE_N:-8}" ${MAX_PACK:+--max-pack "$MAX_PACK"} ${CUDA_GRAPH:+--cuda-graph} \
    ${SPEED:+--speed "$SPEED"} ${EXCLUDE:+--exclude "$EXCLUDE"} ${DATASET:+--dataset "$DATASET"} \
    ${extra[0]:+--set "${extra[@]}"} \
    2>&1 | tee "$OUT/campaign.log"
exit "${PIPESTATUS[0]}"
