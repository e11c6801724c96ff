#!/usr/bin/env bash
# The main job in one command: installs what is missing, builds the library,
# the launcher and muon-train-gpt, then trains the default small GPT with the
# Muon hybrid and with AdamW on 2 local ranks (same seed, same tokens) and
# prints the comparison table and where the plot is.
#
#   scripts/demo.sh                      # default comparison
#   scripts/demo.sh --steps 800          # any muon-train-gpt flag
#   BUILD_DIR=/tmp/b OUT=/tmp/run scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-train_gpt_out}
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_NOHASHDIR=true

start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target muon-train-gpt muon-launch
echo "demo: built in $(( $(date +%s) - start )) s"

"$BUILD_DIR/examples/train_gpt/muon-train-gpt" --nproc 2 --out "$OUT" "$@"
echo "demo: finished in $(( $(date +%s) - start )) s"
