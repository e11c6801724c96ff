#!/usr/bin/env bash
# The command that passes the tests: installs what is missing, configures,
# builds every target (library, tests, benchmarks, examples) and runs the
# whole test suite. Exits non-zero on any failure.
#
#   scripts/test.sh            # build dir: ./build
#   BUILD_DIR=/tmp/b scripts/test.sh -R NewtonSchulz   # extra args go to ctest
#   scripts/test-torch-pip.sh                          # the same against torch 2.11
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

BUILD_DIR=${BUILD_DIR:-build}
# ccache and precompiled headers work together only with these settings.
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_NOHASHDIR=true
# Paths relative to the tree: every clone of it, wherever it is, shares the
# compiler's work.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}

start=$(date +%s)
# MUON_CMAKE_ARGS: more configure arguments (scripts/test-torch-pip.sh names
# the Python, and so the torch, to build against).
read -r -a extra_cmake_args <<<"${MUON_CMAKE_ARGS:-}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUON_WARNINGS_AS_ERRORS=ON \
  "${extra_cmake_args[@]}"
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "test.sh: build finished in $(( $(date +%s) - start )) s"

# Tests run one at a time: each uses every core through BLAS and OpenMP.
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900 "$@"

# The instruction-set matrix: the numerical suites again at each level
# below this CPU's own, so that one machine proves the paths of weaker ones
# (docs/benchmarks.md, "Instruction sets"). Skipped when ctest arguments
# select tests, or with MUON_ISA_MATRIX=0.
if [[ $# -eq 0 && ${MUON_ISA_MATRIX:-1} != 0 ]]; then
  bash scripts/isa-matrix.sh "$BUILD_DIR"
fi
