#!/bin/sh
# The main job's two runs (Muon hybrid and AdamW, 2 local ranks) on a quiet
# machine and under a background load of two busy threads; prints each
# run's ms/step and optimizer share both ways, and the ratios Muon/AdamW and
# busy/quiet against the targets (quiet: Muon's step <= 1.10x AdamW's; busy:
# Muon's step <= 1.5x its quiet time).
#
#   bench/busy_machine.sh [BUILD_DIR] [muon-train-gpt flags...]
#
# BUILD_DIR (default: build) holds muon-train-gpt and muon-launch
# (ninja -C BUILD_DIR muon-train-gpt muon-launch); MUON_LAUNCH picks another
# muon-launch (e.g. an older one, to compare). Default flags: --steps 60.
# Extra flags go to muon-train-gpt (e.g. --steps 120 instead of 60, --threads 2).
# Not a test: the numbers depend on the machine and on what else it runs.
set -eu

build=${1:-build}
[ $# -gt 0 ] && shift
train="$build/examples/train_gpt/muon-train-gpt"
if [ ! -x "$train" ]; then
  echo "busy_machine.sh: $train not found; build it: ninja -C $build muon-train-gpt muon-launch" >&2
  exit 2
fi
export MUON_LAUNCH="${MUON_LAUNCH:-$build/muon-launch}"  # the launcher the job starts its ranks with
out=$(mktemp -d)
spinners=""
cleanup() {
  for pid in $spinners; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT INT TERM

echo "cores: $(nproc), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# One mode: runs both, keeps rank 0's result table.
run_mode() {
  mode=$1
  shift
  steps="--steps 60"
  for a in "$@"; do
    case $a in --steps | --steps=*) steps="" ;; esac
  done
  # shellcheck disable=SC2086  # $steps: empty or two words
  # The first run of a process is slower (allocator and page cache warming
  # up; ~40% here): a warm-up AdamW run goes first and the awk below keeps
  # the last line of each optimizer.
  "$train" --nproc 2 $steps --runs adamw,muon,adamw --no-plot --no-progress \
    --out "$out/$mode" "$@" >"$out/$mode.log" 2>&1 || {
    echo "busy_machine.sh: the $mode run failed:" >&2
    tail -20 "$out/$mode.log" >&2
    exit 1
  }
  # "[rank 0] muon  <val loss>  <ms/step>  <opt share>%  ...": mode run ms share
  awk -v mode="$mode" '$1 == "[rank" && $2 == "0]" && ($3 == "muon" || $3 == "adamw") && NF >= 6 {
    sub("%", "", $6); print mode, $3, $5, $6 }' "$out/$mode.log" >>"$out/results"
}

run_mode quiet "$@"
# Two busy threads for the whole busy run.
for _ in 1 2; do
  sh -c 'while :; do :; done' &
  spinners="$spinners $!"
done
run_mode busy "$@"
for pid in $spinners; do kill "$pid" 2>/dev/null || true; done
spinners=""

awk '
  { ms[$1 "/" $2] = $3; share[$1 "/" $2] = $4 }
  END {
    printf "%-6s %-6s %10s %10s %12s\n", "mode", "run", "ms/step", "opt share", "opt ms/step"
    split("quiet busy", modes, " "); split("muon adamw", runs, " ")
    for (m = 1; m <= 2; ++m) for (r = 1; r <= 2; ++r) {
      k = modes[m] "/" runs[r]
      if (!(k in ms)) { print "missing result: " k; bad = 1; continue }
      printf "%-6s %-6s %10.1f %9.1f%% %12.1f\n", modes[m], runs[r], ms[k], share[k], ms[k] * share[k] / 100
    }
    if (bad) exit 1
    q = ms["quiet/muon"] / ms["quiet/adamw"]
    b = ms["busy/muon"] / ms["quiet/muon"]
    printf "Muon/AdamW step: quiet %.2fx (target <= 1.10x: %s), busy %.2fx\n", q,
           q <= 1.10 ? "met" : "NOT met", ms["busy/muon"] / ms["busy/adamw"]
    printf "busy/quiet step: Muon %.2fx (target <= 1.5x: %s), AdamW %.2fx\n", b,
           b <= 1.5 ? "met" : "NOT met", ms["busy/adamw"] / ms["quiet/adamw"]
  }' "$out/results"
grep -h "muon-launch: .* for each rank" "$out/quiet.log" | head -1 || true
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
