#!/usr/bin/env bash
# One batch of checks for a CUDA machine, sized to fit a ~10-minute slot:
#   1. the CUDA tests (skipped on CPU-only machines),
#   2. Cat&Dog F1 runs of 2,000 steps, run side by side on the one GPU (issue 4's collapse check),
#   3. median training-step times on the GPU (scripts/bench_step_time.py),
#   4. the solver benchmark's small sizes on the GPU (scripts/bench_solver.py --quick).
# Usage: DATA_ROOT=<folder with catdog50.npz, cifar10.npz> bash scripts/gpu_checks.sh OUT_DIR
# Everything lands in OUT_DIR (logs, run folders, tables).
set -u
OUT=${1:?usage: gpu_checks.sh OUT_DIR}
PY=${PY:-python3}
STEPS=${STEPS:-2000}
mkdir -p "$OUT/runs"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
{ nvidia-smi -L; $PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"; } > "$OUT/machine.txt" 2>&1

# 1. CUDA tests
timeout 60 $PY -m pytest -q -p no:cacheprovider -rs tests/test_solver_batch.py tests/test_objectives_ratio.py \
    > "$OUT/cuda_tests.log" 2>&1

# 2. decode the pack once (the runs below share its cache), then the F1 runs side by side
$PY -c "from omegaconf import OmegaConf; from data import build_data; import os; \
c = OmegaConf.load('configs/dataset/catdog.yaml'); c.root = os.environ['DATA_ROOT']; \
build_data(c, seed=0); print('decoded')" > "$OUT/decode.log" 2>&1 || true
run() {  # name, overrides... (each capped so the later checks still run)
    local name=$1; shift
    timeout ${RUN_TIMEOUT:-270} $PY train.py dataset=catdog trainer.max_steps=$STEPS trainer.eval_every=500 \
        hydra.run.dir="$OUT/runs/$name" "$@" > "$OUT/runs/$name.log" 2>&1
}
run ce objective=ce &
run f1_softmax objective=f1_lp objective.phi=softmax &
run f1_softmax_st objective=f1_lp objective.phi=softmax_st &
run f1_sign objective=f1_lp objective.phi=sign &
run f1_softmax_st_mid objective=f1_lp objective.phi=softmax_st objective.bound=mid &
run f1_softmax_st_lr0.01 objective=f1_lp objective.phi=softmax_st optimizer.lr=0.01 &
wait

# 3. step times (batch 64, ResNet-18), binary and 3-group tasks
timeout 80 $PY scripts/bench_step_time.py --dataset cifar10 --device cuda --steps 30 \
    --objectives ce auc_lp f1_lp ppd_sg direct_ap \
    --out "$OUT/step_time" > "$OUT/step_time_binary.log" 2>&1
timeout 50 $PY scripts/bench_step_time.py --dataset cifar10 --device cuda --steps 30 \
    --task multiclass --objectives ce auc_ova_lp auc_mu_lp --out "$OUT/step_time" \
    > "$OUT/step_time_multiclass.log" 2>&1

# 4. solver cells at batch / n = 32, 64 on the GPU (cvxpylayers cells error: not installed there)
timeout 70 $PY scripts/bench_solver.py --quick --device cuda --out "$OUT/solver" \
    > "$OUT/solver.log" 2>&1
echo done
