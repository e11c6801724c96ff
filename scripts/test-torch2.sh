#!/usr/bin/env bash
# The test suite against LibTorch / torch 2.6: Debian 13 ("trixie") ships
# libtorch-dev and python3-torch 2.6.0, Debian 12 (the host) 1.13. This
# script keeps a Debian 13 root, installs the project's packages there with
# scripts/setup.sh (the same list as on the host), builds the library, its
# tests, the benchmarks, the examples and the Python package against 2.6, and
# runs the whole ctest suite (C++ and Python tests) inside it.
#
#   scripts/test-torch2.sh                   # root: /var/tmp/muon-cpp-trixie
#   scripts/test-torch2.sh -R NewtonSchulz   # extra args go to ctest
#   MUON_TORCH2_ROOT=/srv/trixie scripts/test-torch2.sh
#
# Idempotent: the first run creates the root (debootstrap, ~1 min) and
# installs ~300 packages (~400 MB, 1-4 min); later runs reuse both, and the
# build directory and ccache inside the root, so they only rebuild.
#
# Needs root (debootstrap, chroot) and a private mount namespace for /proc,
# /sys and /dev inside the root (unshare --mount). The mounts vanish with the
# namespace when the script ends, however it ends. Without these the script
# says which is missing and exits non-zero: it never skips silently.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

ROOT=${MUON_TORCH2_ROOT:-/var/tmp/muon-cpp-trixie}
SUITE=trixie
say() { echo "test-torch2: $*"; }
die() { echo "test-torch2: error: $*" >&2; exit 1; }

# The Debian archive the host's own apt uses for its release (not its
# security or updates suites), as the machine is set up: from
# /etc/apt/sources.list.d/*.sources (deb822) or the one-line lists.
# MUON_DEBIAN_MIRROR overrides it.
host_mirror() (
  # A subshell without errexit or pipefail: awk and head stop reading early.
  set +eo pipefail
  local codename
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  [[ -n $codename ]] || return 0
  {
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v c="$codename" '
      function flush() { if (deb && uri != "" && (" " suites " ") ~ (" " c " ")) { print uri; exit } }
      /^[ \t]*$/ { flush(); deb = 0; uri = ""; suites = ""; next }
      /^Types:/ { deb = ($0 ~ /[ \t]deb([ \t]|$)/) }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { $1 = ""; suites = $0 }
      END { flush() }'
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v c="$codename" '
      $1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == c) { print $i; exit } }'
  } | head -n 1 | sed 's:/*$::'
)
MIRROR=${MUON_DEBIAN_MIRROR:-$(host_mirror || true)}
[[ -n $MIRROR ]] || die "no Debian archive for the host's release in its apt sources; set MUON_DEBIAN_MIRROR"

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot and mounts); run it with sudo"
for tool in unshare chroot mount; do
  command -v "$tool" >/dev/null || die "'$tool' not found (util-linux / coreutils)"
done
if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap \
    >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y \
    -qq --no-install-recommends debootstrap >/dev/null; } || die "cannot install debootstrap"
fi
# Mounts must work before anything is downloaded.
unshare --mount --propagation private true 2>/dev/null ||
  die "cannot make a private mount namespace (unshare --mount): the root needs /proc, /sys and /dev mounted"

start=$(date +%s)
# 1. The root. Built under a temporary name and renamed when complete, so an
#    interrupted debootstrap is started over, never reused half-made.
if [[ ! -f "$ROOT/.muon-root-complete" ]]; then
  say "creating a Debian 13 root in $ROOT (debootstrap --variant=minbase $SUITE $MIRROR)"
  rm -rf "$ROOT.partial"
  mkdir -p "$(dirname "$ROOT")"
  debootstrap --variant=minbase "$SUITE" "$ROOT.partial" "$MIRROR" >"$ROOT.partial.log" 2>&1 ||
    { tail -20 "$ROOT.partial.log" >&2; die "debootstrap failed (log: $ROOT.partial.log)"; }
  touch "$ROOT.partial/.muon-root-complete"
  rm -rf "$ROOT"
  mv "$ROOT.partial" "$ROOT"
  mv "$ROOT.partial.log" "$ROOT/var/log/muon-debootstrap.log"
  say "root created in $(($(date +%s) - start)) s"
fi
grep -q '^13' "$ROOT/etc/debian_version" 2>/dev/null ||
  die "$ROOT is not a Debian 13 root (etc/debian_version: $(cat "$ROOT/etc/debian_version" 2>/dev/null || echo missing)); remove it or set MUON_TORCH2_ROOT"

# Name resolution inside the root: the host's files (torchrun --standalone
# resolves the host name; apt resolves the mirror).
cp /etc/hosts "$ROOT/etc/hosts"
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
mkdir -p "$ROOT/src/muon-cpp"

# Everything below runs in a private mount namespace: the source tree is
# bound at /src/muon-cpp, the build directory stays inside the root.
BUILD_DIR=/var/build/muon-cpp
export MUON_CTEST_ARGS="${*@Q}"
exec unshare --mount --propagation private /bin/bash -euo pipefail -c '
  root=$1 repo=$2 build=$3
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount --bind "$repo" "$root/src/muon-cpp"
  exec chroot "$root" /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 TERM=dumb OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-}" CI="${CI:-}" \
    MUON_CTEST_ARGS="$MUON_CTEST_ARGS" BUILD_DIR="$build" \
    /bin/bash -euo pipefail -c "
      cd /src/muon-cpp
      [[ -n \$OPENBLAS_CORETYPE ]] || unset OPENBLAS_CORETYPE
      bash scripts/setup.sh
      python3 -c \"import torch; print(\\\"test-torch2: torch\\\", torch.__version__, \\\"on Python\\\", __import__(\\\"sys\\\").version.split()[0])\"
      eval set -- \$MUON_CTEST_ARGS
      exec bash scripts/test.sh \"\$@\"
    "
' bash "$ROOT" "$repo" "$BUILD_DIR"
