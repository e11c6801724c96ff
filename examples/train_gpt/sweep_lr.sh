#!/usr/bin/env bash
# The learning-rate sweep behind muon-train-gpt's presets: each optimizer of
# the default comparison at several peak learning rates (the schedule's
# min_lr follows at 10%), on the default task, model and budget, 2 ranks.
# Prints each run's final validation loss; the presets use the best.
#
#   examples/train_gpt/sweep_lr.sh build/examples/train_gpt/muon-train-gpt [extra flags]
set -euo pipefail
bin=${1:?usage: sweep_lr.sh path/to/muon-train-gpt [flags...]}
shift
out=${SWEEP_OUT:-sweep_out}
mkdir -p "$out"
run() {  # run NAME LR
  local name=$1 lr=$2 min
  shift 2
  min=$(awk "BEGIN{print $lr/10}")
  "$bin" --runs "$name" --set "$name:lr=$lr" --set "$name:min_lr=$min" --no-plot --no-progress \
    --out "$out/$name-$lr" "$@" > "$out/$name-$lr.log" 2>&1
  printf '%-6s lr %-7s final validation loss %s\n' "$name" "$lr" \
    "$(tail -n 1 "$out/$name-$lr/$name.csv" | cut -d, -f4)"
}
for lr in ${ADAMW_LRS-0.001 0.002 0.004 0.008 0.016}; do run adamw "$lr" "$@"; done
for lr in ${MUON_LRS-0.005 0.01 0.02 0.04 0.08}; do run muon "$lr" "$@"; done
