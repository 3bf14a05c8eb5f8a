#!/usr/bin/env bash
# The whole LP-AUC vs cross-entropy study on CIFAR-10 at 91 % positives
# (results/lp_vs_ce_cifar10/README.md): every run, two at a time (one CPU thread each).
#   DATA_ROOT=../shared/data bash scripts/lp_vs_ce_study.sh [NAME_REGEX]
# A run whose folder already has results.json is skipped; one with a last.pt (interrupted) is
# resumed; so the script can be restarted until everything is done. Each run is
# scripts/lp_vs_ce_run.sh NAME OVERRIDES (5,000 steps, eval every 500, the paper's schedule).
set -euo pipefail
cd "$(dirname "$0")/.."
MARGIN="objective=auc_lp objective.score=margin objective.epsilon=1.0"
AUTHORS="dataset.augment=false optimizer.weight_decay=0 trainer.batch_size=32 trainer.eval_bn=train trainer.eval_batch_size=32"
RUNS=(
  "ce_s0|objective=ce seed=0"                                     # baseline
  "auc_lp_margin_eps1_s0|$MARGIN seed=0"                           # LP on the raw logit margin
  "ce_s1|objective=ce seed=1"
  "auc_lp_margin_eps1_s1|$MARGIN seed=1"
  "auc_lp_softmax_eps0.1_s0|objective=auc_lp objective.epsilon=0.1 seed=0"    # paper's score
  "auc_lp_softmax_eps0.1_s1|objective=auc_lp objective.epsilon=0.1 seed=1"
  "auc_lp_softmax_eps0.01_s0|objective=auc_lp objective.epsilon=0.01 seed=0"  # paper's setting
  "auc_lp_softmax_eps0.01_s1|objective=auc_lp objective.epsilon=0.01 seed=1"
  "ppd_sg_s0|objective=ppd_sg seed=0"                              # Liu et al. 2020
  "ppd_sg_s1|objective=ppd_sg seed=1"
  "auc_lp_margin_eps1_lr0.01_s0|$MARGIN optimizer.lr=0.01 seed=0"  # lr grid of the LP setting
  "auc_lp_margin_eps1_lr0.01_s1|$MARGIN optimizer.lr=0.01 seed=1"
  "auc_lp_margin_eps1_lr0.001_s0|$MARGIN optimizer.lr=0.001 seed=0"
  "auc_lp_margin_eps1_lr0.001_s1|$MARGIN optimizer.lr=0.001 seed=1"
  "authors_ce_s0|objective=ce $AUTHORS seed=0"                     # the authors' public code's protocol
  "authors_ce_s1|objective=ce $AUTHORS seed=1"
  "authors_auc_lp_softmax_eps0.01_s0|objective=auc_lp objective.epsilon=0.01 $AUTHORS seed=0"
  "authors_auc_lp_softmax_eps0.01_s1|objective=auc_lp objective.epsilon=0.01 $AUTHORS seed=1"
)
pattern="${1:-.}"
todo=()
for spec in "${RUNS[@]}"; do
  name="${spec%%|*}"; ov="${spec#*|}"
  [[ "$name" =~ $pattern ]] || continue
  dir="results/lp_vs_ce_cifar10/$name"
  [ -f "$dir/results.json" ] && continue
  [ -f "$dir/last.pt" ] && ov="$ov resume=true"
  todo+=("$name $ov")
done
echo "${#todo[@]} run(s) to do"
printf '%s\n' "${todo[@]}" | xargs -P 2 -L 1 bash scripts/lp_vs_ce_run.sh
