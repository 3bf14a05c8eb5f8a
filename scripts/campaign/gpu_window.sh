#!/usr/bin/env bash
# One lent GPU window, campaign first, then the LP timings, as one device command
# of at most ~580 s with the defaults (run it with timeout_s=600). In order:
#   1. python -m lpmetrics.packed.check_graph: each Table-1 objective's pack step as a real CUDA graph
#      against the same step eagerly (ResNet-18, pack of 4, 8 steps)  -> check_graph.json
#   2. scripts/campaign/gpu_campaign.sh with CUDA_GRAPH=1 only if in step 1 ce ran and every objective that
#      ran gave graph = eager within GRAPH_TOL on losses and parameters (one that failed there
#      fails the campaign's probe too, and its runs are skipped), else eager steps
#                                          -> machine.txt, plan.json, runs.jsonl.gz, campaign.log
#   3. scripts/solver/time_capture_lp.py: the batch-64 AUC LP, standard and capture-safe, fwd + bwd; then
#      scripts/packed/time_pack_lp.py --graph: k runs' LPs one by one vs one batched LP
#                                          -> time_capture_lp.jsonl (both scripts' lines)
# plus window.log (this script's decisions). Seven files under OUT: all come back.
#
#   (here, before: python -m scripts.campaign status   # names the data pack;  python -m lpmetrics.run.provenance stamp)
#   device run, carry [.whl, .code_version.json, .devdata]:
#   OUT=$OUT DATA_ROOT=.devdata bash scripts/campaign/gpu_window.sh
#   (here, after: python -m scripts.campaign fold <returned folder>; commit results/paper_tables)
# A session's 15 device minutes hold one full command (start ~35 s + <= 600 s) and, on the machine
# still warm (30 s), a short second one, sent at once with nothing done here in between:
#   OUT=$OUT DATA_ROOT=$PWD/.devdata SECOND=1 BUDGET=<seconds left - 60> bash scripts/campaign/gpu_window.sh
# Each command leaves on the machine, in STATE (default .devstate/, git-ignored: the device keeps
# it between calls while warm), the graph check's verdict (graph), the campaign's probe
# (speed.json), its dataset (dataset) and the queue keys it planned (planned.txt, appended).
# SECOND=1 reads them: no graph check (CUDA_GRAPH as the first command found), the first
# command's probe as SPEED, the same dataset (its pack is the one carried), no LP timing; on a
# machine without that state it refuses (exit 2). Every command on the machine leaves out of its
# plan the runs an earlier one planned (EXCLUDE), done or stopped: a run is never planned twice on
# one machine (a stopped one waits for the next machine). Fold both returned folders here
# afterwards (python -m scripts.campaign fold OUT1 OUT2; a folder whose command planned nothing is passed over).
#
# Env: BUDGET (the campaign's, default 450 s), CHECK_S (45; 0 skips step 1 and takes CUDA_GRAPH as
# given), CAMPAIGN (0 skips step 2), TIMING_S (40; 0 skips step 3), TIMING_ARGS (more
# time_capture_lp.py arguments: "--compile" adds the inductor-compiled LP, ~1 min to compile),
# SPEED (passed to gpu_campaign.sh: no probe), GRAPH_TOL (1e-5), PY,
# DEVICE (cuda for steps 1 and 3, the campaign's auto for step 2), CHECK_ARGS (more check_graph
# arguments), and gpu_campaign.sh's own (CAMPAIGN_DIR, EVAL_EVERY, PROBE_N, ...). On the CPU, the
# script end to end (tests/test_campaign.py, slow): DEVICE=cpu CHECK_ARGS="--model mlp --steps 4".
set -u
. "$(dirname "$0")/device_env.sh"   # OUT, PY, ROOT, wheels on PYTHONPATH
STATE=${STATE:-$ROOT/.devstate}
if [ "${SECOND:-0}" != 0 ]; then   # a second command on the same warm machine: the first one's state
  need="graph"; [ "${CAMPAIGN:-1}" = 0 ] || need="graph speed.json planned.txt"
  for f in $need; do   # (planned.txt may be empty: the first command planned nothing)
    [ -e "$STATE/$f" ] || { echo "gpu_window.sh: SECOND=1 but no $STATE/$f: no first gpu_window.sh command with a campaign ran on this machine (a fresh machine?); run without SECOND"; exit 2; }
  done
  CHECK_S=${CHECK_S:-0}; TIMING_S=${TIMING_S:-0}
  CUDA_GRAPH=$(cat "$STATE/graph")
  if [ "${CAMPAIGN:-1}" != 0 ]; then
    SPEED=${SPEED:-$STATE/speed.json}; export SPEED
    if [ -z "${DATASET:-}" ] && [ -s "$STATE/dataset" ]; then DATASET=$(cat "$STATE/dataset"); export DATASET; fi
  fi
fi
CHECK_S=${CHECK_S:-45}; TIMING_S=${TIMING_S:-40}; GRAPH_TOL=${GRAPH_TOL:-1e-5}; DEV=${DEVICE:-cuda}
mkdir -p "$STATE"
# whatever the command: a run an earlier command on this machine planned is not planned again
if [ -z "${EXCLUDE:-}" ] && [ -e "$STATE/planned.txt" ]; then export EXCLUDE="$STATE/planned.txt"; fi
for v in CHECK_S TIMING_S; do
  case ${!v} in ''|*[!0-9]*) echo "gpu_window.sh: $v=${!v}: whole seconds, e.g. $v=45 (0 skips the step)"; exit 2;; esac
done
set -f; read -r -a check_args <<< "${CHECK_ARGS:-}"; set +f
log() { echo "[window $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/window.log"; }

if [ "$CHECK_S" -gt 0 ]; then
log "1. CUDA-graph check (timeout ${CHECK_S} s)"
(cd "$ROOT" && timeout --signal=TERM "$CHECK_S" $PY -m lpmetrics.packed.check_graph --device "$DEV" \
    --out "$OUT/check_graph.json" ${check_args[0]:+"${check_args[@]}"}) 2>&1 | tail -n 20 | tee -a "$OUT/window.log"
graph=$($PY - "$OUT/check_graph.json" "$GRAPH_TOL" <<'EOF'
import json, sys
from pathlib import Path
path, tol = Path(sys.argv[1]), float(sys.argv[2])
rows = json.loads(path.read_text()) if path.exists() else []
ran = [r for r in rows if "error" not in r]   # an objective that failed here fails the probe too: skipped
same = all(r["loss_diff_vs_eager"] <= tol and r["param_diff_vs_eager"] <= tol for r in ran)
print(1 if same and "ce" in {r["objective"] for r in ran} else 0)
EOF
)
log "graph check passed: ${graph:-0} (tolerance $GRAPH_TOL)"
echo "${graph:-0}" > "$STATE/graph"
else   # a second command on the same warm machine: the first one's check stands (CUDA_GRAPH as given)
case ${CUDA_GRAPH:-0} in 0|false|no|'') graph=0;; *) graph=1;; esac   # gpu_campaign.sh: any value = on
log "1. no graph check (CHECK_S=0): CUDA_GRAPH=$graph as given"
[ -e "$STATE/graph" ] || echo "$graph" > "$STATE/graph"
fi

rc=0
if [ "${CAMPAIGN:-1}" != 0 ]; then
  log "2. campaign (BUDGET=${BUDGET:-450}, CUDA_GRAPH=${graph:-0})"
  if [ "${graph:-0}" = 1 ]; then export CUDA_GRAPH=1; else unset CUDA_GRAPH; fi
  BUDGET=${BUDGET:-450} bash "$ROOT/scripts/campaign/gpu_campaign.sh"
  rc=$?
  log "campaign exit status $rc"
  # for a second command on this machine: the probe, and every key planned (done or not: never twice)
  $PY - "$OUT/plan.json" "$STATE" <<'EOF' 2>&1 | tee -a "$OUT/window.log"
import json, sys
from pathlib import Path
plan, state = Path(sys.argv[1]), Path(sys.argv[2])
if plan.exists():
    p = json.loads(plan.read_text())
    if p.get("speed"):   # the probe this command planned with
        (state / "speed.json").write_text(json.dumps(p["speed"]))
    if p.get("dataset"):
        (state / "dataset").write_text(p["dataset"] + "\n")
    with open(state / "planned.txt", "a") as f:
        f.writelines(k + "\n" for k in p.get("kept", []))
    print(f"state for a second command: {state} ({len(p.get('kept', []))} key(s) planned)")
EOF
else
  log "2. no campaign (CAMPAIGN=0)"
fi

if [ "$TIMING_S" -gt 0 ]; then
  log "3. batch-64 AUC LP timing (timeout ${TIMING_S} s)"
  end=$(( $(date +%s) + TIMING_S ))
  (cd "$ROOT" && timeout --signal=TERM "$TIMING_S" $PY -m scripts.solver.time_capture_lp --device "$DEV" \
      --repeats 30 --rounds 5 ${TIMING_ARGS:-}) > "$OUT/time_capture_lp.jsonl" 2>> "$OUT/window.log"
  log "time_capture_lp.py exit status $?"
  left=$(( end - $(date +%s) ))
  if [ "$left" -gt 0 ]; then
    (cd "$ROOT" && timeout --signal=TERM "$left" $PY -m scripts.packed.time_pack_lp --device "$DEV" --k 1 2 4 8 \
        --graph) >> "$OUT/time_capture_lp.jsonl" 2>> "$OUT/window.log"
    log "time_pack_lp.py exit status $?"
  fi
fi
exit "$rc"   # the campaign's: the timings are extras
