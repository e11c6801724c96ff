#!/usr/bin/env bash
# Creates (once) and checks the virtual environment of the torch 2.11 suite:
# Debian's Python 3 with torch 2.11 and the tools of scripts/requirements-torch2.11.txt
# from the Python package index. Prints the environment's python on its
# last line.
#
#   scripts/venv-torch.sh              # /var/tmp/muon-cpp-venv-torch2.11
#   MUON_TORCH_VENV=/srv/v scripts/venv-torch.sh
#
# Idempotent: the environment is stamped with the requirements it holds
# once every package is in; a later run whose requirements are the same
# only checks that torch imports (no network). Changed requirements make a new environment. The first run
# downloads about 4 GB (torch's CUDA build and its NVIDIA libraries; ~1 min
# on a fast link).
set -euo pipefail
cd "$(dirname "$0")/.."
req=scripts/requirements-torch2.11.txt
VENV=${MUON_TORCH_VENV:-/var/tmp/muon-cpp-venv-torch2.11}
PYTHON=${MUON_VENV_BASE_PYTHON:-/usr/bin/python3}
say() { echo "venv-torch: $*" >&2; }
die() { echo "venv-torch: error: $*" >&2; exit 1; }

[[ -x $PYTHON ]] || die "no Python at $PYTHON (Debian: apt-get install python3 python3-venv)"
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null ||
  die "$PYTHON cannot make virtual environments (Debian: apt-get install python3-venv)"
stamp=$(sha256sum "$req" | cut -c1-16)

if [[ -f $VENV/.muon-requirements && $(cat "$VENV/.muon-requirements") == "$stamp" ]]; then
  version=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null) ||
    die "torch does not import in $VENV; remove it to make it again"
  say "reusing $VENV (torch $version)"
  echo "$VENV/bin/python"
  exit 0
fi

start=$(date +%s)
# Made in place (a venv's scripts name its directory), the stamp written
# last: an environment without it, half made or of other requirements, is
# made again from scratch.
say "creating $VENV from $req"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
log=$VENV/muon-pip-install.log
"$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$req" >"$log" 2>&1 ||
  { tail -20 "$log" >&2; die "pip install -r $req failed (log: $log)"; }
echo "$stamp" >"$VENV/.muon-requirements"
say "created in $(( $(date +%s) - start )) s"
echo "$VENV/bin/python"
