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
  printf '%-14s lr %-7s final validation loss %s\n' "$name" "$lr" \
    "$(tail -n 1 "$out/$name-$lr/$name.csv" | cut -d, -f4)"
}
for lr in ${ADAMW_LRS-0.001 0.002 0.004 0.008 0.016}; do run adamw "$lr" "$@"; done
for lr in ${MUON_LRS-0.005 0.01 0.02 0.04 0.08}; do run muon "$lr" "$@"; done
# The other registry entries (docs/optimizers.md): three values each around
# the scale of its update (sign updates: AdamW's lr / 10; Adam-like: AdamW's;
# unscaled or norm-relative orthogonalized updates: per entry). ENTRIES
# selects some ("" skips them); LRS_<entry> replaces an entry's values.
declare -A lrs=(
  [lion]="0.0002 0.0006 0.002" [signum]="0.0002 0.0006 0.002" [laprop]="0.0015 0.004 0.01"
  [sim_ademamix]="0.0003 0.001 0.003" [soap]="0.0015 0.004 0.01" [mop]="0.0015 0.004 0.01"
  [polargrad]="0.03 0.3 3" [scion]="0.005 0.02 0.08" [spel]="0.01 0.04 0.15"
  [muon_hyperball]="0.01 0.03 0.1" [dion2]="0.01 0.03 0.1" [nordion2]="0.01 0.03 0.1"
  [dion]="0.003 0.01 0.03 0.1" [iso]="0.001 0.003 0.01 0.03"
  [oblique_sgd]="0.003 0.01 0.03 0.1" [oblique_adam]="0.0003 0.001 0.003 0.01"
  [moso]="0.0003 0.001 0.003 0.01" [kl_soap]="0.001 0.003 0.01" [kl_m_soap]="0.001 0.003 0.01"
  [rekls]="0.001 0.003 0.01" [rekls_v3]="0.001 0.003 0.01" [stacked_soap]="0.001 0.003 0.01"
  [psgd_pro]="0.001 0.003 0.01 0.03 0.1 0.3"
)
for name in ${ENTRIES-lion signum laprop sim_ademamix soap polargrad scion mop spel muon_hyperball dion2 nordion2 dion iso oblique_sgd oblique_adam moso kl_soap kl_m_soap rekls rekls_v3 stacked_soap psgd_pro}; do
  var="LRS_$name"
  for lr in ${!var:-${lrs[$name]}}; do run "$name" "$lr" "$@"; done
done
