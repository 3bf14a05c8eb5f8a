#!/usr/bin/env bash
# The whole LP-AUC vs cross-entropy study on CIFAR-10 at 91 % positives
# (results/lp_vs_ce_cifar10/README.md): every run, two at a time (one CPU thread each).
#   DATA_ROOT=../shared/data bash scripts/studies/lp_vs_ce_study.sh [NAME_REGEX]   (DRY=1: only list them)
# A run whose folder already has results.json is skipped; one with a last.pt (interrupted) is
# resumed; so the script can be restarted until everything is done. The runs are listed in
# scripts/studies/lp_vs_ce_runs.txt (the lr grid there is for the best LP setting). Each run is
# scripts/studies/lp_vs_ce_run.sh NAME OVERRIDES (5,000 steps, eval every 500, the paper's schedule).
# Another study with the same protocol: RUNS=<runs file> STUDY_DIR=<folder> STEPS=<n> (exported,
# so each run sees them), e.g. scripts/studies/precision_runs.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
pattern="${1:-.}"
todo=()
while IFS='|' read -r name ov; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  [[ "$name" =~ $pattern ]] || continue
  dir="${STUDY_DIR:-results/lp_vs_ce_cifar10}/$name"
  [ -f "$dir/results.json" ] && continue
  [ -f "$dir/last.pt" ] && ov="$ov resume=true"
  todo+=("$name $ov")
done < "${RUNS:-scripts/studies/lp_vs_ce_runs.txt}"
echo "${#todo[@]} run(s) to do"
[ "${#todo[@]}" -eq 0 ] && exit 0
if [ -n "${DRY:-}" ]; then printf '  %s\n' "${todo[@]}"; exit 0; fi
printf '%s\n' "${todo[@]}" | xargs -P 2 -L 1 bash scripts/studies/lp_vs_ce_run.sh
