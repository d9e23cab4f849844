#!/usr/bin/env bash
# Model runs behind EVAL.md "Cascades": per set, each model's PCD-only evaluation on the
# same 400 items (`--n 400 --seed 0`), saved with per-item log scores (`--out`). The small
# model also runs with the label-free contextual calibration (a gate signal). Then
# `pcd eval --cascade SMALL.json,LARGE.json` (pcd_tools.eval.cascade) splits the items into a
# calibration half and a held-out half and sweeps, fits and reports without a model.
# Usage: scripts/cascade_runs.sh [R] [SETS...]   (the models: python ../shared/models/fetch.py)
# N sets the item count (default 400); RUNS picks the runs (default: all four).
set -euo pipefail
R=${1:-/tmp/cascade_runs}; shift || true
SETS=${*:-sst2 sms_spam}
M=${PCD_MODELS:-$HOME/.cache/pcd-tools/models}
mkdir -p "$R"
run() {  # name model dataset [extra args]
  local name=$1 model=$2 d=$3; shift 3
  case " ${RUNS:-135m 135m-contextual 0.5b 1.5b} " in *" $name "*) ;; *) return 0 ;; esac
  [ -f "$R/${d}_$name.json" ] && return 0
  pcd eval --dataset "$d" --n "${N:-400}" --seed 0 --no-baseline ${model:+--model "$model"} \
      --out "$R/${d}_$name.json" "$@" --json > "$R/${d}_$name.log"
}
for D in $SETS; do
  run 135m "" "$D"
  run 135m-contextual "" "$D" --calibration contextual
  run 0.5b "$M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" "$D"
  run 1.5b "$M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" "$D"
done
