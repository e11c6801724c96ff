#!/usr/bin/env bash
# Installs every Debian package the build, tests, benchmarks and demo need.
# Idempotent: a second run only checks (no apt call when all are present).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev            # LibTorch 1.13 (C++ API, c10d, serialization)
  libgloo-dev             # Gloo collectives for c10d on CPU
  libopenblas-dev         # fast BLAS + CBLAS (SYRK)
  libdnnl-dev             # oneDNN headers: bf16->fp32 and blocked products
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  libre2-dev              # linear-time regexes for override rules
  libxxhash-dev           # checkpoint chunk checksums (XXH3-64)
  python3-torch           # the Python package's torch, plain PyTorch baselines, torchrun
  python3-dev pybind11-dev  # the Python package muon_cpp (python/)
  python3-pytest          # its tests
  python3-pip python3-venv python3-wheel python3-setuptools  # pip install . (tests/pip_install_test.sh)
  python3-numpy
  python3-xxhash          # the Python checkpoint reader's checksums
  python3-matplotlib      # demo plots
  bible-kjv               # the King James Bible: the corpus of muon-train-gpt --preset kjv
  debootstrap             # scripts/test-torch2.sh: the Debian 13 root of the 2.6 suite
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The system BLAS must be OpenBLAS: the reference BLAS is ~10x slower and
# every matmul in LibTorch goes through it.
blas=$(readlink -f /etc/alternatives/libblas.so.3-"$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)" 2>/dev/null || true)
if [[ "$blas" != *openblas* ]]; then
  echo "setup: error: the system BLAS is '${blas:-unknown}', not OpenBLAS." >&2
  echo "setup: run: update-alternatives --config libblas.so.3-\$(dpkg-architecture -qDEB_HOST_MULTIARCH)" >&2
  exit 1
fi
echo "setup: ok (BLAS: $blas)"
