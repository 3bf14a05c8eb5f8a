#!/usr/bin/env bash
# Copy what a results folder keeps of runs whose folders (with checkpoints) live outside the
# repository: for each SRC/<run>/ -> DST/<run>/: metrics.csv, results.json (once finished),
# eval_test_bntrain.json (scripts/studies/lp_vs_ce_bntrain.sh; an absolute checkpoint path in it cut to
# <run>/<file>), the resolved config, the evaluation and
# launch lines of train.log (evals.log) and its last progress line (progress.txt). Never a
# checkpoint. Rerun at any time: it refreshes the copies.
#   bash scripts/tables/snapshot_runs.sh SRC DST [NAME_REGEX]
set -euo pipefail
cd "$(dirname "$0")/../.."
src="$1"; dst="$2"; pattern="${3:-.}"
for run in "$src"/*/; do
  name=$(basename "$run"); [[ "$name" =~ $pattern ]] || continue
  out="$dst/$name"; mkdir -p "$out"
  for f in metrics.csv results.json; do
    [ -f "$run/$f" ] && cp "$run/$f" "$out/"
  done
  # the evaluation names its checkpoint by the path it was given: keep <run>/<file> of an
  # absolute one (a committed file carries no machine's paths)
  [ -f "$run/eval_test_bntrain.json" ] && sed -E 's#("checkpoint": ")/[^"]*/([^/"]+/[^/"]+")#\1\2#' \
      "$run/eval_test_bntrain.json" > "$out/eval_test_bntrain.json"
  [ -f "$run/.hydra/config.yaml" ] && cp "$run/.hydra/config.yaml" "$out/config.yaml"
  if [ -f "$run/train.log" ]; then
    # tqdm redraws with carriage returns: keep evaluation lines, launches and the last progress line
    tr '\r' '\n' < "$run/train.log" | grep -E '^ *step=|resum|Error|error' > "$out/evals.log" || true
    tr '\r' '\n' < "$run/train.log" | grep -E '^train:' | tail -n 1 > "$out/progress.txt" || true
  fi
  echo "$out"
done
