#!/usr/bin/env bash
# Checks for a CUDA machine (the device tool lends one to some sessions for ~15 minutes), in
# sections sized for one call each:
#   cuda_tests  the tests CPU-only machines skip for want of CUDA (node ids below)
#   f1_sweep1   Cat&Dog f1_lp variants, 2,000 steps each, side by side on the one GPU
#   f1_sweep2   the margin and CE-initialised f1_lp variants that sweep1's results called for
#   step_time   median training-step times on the GPU (scripts/solver/bench_step_time.py)
#   solver      the solver benchmark's small sizes on the GPU (scripts/solver/bench_solver.py --quick)
# Usage: DATA_ROOT=<folder with catdog50.npz, cifar10.npz> bash scripts/campaign/gpu_checks.sh OUT_DIR SECTION...
# Everything lands in OUT_DIR (logs, run folders, tables). Results of the sessions that ran it are
# summarised in results/f1_catdog/README.md.
set -u
OUT=${1:?usage: gpu_checks.sh OUT_DIR SECTION...}; shift
PY=${PY:-python3}
STEPS=${STEPS:-2000}
RUN_TIMEOUT=${RUN_TIMEOUT:-270}   # cap per training run, so later sections still run
mkdir -p "$OUT/runs"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
{ nvidia-smi -L; $PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"; } > "$OUT/machine.txt" 2>&1

run() {  # name, train.py overrides... (Cat&Dog, STEPS steps, eval every 500)
    local name=$1; shift
    timeout "$RUN_TIMEOUT" $PY train.py dataset=catdog trainer.max_steps=$STEPS trainer.eval_every=500 \
        hydra.run.dir="$OUT/runs/$name" "$@" > "$OUT/runs/$name.log" 2>&1
}

decode() {  # decode the pack once, so the parallel runs share its cache
    $PY -c "from omegaconf import OmegaConf; from lpmetrics.data import build_data; import os; \
c = OmegaConf.load('configs/dataset/catdog.yaml'); c.root = os.environ['DATA_ROOT']; \
build_data(c, seed=0); print('decoded')" > "$OUT/decode.log" 2>&1 || true
}

cuda_tests() {   # every test that CPU machines skip for want of CUDA (-rs lists what still skips)
    # pytest where the machine lacks it: wheels carried in .whl/pytest/ (build them here with
    # .venv/bin/pip wheel --no-deps -w .whl/pytest pytest==9.2.0 pluggy iniconfig packaging pygments)
    : > "$OUT/cuda_tests.log"
    if ! $PY -c "import pytest, hydra" 2>/dev/null; then   # (hydra too: tests/conftest.py composes configs)
        local site; site=$(mktemp -d)
        $PY -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl .whl/pytest/*.whl >> "$OUT/cuda_tests.log" 2>&1
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    timeout 240 $PY -m pytest -q -p no:cacheprovider -rs \
        tests/test_solver_batch.py::test_cuda_matches_cpu \
        tests/test_objectives_ratio_relaxation.py::test_cuda_matches_cpu \
        tests/test_solver_capture.py::test_cuda_graph_capture_and_replay \
        tests/test_solver_highs.py::test_cuda_tensors_raise \
        tests/test_packed_pack_forward.py::test_an_epsilon_sweep_captures_in_a_cuda_graph \
        tests/test_data_stream.py::test_cpu_and_cuda_streams_give_the_same_batches \
        tests/test_objectives_capture_f1.py::test_cuda_graph_capture_and_replay \
        tests/test_objectives_capture_ova.py::test_cuda_graph_capture_and_replay \
        tests/test_packed_gemm.py::test_cuda_gemm_is_in_the_precision_class_of_vmap \
        tests/test_packed_gemm.py::test_cuda_graph_capture_replays_the_gemm_pack \
        tests/test_packed_onepass_sgd.py::test_one_pass_captured_in_a_cuda_graph_equals_the_eager_update \
        tests/test_packed_evaluate.py::test_pack_predict_on_cuda_agrees_with_predict \
        tests/test_packed_select.py::test_on_cuda_the_reference_is_tf32_on_vs_off_and_loop_passes \
        tests/test_packed_select.py::test_on_cuda_streams_equals_lone_runs_bit_for_bit_and_replays_as_a_graph \
        >> "$OUT/cuda_tests.log" 2>&1
}

# The sweeps pin every knob, so they rerun as recorded in results/f1_catdog/ whatever the config
# defaults are now (they ran before the f1_lp config took phi=softmax_st, margin=0.5, lr=0.01, and
# before the ratio LPs were solved in float64: see results/f1_catdog/README.md).
PAPER=(objective=f1_lp objective.phi=softmax objective.bound=upper objective.margin=0 optimizer.lr=0.1)

f1_sweep1() {  # the paper's phi, straight-through phi, hard sign, the mid bound, a lower lr
    decode
    run ce objective=ce &
    run f1_softmax "${PAPER[@]}" &
    run f1_softmax_st "${PAPER[@]}" objective.phi=softmax_st &
    run f1_sign "${PAPER[@]}" objective.phi=sign &
    run f1_softmax_st_mid "${PAPER[@]}" objective.phi=softmax_st objective.bound=mid &
    run f1_softmax_st_lr0.01 "${PAPER[@]}" objective.phi=softmax_st optimizer.lr=0.01 &
    wait
}

f1_sweep2() {  # margins in the boxes; starting from 500 steps of cross-entropy
    decode
    STEPS=500 run ce500 objective=ce
    local init="trainer.init_from=$OUT/runs/ce500/last.pt"
    run f1_m0.5 "${PAPER[@]}" objective.margin=0.5 &
    run f1_st_m0.5 "${PAPER[@]}" objective.phi=softmax_st objective.margin=0.5 &
    run f1_st_m0.5_lr0.01 "${PAPER[@]}" objective.phi=softmax_st objective.margin=0.5 optimizer.lr=0.01 &
    run f1_m0.5_lr0.01 "${PAPER[@]}" objective.margin=0.5 optimizer.lr=0.01 &
    run f1_init_ce500 "${PAPER[@]}" "$init" &
    run f1_m0.5_init_ce500 "${PAPER[@]}" objective.margin=0.5 "$init" &
    wait
}

step_time() {  # the small cifar10 pack carried to the device has 2,500 train images
    timeout 80 $PY -m scripts.solver.bench_step_time --dataset cifar10 --device cuda --steps 30 \
        --objectives ce auc_lp f1_lp ppd_sg direct_ap --set dataset.val_size=500 \
        --out "$OUT/step_time" > "$OUT/step_time_binary.log" 2>&1
    timeout 50 $PY -m scripts.solver.bench_step_time --dataset cifar10 --device cuda --steps 30 \
        --task multiclass --neg-keep 1.0 --objectives ce auc_ova_lp auc_mu_lp \
        --set dataset.val_size=500 dataset.drop_rate=0.9 --out "$OUT/step_time" \
        > "$OUT/step_time_multiclass.log" 2>&1
}

solver() {  # cvxpylayers cells error there: it is not installed on the GPU image
    timeout 70 $PY -m scripts.solver.bench_solver --quick --device cuda --out "$OUT/solver" \
        > "$OUT/solver.log" 2>&1
}

for section in "$@"; do "$section"; done
echo done
