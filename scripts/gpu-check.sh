#!/usr/bin/env bash
# The one command of a lent GPU machine: builds what the GPU tests and
# benchmarks need, runs them and the main job on the GPU, and writes every
# result into one folder, within about 8 minutes on a 16-core H100/H200 box.
#
#   bash scripts/gpu-check.sh [--no-gpu | --gpu] [OUTDIR]
#
# OUTDIR: default $OUT (the device run's folder that comes back), else
# ./gpu-check-out. Steps, each under its own `timeout` and logged to
# OUTDIR/<step>.log:
#   env         nvidia-smi, Python, torch and its CUDA, nvcc, CMake, cores
#   configure   CMake in build-gpu (-DMUON_CUDA=ON, Ninja) against the torch
#               of the Python and the Debian packages of .gpu-deps/
#               (scripts/gpu-deps.sh, made on a machine with apt)
#   build       ninja -k 0: libmuon, test_cuda, the Python extension
#               (muon_cpp_C), muon-train-gpt, test_train_gpt; a missing or failed target is a
#               failed row, the rest go on
#   test_cuda   the gtest program (JSON report), beside
#   pytest_cuda tests/python/test_cuda.py (JUnit XML), both at once
#   train_test  test_train_gpt's --device tests (the main job on CUDA
#               against the CPU, checkpoints moved between them)
#   ns_bench    bench/gpu_newton_schulz.py: ours vs torch.optim.Muon's and
#               Keller Jordan's Newton–Schulz, bf16, with the GEMM rate
#   step_bench  bench/gpu_muon_step.py: one optimizer step of a 1B GPT's matrices
#   train       muon-train-gpt --device cuda: Muon against AdamW, ~1.5 min
# then OUTDIR/summary.json and OUTDIR/summary.md (rewritten after every
# step, and on exit whatever happened). Where OUTDIR is the device run's
# $OUT (at most 8 files come back), everything else is packed into
# OUTDIR/details.tar.gz (GPU_CHECK_PACK=0|1 overrides).
#
# --no-gpu (automatic where no GPU is seen): the same build, the tests (their
# GPU cases skip), the benchmarks in --device cpu --quick and a tiny CPU
# training run, with a longer time budget: to test this script without a GPU.
#
# On the device run: carry .gpu-deps; e.g.
#   run(command="bash scripts/gpu-check.sh", carry=[".gpu-deps"], timeout_s=600)
#
# Environment:
#   GPU_CHECK_BUILD_DIR  build directory (default ./build-gpu)
#   GPU_CHECK_DEPS       the unpacked packages (default ./.gpu-deps; absent: the system's)
#   GPU_CHECK_PYTHON     the Python with torch (default: the first of python3,
#                        /opt/torch/.venv/bin/python3, the torch 2.11 venv of
#                        scripts/venv-torch.sh whose torch is a CUDA build)
#   GPU_CHECK_BUDGET_S   seconds for the whole run (GPU: 470; --no-gpu: 3600)
#   GPU_CHECK_JOBS       ninja -j (default: nproc)
#   GPU_CHECK_TARGETS    what to build (default: muon test_cuda muon_cpp_C muon-train-gpt
#                        test_train_gpt)
#   GPU_CHECK_SKIP       steps to leave out, comma-separated (e.g. configure,build
#                        to rerun the rest on a finished build)
#   GPU_CHECK_CMAKE_ARGS more CMake arguments
#   GPU_CHECK_TRAIN_ARGS the main job's model and run flags (replaces the defaults)
#   GPU_CHECK_NS_ARGS, GPU_CHECK_STEP_ARGS  more flags of the two benchmarks
set -uo pipefail
START=$(date +%s)
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
mode=auto
outdir=""
while (($#)); do
  case $1 in
    --no-gpu) mode=nogpu ;;
    --gpu) mode=gpu ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu-check: unknown option $1 (--help)" >&2; exit 2 ;;
    *) outdir=$1 ;;
  esac
  shift
done

OUTDIR=${outdir:-${OUT:-$ROOT/gpu-check-out}}
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
BUILD=${GPU_CHECK_BUILD_DIR:-$ROOT/build-gpu}
mkdir -p "$BUILD" && BUILD=$(cd "$BUILD" && pwd)
DEPS=${GPU_CHECK_DEPS:-$ROOT/.gpu-deps}
JOBS=${GPU_CHECK_JOBS:-$(nproc)}
TARGETS=${GPU_CHECK_TARGETS:-muon test_cuda muon_cpp_C muon-train-gpt test_train_gpt}
SKIP=",${GPU_CHECK_SKIP:-},"
if [[ -z ${GPU_CHECK_PACK:-} ]]; then
  GPU_CHECK_PACK=0
  [[ -n ${OUT:-} && -d ${OUT:-} && $(cd "$OUT" && pwd) == "$OUTDIR" ]] && GPU_CHECK_PACK=1
fi
# A previous run's results would be mixed into this one's summary: its
# files go (this script's own names only).
(cd "$OUTDIR" && rm -rf steps.tsv summary.json summary.md summarize.log details.tar.gz env.log env.json \
  configure.log configure.note cmake-cache.txt targets.txt missing-targets.txt failed-outputs.txt build.log \
  test_cuda.log test_cuda.json train_test.log train_test.json pytest_cuda.log pytest_cuda.xml ns_bench.log ns_bench.json ns_bench.md \
  step_bench.log step_bench.json step_bench.md train.log train_summary.json train_gpt)
STEPS=$OUTDIR/steps.tsv
: >"$STEPS"
say() { echo "gpu-check [$(($(date +%s) - START))s]: $*" >&2; }

# ---- the Python with torch ---------------------------------------------------
python_ok() {  # a torch that is a CUDA build
  "$1" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1
}
PY=${GPU_CHECK_PYTHON:-}
if [[ -z $PY ]]; then
  for c in python3 /opt/torch/.venv/bin/python3 /var/tmp/muon-cpp-venv-torch2.11/bin/python; do
    if command -v "$c" >/dev/null 2>&1 && python_ok "$c"; then PY=$(command -v "$c"); break; fi
  done
fi
[[ -n $PY ]] || PY=$(command -v python3 || echo python3)
# That Python's bin/ first: its cmake, ninja, pytest, torchrun (a virtual
# environment's, as on the lent machines).
PATH="$(dirname "$PY"):$PATH"
# The summary needs only the standard library: any python3 will do.
SUMPY=$(command -v python3 || echo "$PY")

if [[ $mode == auto ]]; then
  mode=nogpu
  if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    mode=gpu
  fi
fi
if [[ $mode == gpu ]]; then
  BUDGET=${GPU_CHECK_BUDGET_S:-470}
  SCALE=1
else
  BUDGET=${GPU_CHECK_BUDGET_S:-3600}
  SCALE=8
fi
# No GPU: a CUDA_VISIBLE_DEVICES that hides none would not matter; the
# tests skip on their own.
say "mode $mode, budget ${BUDGET}s, python $PY, build $BUILD, out $OUTDIR"

# ---- the unpacked Debian packages ---------------------------------------------
multiarch=x86_64-linux-gnu
have_deps=0
if [[ -d $DEPS/root/usr ]]; then
  DEPS=$(cd "$DEPS" && pwd)
  have_deps=1
  export LD_LIBRARY_PATH="$DEPS/root/usr/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$DEPS/root/usr/lib/$multiarch/pkgconfig:$DEPS/root/usr/share/pkgconfig"
  export PKG_CONFIG_LIBDIR=$PKG_CONFIG_PATH
fi
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# ccache where there is one (here); a lent GPU machine has none.
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
fi
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
export ROOT BUILD DEPS PY OUTDIR JOBS TARGETS mode have_deps multiarch

# ---- steps --------------------------------------------------------------------
# record NAME STATUS RC SECONDS NOTE
record() {
  local note=${5//$'\t'/ }
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${note//$'\n'/ }" >>"$STEPS"
}
summarize() {
  "$SUMPY" "$ROOT/bench/gpu_common.py" summarize "$OUTDIR" --mode "$mode" \
    --elapsed "$(($(date +%s) - START))" --budget "$BUDGET" >"$OUTDIR/summarize.log" 2>&1 ||
    say "summary failed: $(tail -n 3 "$OUTDIR/summarize.log")"
}
# run_step NAME CAP RESERVE SKIP_RC FUNCTION: FUNCTION (exported) under
# timeout min(CAP·SCALE, time left − RESERVE·SCALE), output in NAME.log.
# rc 0: pass; SKIP_RC (if not empty): skip; 124/137: timeout; else fail.
run_step() {
  local name=$1 cap=$(($2 * SCALE)) reserve=$(($3 * SCALE)) skip_rc=$4 fn=$5
  if [[ $SKIP == *",$name,"* ]]; then record "$name" skip "" 0 "GPU_CHECK_SKIP"; return 0; fi
  local left=$((START + BUDGET - $(date +%s) - reserve))
  local t=$((cap < left ? cap : left))
  if ((t < 5)); then
    record "$name" skip "" 0 "no time left (budget ${BUDGET}s)"
    say "$name: skipped, no time left"
    return 0
  fi
  say "$name: start (timeout ${t}s)"
  local s rc status note=""
  s=$(date +%s)
  # In the background and waited for: a signal to this script is handled
  # at once (bash runs a trap only between commands, and `wait` is one).
  timeout -k 10 "$t" bash -c "$fn" >"$OUTDIR/$name.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$OUTDIR/.pid.$name"
  wait "$pid"
  rc=$?
  rm -f "$OUTDIR/.pid.$name"
  local d=$(($(date +%s) - s))
  if ((rc == 0)); then status=pass
  elif [[ -n $skip_rc && $rc == "$skip_rc" ]]; then status=skip
  elif ((rc == 124 || rc == 137)); then status=timeout; note="killed after ${t}s"
  else status=fail; fi
  [[ -f $OUTDIR/$name.note ]] && note="$note $(cat "$OUTDIR/$name.note")" && rm -f "$OUTDIR/$name.note"
  [[ $status == fail || $status == timeout ]] && note="$note | $(grep -v '^\s*$' "$OUTDIR/$name.log" | tail -n 3 | cut -c1-300 | tr '\n' ' ')"
  record "$name" "$status" "$rc" "$d" "$note"
  say "$name: $status (rc $rc, ${d}s)"
  summarize
  return 0
}

finalized=0
finalize() {
  ((finalized)) && return
  finalized=1
  summarize
  if [[ $GPU_CHECK_PACK == 1 ]]; then
    # At most 8 files come back from the device run: summary.json,
    # summary.md and one archive of everything else.
    (cd "$OUTDIR" && find . -mindepth 1 -maxdepth 1 ! -name summary.json ! -name summary.md \
       ! -name details.tar.gz -printf '%P\n' | tar czf details.tar.gz -T - &&
     find . -mindepth 1 -maxdepth 1 ! -name summary.json ! -name summary.md \
       ! -name details.tar.gz -exec rm -rf {} +)
  fi
  say "done in $(($(date +%s) - START))s: $OUTDIR/summary.md"
}
on_signal() {
  # The steps under way get the signal too (timeout passes it on).
  local f
  for f in "$OUTDIR"/.pid.*; do
    [[ -f $f ]] && kill -TERM "$(cat "$f")" 2>/dev/null
  done
  local during
  during=$(cd "$OUTDIR" && ls -a | sed -n 's/^\.pid\.//p' | tr '\n' ' ')
  record interrupted fail 143 "$(($(date +%s) - START))" "the script got a signal (during: ${during:-none})"
  rm -f "$OUTDIR"/.pid.*
  finalize
  exit 143
}
trap on_signal TERM INT
trap finalize EXIT

# a. The environment.
step_env() {
  set -x
  date -u
  uname -a
  nproc
  free -g || true
  command -v nvidia-smi && nvidia-smi && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
  command -v nvcc && nvcc --version
  command -v cmake ninja c++
  cmake --version | head -n 1
  ninja --version
  c++ --version | head -n 1
  command -v ccache || echo "no ccache"
  command -v pkg-config || echo "no system pkg-config"
  ls "$DEPS" 2>/dev/null && cat "$DEPS/MANIFEST"
  "$PY" - "$OUTDIR/env.json" <<'EOF'
import json, os, shutil, subprocess, sys, sysconfig
import torch
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"({type(e).__name__})"
inc = sysconfig.get_paths()["include"]
e = {
    "python": sys.executable, "python_version": sys.version.split()[0],
    "python_include": inc, "python_h": os.path.exists(os.path.join(inc, "Python.h")),
    "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    "cuda_available": torch.cuda.is_available(), "cpu_count": os.cpu_count(),
    "nvcc": run("nvcc", "--version").splitlines()[-1:] if shutil.which("nvcc") else None,
    "cmake": run("cmake", "--version").splitlines()[:1],
    "cxx": run("c++", "--version").splitlines()[:1],
    "ccache": shutil.which("ccache"),
}
try:
    import pybind11
    e["python_pybind11"] = pybind11.__version__
except ImportError:
    e["python_pybind11"] = None
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    e.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1),
             capability="%d%d" % torch.cuda.get_device_capability(0),
             multiprocessors=p.multi_processor_count)
    e["nvidia_smi"] = run("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
json.dump(e, open(sys.argv[1], "w"), indent=1)
print(json.dumps(e, indent=1))
EOF
}

# b. Configure and build.
step_configure() {
  local args=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
    "-DMUON_CUDA=${GPU_CHECK_MUON_CUDA:-ON}" "-DPython3_EXECUTABLE=$PY"
    -DMUON_BUILD_TESTS=ON -DMUON_BUILD_EXAMPLES=ON -DMUON_BUILD_BENCHMARKS=OFF
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
  # The kernels for this GPU alone (quicker to compile); else the default.
  local cap
  cap=$("$PY" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None' 2>/dev/null)
  [[ -n $cap && $cap != None ]] && args+=("-DMUON_CUDA_ARCHITECTURES=$cap")
  if ((have_deps)); then
    local u=$DEPS/root/usr
    args+=("-DCMAKE_PREFIX_PATH=$u" "-DCLI11_DIR=$u/share/cmake/CLI11"
      "-Dnlohmann_json_DIR=$u/share/cmake/nlohmann_json" "-DGTest_DIR=$u/lib/$multiarch/cmake/GTest"
      "-DMUON_XXHASH_INCLUDE_DIR=$u/include" "-DPKG_CONFIG_EXECUTABLE=$u/bin/pkg-config"
      # Gloo's headers (LibTorch's ProcessGroupGloo.hpp) for every target,
      # searched before the system's.
      "-DCMAKE_CXX_FLAGS=-isystem $u/include")
    [[ -f $DEPS/pybind11/pybind11/share/cmake/pybind11/pybind11Config.cmake ]] &&
      args+=("-Dpybind11_DIR=$DEPS/pybind11/pybind11/share/cmake/pybind11")
  else
    echo "gpu-check: no $DEPS/root: the system's packages" | tee -a "$OUTDIR/configure.note"
  fi
  # The Python package needs Python.h of that Python.
  local inc
  inc=${GPU_CHECK_PYTHON_INCLUDE:-$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')}
  if [[ ! -f $inc/Python.h && -z ${GPU_CHECK_PYTHON_INCLUDE:-} ]]; then
    local v b
    v=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    b=$("$PY" -c 'import sys; print(sys.base_prefix)')
    for d in "$b/include/python$v" "/usr/include/python$v" "/usr/local/include/python$v"; do
      [[ -f $d/Python.h ]] && { inc=$d; break; }
    done
  fi
  if [[ -f $inc/Python.h ]]; then
    args+=(-DMUON_BUILD_PYTHON=ON "-DPython3_INCLUDE_DIR=$inc" "-DPython_INCLUDE_DIR=$inc")
  else
    args+=(-DMUON_BUILD_PYTHON=OFF)
    echo "no Python.h for $PY ($inc): the Python package is not built" | tee -a "$OUTDIR/configure.note"
  fi
  # shellcheck disable=SC2206
  args+=(${GPU_CHECK_CMAKE_ARGS:-})
  printf '%q ' cmake "${args[@]}"; echo
  cmake "${args[@]}" || return $?
  grep -E '^(CLI11_DIR|nlohmann_json_DIR|GTest_DIR|pybind11_DIR|MUON_XXHASH_INCLUDE_DIR|pkgcfg_lib_RE2_re2|RE2_[A-Z_]*LIBRARY|RE2_INCLUDE[A-Z_]*|MUON_HAVE_CUDA|MUON_CUBLAS_LIBRARY|MUON_CUDART_LIBRARY|MUON_CUDA_ARCHITECTURES|MUON_BUILD_PYTHON|CMAKE_CUDA_COMPILER|PKG_CONFIG_EXECUTABLE)[:=]' \
    "$BUILD/CMakeCache.txt" | tee "$OUTDIR/cmake-cache.txt"
}

artifact_of() {
  case $1 in
    muon) echo "$BUILD/libmuon.so" ;;
    test_cuda) echo "$BUILD/tests/test_cuda" ;;
    test_train_gpt) echo "$BUILD/tests/test_train_gpt" ;;
    muon_cpp_C) ls "$BUILD"/python/muon_cpp/_C*.so 2>/dev/null | head -n 1 ;;
    muon-train-gpt) echo "$BUILD/examples/train_gpt/muon-train-gpt" ;;
    *) echo "" ;;
  esac
}
export -f artifact_of

step_build() {
  local present=() t
  ninja -C "$BUILD" -t targets all >"$OUTDIR/targets.txt" 2>/dev/null
  for t in $TARGETS; do
    if grep -q "^$t: " "$OUTDIR/targets.txt"; then present+=("$t"); else echo "$t" >>"$OUTDIR/missing-targets.txt"; fi
  done
  ((${#present[@]})) || { echo "no target to build"; return 1; }
  echo "ninja -C $BUILD -k 0 -j $JOBS ${present[*]}"
  ninja -C "$BUILD" -k 0 -j "$JOBS" "${present[@]}"
}

# c. Tests.
step_test_cuda() {
  local exe=$BUILD/tests/test_cuda
  [[ -x $exe ]] || { echo "no $exe"; return 1; }
  "$exe" --gtest_output="json:$OUTDIR/test_cuda.json" --gtest_color=no
}
step_train_test() {
  local exe=$BUILD/tests/test_train_gpt
  [[ -x $exe ]] || { echo "no $exe"; return 1; }
  "$exe" --gtest_filter='*Device*' --gtest_output="json:$OUTDIR/train_test.json" --gtest_color=no
}
step_pytest_cuda() {
  [[ -n $(artifact_of muon_cpp_C) ]] || { echo "no muon_cpp extension in $BUILD/python"; return 1; }
  # -v: each test's result in the log as it ends (the XML is written at the
  # end only); a test that hangs fails alone where pytest-timeout is there.
  local more=()
  "$PY" -c 'import pytest_timeout' 2>/dev/null && more+=(--timeout=60)
  cd "$ROOT/tests/python" &&
    PYTHONPATH="$BUILD/python" MUON_BUILD_DIR="$BUILD" "$PY" -m pytest -v -p no:cacheprovider -rs \
      --junitxml="$OUTDIR/pytest_cuda.xml" "${more[@]}" test_cuda.py
}

# d. Benchmarks.
bench_device() { [[ $mode == gpu ]] && echo "--device cuda" || echo "--device cpu --quick"; }
step_ns_bench() {
  # shellcheck disable=SC2046
  PYTHONPATH="$BUILD/python" "$PY" "$ROOT/bench/gpu_newton_schulz.py" $(bench_device) \
    --json "$OUTDIR/ns_bench.json" --markdown "$OUTDIR/ns_bench.md" ${GPU_CHECK_NS_ARGS:-}
}
step_step_bench() {
  # shellcheck disable=SC2046
  PYTHONPATH="$BUILD/python" "$PY" "$ROOT/bench/gpu_muon_step.py" $(bench_device) \
    --json "$OUTDIR/step_bench.json" --markdown "$OUTDIR/step_bench.md" ${GPU_CHECK_STEP_ARGS:-}
}
export -f bench_device

# e. The main job: Muon (the hybrid: AdamW for embeddings, head, gains)
# against AdamW, one rank on the GPU.
step_train() {
  local exe=$BUILD/examples/train_gpt/muon-train-gpt args
  [[ -x $exe ]] || { echo "no $exe"; return 1; }
  if [[ $mode == gpu ]]; then
    args=${GPU_CHECK_TRAIN_ARGS:---layers 6 --width 384 --heads 6 --context 128 --batch 64 --steps 500 --eval-every 50}
    set -- --device cuda
  else
    args=${GPU_CHECK_TRAIN_ARGS:---layers 2 --width 64 --heads 2 --context 32 --batch 8 --steps 20 --eval-every 10 --eval-windows 16 --chars 200000}
    set -- --device cpu --threads 2
  fi
  # shellcheck disable=SC2086
  set -x
  "$exe" "$@" --nproc 1 --runs muon,adamw $args --no-plot \
    --out "$OUTDIR/train_gpt" --summary "$OUTDIR/train_summary.json"
}
export -f step_env step_configure step_build step_test_cuda step_train_test step_pytest_cuda step_ns_bench \
  step_step_bench step_train

#         name         cap  reserve skip_rc function   (seconds, ×SCALE without a GPU)
run_step env           45   400     ""      step_env
run_step configure     150  320     ""      step_configure
if [[ -f $BUILD/build.ninja ]]; then
  run_step build       330  230     ""      step_build
  # One row per target: missing (not defined by this checkout's CMake),
  # built, or failed (a file it is made from failed to compile or link:
  # ninja's FAILED lines against `ninja -t inputs TARGET`).
  if [[ $SKIP != *",build,"* ]]; then
    build_rc=$(awk -F'\t' '$1 == "build" {print $3}' "$STEPS" | tail -n 1)
    grep -E '^FAILED: ' "$OUTDIR/build.log" 2>/dev/null | sed -E 's/^FAILED: (\[code=[0-9]+\] )?//' |
      tr ' ' '\n' | grep -v '^$' | sort -u >"$OUTDIR/failed-outputs.txt"
    for t in $TARGETS; do
      a=$(artifact_of "$t")
      if ! grep -q "^$t: " "$OUTDIR/targets.txt" 2>/dev/null; then
        record "target:$t" fail "" 0 "not a target of this configuration (see the configure row)"
      elif bad=$(ninja -C "$BUILD" -t inputs "$t" 2>/dev/null | grep -xF -f "$OUTDIR/failed-outputs.txt" | head -n 3) &&
           [[ -n $bad ]] || grep -qxF "$t" "$OUTDIR/failed-outputs.txt"; then
        record "target:$t" fail 1 0 "failed: $(echo $bad) (see build.log)"
      elif [[ $build_rc == 0 && -n $a && -e $a ]]; then
        record "target:$t" pass 0 0 "$a"
      elif [[ -n $a && -e $a && $build_rc == 1 ]]; then
        record "target:$t" pass 0 0 "$a (built; other targets failed)"
      else
        record "target:$t" fail "${build_rc:-}" 0 "not built (build rc ${build_rc:-none}; see build.log)"
      fi
    done
    summarize
  fi
else
  record build fail "" 0 "no $BUILD/build.ninja (configure failed)"
fi
# The two test programs at once (correctness, not timings).
run_step test_cuda     100  150     ""      step_test_cuda &
run_step pytest_cuda   100  150     5       step_pytest_cuda &
wait
run_step train_test    90   130     ""      step_train_test
run_step ns_bench      80   100     ""      step_ns_bench
run_step step_bench    60   75      ""      step_step_bench
run_step train         120  0       ""      step_train
exit 0
