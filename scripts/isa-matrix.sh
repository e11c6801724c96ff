#!/usr/bin/env bash
# Runs the numerical test suites (C++ and Python) of a built tree again with
# the CPU's optional instruction sets masked off, one level at a time:
#
#   AVX512_CORE  AVX-512 without bf16/VNNI instructions: oneDNN's bf16 matmul
#                emulates bf16 there (run where the CPU has more than that)
#   AVX2         no AVX-512: oneDNN has no bf16 matmul, OpenBLAS and
#                LibTorch's vector kernels run their AVX2 code
#
# Each level sets the variables the libraries read themselves:
# ONEDNN_MAX_CPU_ISA (oneDNN, so the library's products and LibTorch's own),
# ATEN_CPU_CAPABILITY (LibTorch's vectorized kernels) and, at AVX2,
# OPENBLAS_CORETYPE=Haswell (OpenBLAS's AVX2 kernels). A level the CPU lacks
# is skipped and said so; the natively run suite is scripts/test.sh's.
#
#   scripts/isa-matrix.sh [BUILD_DIR]          # default: build
set -euo pipefail
BUILD_DIR=$(realpath "${1:-build}")
cd "$(dirname "$0")/.."

# The numerical suites: every test that compares numbers with a reference,
# or bits across batching and threads. ctest labels (test program names).
numerical=(test_newton_schulz test_ns_bf16 test_ns_parity test_symmetric_kernels
  test_megabatch test_muon_values test_muon_optimizer test_threads test_muon_save_load
  test_adaptive_muon test_lion test_scaling test_dist_newton_schulz
  test_laprop test_signum test_sim_ademamix test_soap test_spectral test_muon_spectral
  test_orthogonalized_family test_dist_orthogonalized_family test_dion2 test_qk_clip
  test_dist_qk_clip test_muon_cautious test_dist_cautious test_muon_heads test_dist_heads
  test_dion test_iso test_oblique test_moso test_kl_soap
  python_test_newton_schulz python_test_optimizers python_test_laprop python_test_signum
  python_test_sim_ademamix python_test_soap python_test_orthogonalized_family
  python_test_muon_spectral python_test_dion2 python_test_qk_clip python_test_muon_cautious
  python_test_muon_heads python_test_compat python_test_torch_optim_muon
  python_test_reduced_precision_factors python_test_dion python_test_iso python_test_oblique
  python_test_moso python_test_kl_soap)
regex="^($(IFS='|'; echo "${numerical[*]}"))\$"

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
avx512=0
if has avx512f && has avx512bw && has avx512vl && has avx512dq; then avx512=1; fi
above_avx512_core=0
if ((avx512)) && (has avx512_bf16 || has avx512_vnni || has amx_bf16); then above_avx512_core=1; fi

run_level() {  # name, then VAR=value pairs
  local level=$1
  shift
  local start
  start=$(date +%s)
  echo "isa-matrix: $level ($*)"
  env "$@" ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900 --no-tests=error -L "$regex"
  echo "isa-matrix: $level passed in $(( $(date +%s) - start )) s"
}

if ((above_avx512_core)); then
  run_level AVX512_CORE ONEDNN_MAX_CPU_ISA=AVX512_CORE ATEN_CPU_CAPABILITY=avx512
else
  echo "isa-matrix: AVX512_CORE skipped (the CPU's own level is AVX512_CORE or below)"
fi
if ((avx512)); then
  run_level AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell
else
  echo "isa-matrix: AVX2 skipped (the CPU has no AVX-512: the native run was the AVX2 run)"
fi
