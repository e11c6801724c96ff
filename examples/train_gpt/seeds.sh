#!/usr/bin/env bash
# Runs muon-train-gpt at several seeds and reports each run's steps and wall
# time to the last run's final validation loss, mean and spread over the
# seeds (seeds_report.py), with a plot. Runs one job at a time: the wall
# times are the machine's alone.
#
#   examples/train_gpt/seeds.sh build/examples/train_gpt/muon-train-gpt --preset kjv
#   RUNS=muon,soap,adamw SEEDS="1 2 3" SEEDS_OUT=seeds_out examples/train_gpt/seeds.sh BIN [flags]
set -euo pipefail
bin=${1:?usage: seeds.sh path/to/muon-train-gpt [flags...]}
shift
out=${SEEDS_OUT:-seeds_out}
runs=${RUNS:-muon,adamw}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for seed in ${SEEDS:-1 2 3}; do
  "$bin" --runs "$runs" --seed "$seed" --no-plot --no-progress --out "$out/seed-$seed" "$@" \
    >"$out/seed-$seed.log" 2>&1
  echo "seed $seed: $(grep -c . "$out/seed-$seed.log") lines of log in $out/seed-$seed.log"
done
/usr/bin/python3 "$here/seeds_report.py" "$out" "${runs##*,}"
