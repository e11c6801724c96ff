#!/usr/bin/env bash
# The test suite against torch 2.11 from the Python package index: the
# library, its tests, the benchmarks, the examples and the Python package
# built against the LibTorch inside that torch (a CUDA 13 build, which runs
# on the CPU), and the whole ctest suite run with that Python: FSDP2 and
# DTensor on their current APIs, torch.optim.Muon as a peer, Hugging Face's
# Trainer, Lightning and torch.compile. The build is the CUDA build
# (-DMUON_CUDA=ON): nvcc 13 and the wheel's CUDA 13 LibTorch.
#
#   scripts/test-torch-pip.sh                  # build dir: ./build-torch2.11
#   scripts/test-torch-pip.sh -R python_       # extra args go to ctest
#
# The Debian packages come from scripts/setup.sh (compilers, oneDNN,
# OpenBLAS, Gloo's headers...), the Python environment from
# scripts/venv-torch.sh (made once, then reused).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
python=$(bash scripts/venv-torch.sh | tail -n 1)
"$python" -c 'import sys, torch; print("test-torch-pip: torch", torch.__version__, "on Python", sys.version.split()[0])'

# The environment's bin/ first: its torchrun, its pip.
export PATH="$(dirname "$python"):$PATH"
export BUILD_DIR=${BUILD_DIR:-build-torch2.11}
# The CUDA build: the kernels of src/kernels/cuda/ compiled with the
# machine's nvcc against this CUDA LibTorch (same CUDA major) and linked;
# their tests (test_cuda, python_test_cuda) skip without a GPU. ON, not
# AUTO: a CUDA build that stops compiling fails the run.
export MUON_CMAKE_ARGS="-DPython3_EXECUTABLE=$python -DMUON_CUDA=${MUON_CUDA:-ON} ${MUON_CMAKE_ARGS:-}"
exec bash scripts/test.sh "$@"
