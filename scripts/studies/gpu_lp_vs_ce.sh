#!/usr/bin/env bash
# The LP-vs-CE study's runs (scripts/studies/lp_vs_ce_runs.txt) on one lent GPU, all side by side as
# separate train.py processes for a fixed wall budget, plus GPU step-time and packing numbers.
# Meant for the device tool's 15-minute slot (one command <= 10 minutes); it stops itself.
#
#   OUT=<folder> DATA_ROOT=<folder with cifar10.npz> bash scripts/studies/gpu_lp_vs_ce.sh
#
# Env: PY (python3), BUDGET (wall seconds for the training runs, 330), STEPS (max steps, 40000:
# the paper's length and schedule; runs cut by BUDGET stop at their last evaluation), EVAL_EVERY
# (1000), ONLY (regex over run names), DEVICE (cuda), BENCH (1: step-time and packing benchmarks
# first, ~90 s), SRC (code folder to run, default the repository root).
# Leaves under OUT: machine.txt, bench_step_time.md/.log, packed_speed.log, runs.tgz (each run's
# metrics.csv, results.json if it finished, train.log; no checkpoints), driver.log.
set -u
OUT=${OUT:?set OUT}; PY=${PY:-python3}; BUDGET=${BUDGET:-330}; STEPS=${STEPS:-40000}
EVAL_EVERY=${EVAL_EVERY:-1000}; ONLY=${ONLY:-.}; DEVICE=${DEVICE:-cuda}; BENCH=${BENCH:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd); SRC=${SRC:-$ROOT}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1 WANDB_MODE=disabled
mkdir -p "$OUT/runs"
exec > >(tee -a "$OUT/driver.log") 2>&1
{ date -u; nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; $PY -c "import sys, torch, torchvision, hydra, omegaconf; \
print('python', sys.version.split()[0], 'torch', torch.__version__, 'torchvision', torchvision.__version__, \
'hydra', hydra.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"; \
(cd "$SRC" && git log -1 --format='code %h %s' 2>/dev/null || echo "code: $SRC"); } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

cd "$SRC"
# decode the pack once so that the parallel runs share its cache
$PY -c "from omegaconf import OmegaConf; from lpmetrics.data import build_data; import os; \
c = OmegaConf.load('configs/dataset/cifar10.yaml'); c.pop('defaults', None); c.root = os.environ['DATA_ROOT']; \
build_data(c, seed=0); print('decoded')" || echo "decode failed (each run decodes itself)"

if [ "$BENCH" = 1 ]; then
  timeout 60 $PY -m scripts.solver.bench_step_time --dataset cifar10 --objectives ce auc_lp ppd_sg f1_lp \
      --steps 30 --device "$DEVICE" --out "$OUT/bench" > "$OUT/bench_step_time.log" 2>&1
  cp "$OUT"/bench/*.md "$OUT/bench_step_time.md" 2>/dev/null; rm -rf "$OUT/bench"
  timeout 45 $PY -m lpmetrics.packed.speed --device "$DEVICE" --n 1 8 24 --models resnet18 --reps 5 \
      > "$OUT/packed_speed.log" 2>&1
  tail -n 5 "$OUT/bench_step_time.log" "$OUT/packed_speed.log"
fi

pids=()
while IFS='|' read -r name ov; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  [[ "$name" =~ $ONLY ]] || continue
  mkdir -p "$OUT/runs/$name"
  # shellcheck disable=SC2086  # the overrides are words
  timeout --signal=TERM "$BUDGET" $PY train.py dataset=cifar10 dataset.neg_keep=0.1 \
      trainer.max_steps="$STEPS" trainer.eval_every="$EVAL_EVERY" device="$DEVICE" $ov \
      hydra.run.dir="$OUT/runs/$name" > "$OUT/runs/$name/train.log" 2>&1 &
  pids+=($!)
done < "$ROOT/scripts/studies/lp_vs_ce_runs.txt"
echo "${#pids[@]} runs started, budget ${BUDGET}s"
wait "${pids[@]}"   # not a bare wait: it would also wait for the tee of the log
for d in "$OUT"/runs/*/; do
  echo "$(basename "$d"): $(tail -n 1 "$d/metrics.csv" 2>/dev/null | cut -c1-80)"
done
(cd "$OUT" && tar czf runs.tgz --exclude='*.pt' --exclude='.hydra' runs && rm -rf runs)
echo "done $(date -u)"
