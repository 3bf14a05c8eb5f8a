#!/usr/bin/env bash
# The packing checks and benchmark on one lent GPU slot, as one device command (stops itself
# before 9.5 minutes):
#   1. scripts/packed/check_packed_device.py: NaN isolation, sync-free = eager, packed vs separate, CUDA graph
#   2. scripts/packed/bench_packed.py at 32 px: ce / auc_lp x fp32 / bf16 x N = 8 24 48 (eager, sync-free,
#      separate, graph), then a profile of one sync-free packed step (N = 24, ce) into the log
#   3. scripts/campaign/gpu_tables.sh cifar10: the Table-1 block, planned from measured speed, under a deadline
#
#   OUT=<folder> DATA_ROOT=<folder with cifar10.npz> bash scripts/packed/gpu_packed_slot.sh
#
# Env: CHECK_S (60), BENCH_S (160), PROFILE_S (45), TABLES_S (250: gpu_tables.sh's BUDGET), PY,
# DEVICE (cuda; the CPU test sets cpu with BENCH_N, PROFILE_N, CHECK_ARGS and gpu_tables.sh's
# STEPS / SEEDS / LRS / EXTRA small).
# Brings back 8 files (the device tool's limit): slot.log, check_packed_cuda.json, bench.json and
# tables/{machine.txt, plan.json, runs.jsonl.gz, tables.md, gpu_tables.log}. Here:
#   python -m scripts.packed.bench_packed --render <files>/bench.json --out results/packed_bench/gpu
#   python -m scripts.campaign.gpu_tables unpack <files>/tables/runs.jsonl.gz --into results/gpu_tables/<name>/runs
set -u
. "$(dirname "$0")/../campaign/device_env.sh"   # OUT, PY, ROOT, wheels, machine_txt
export DEVICE=${DEVICE:-cuda}
cd "$ROOT"
exec > >(tee "$OUT/slot.log") 2>&1
start=$(date +%s)
stamp() { echo "== $(( $(date +%s) - start )) s: $*"; }
stamp "check_packed_device"
timeout "${CHECK_S:-60}" $PY -m scripts.packed.check_packed_device --device "$DEVICE" ${CHECK_ARGS:-} \
    --out "$OUT/check_packed_cuda.json" || stamp "check rc $?"
stamp "bench_packed"
bench=$(mktemp -d)
timeout "${BENCH_S:-160}" $PY -m scripts.packed.bench_packed --device "$DEVICE" --px 32 --objectives ce auc_lp auc_lp_capture \
    --dtypes fp32 bf16 --n ${BENCH_N:-8 24 48} --reps 5 --budget-s $(( ${BENCH_S:-160} - 15 )) --out "$bench" \
    || stamp "bench rc $?"
cp "$bench/bench.json" "$OUT/" 2>/dev/null   # bench.md is in the log and rendered here again
stamp "profile"
timeout "${PROFILE_S:-45}" $PY -m lpmetrics.packed.speed --device "$DEVICE" --n "${PROFILE_N:-24}" --models resnet18 --profile --sync-free \
    || stamp "profile rc $?"
stamp "gpu_tables cifar10"
BUDGET=${TABLES_S:-250} OUT="$OUT/tables" bash scripts/campaign/gpu_tables.sh cifar10 || stamp "tables rc $?"
stamp "done"
