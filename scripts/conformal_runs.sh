#!/usr/bin/env bash
# Model runs behind EVAL.md "Prediction sets": per shared set, the calibration scores
# (300 items, disjoint from the evaluation sample) and a PCD-only evaluation on 300 items.
# Then `python scripts/conformal_report.py $R` fits the conformal sets from the scores and
# measures held-out coverage on the evaluation items. Usage: scripts/conformal_runs.sh [R]
set -euo pipefail
R=${1:-/tmp/conformal_runs}
mkdir -p "$R"
for D in sst2 sms_spam mams nlupp clinc150 banking77; do
  [ -f "$R/eval_$D.json" ] && continue
  # --eval-n/--eval-seed keep the calibration sample apart from `pcd eval --n 300 --seed 0`
  # where the two share one pool (banking77, sst2, sms_spam); the others calibrate on val.
  pcd calibrate --dataset "$D" --n 300 --seed 1 --eval-n 300 --eval-seed 0 \
      --out "$R/cal_$D.json" --scores "$R/scores_$D.json" --json > "$R/cal_$D.log"
  pcd eval --dataset "$D" --n 300 --seed 0 --no-baseline --out "$R/eval_$D.json" \
      --json > "$R/eval_$D.log"
done
