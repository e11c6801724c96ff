#!/usr/bin/env bash
# The Python user's install path, as a user runs it: from a copy of the
# source tree, `pip install --no-build-isolation .` into a virtual
# environment that sees the system's site packages (torch, setuptools), or,
# when PYTHON is itself a virtual environment's (torch from the package
# index), into a new one with that torch installed from the index, then
#   - `import muon_cpp` from elsewhere gives the package's version, and the
#     optimizer steps;
#   - `python -m muon_cpp.doctor` says OK;
#   - the extension's only run path is $ORIGIN (libmuon ships beside it);
#   - `pip uninstall` leaves nothing of it behind;
# then the same with `pip install -e .` (the package imported from the copy);
# and a build without cmake, or without a C++ compiler, or with one that
# does not compile (CXX=/bin/true), stops in one line naming what is missing.
#
#   tests/pip_install_test.sh SOURCE_DIR WORK_DIR PYTHON
set -euo pipefail
src=$(realpath "$1")
work=$2
python=${3:-/usr/bin/python3}
fail() { echo "pip_install_test: FAIL: $*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work/copy"
work=$(realpath "$work")
copy=$work/copy
# The tracked and new (not ignored) files, as a fresh clone has them.
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 cp --parents -t "$copy")
else
  tar -C "$src" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$copy" -xf -
fi
# ccache keys relative to the copy, so every run of this test after the
# first reuses the compiler's work wherever the tree is.
export CCACHE_BASEDIR=$copy CCACHE_NOHASHDIR=true
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

if "$python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  # PYTHON is a virtual environment's (torch from the package index): the
  # README's path, a new venv and the same torch from the index (pip's cache
  # serves it after the first time), then the package.
  torch_version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
  "$("$python" -c 'import sys; print(sys._base_executable)')" -m venv "$work/venv"
  "$work/venv/bin/pip" install "torch==$torch_version" setuptools wheel >"$work/torch.txt" 2>&1 ||
    { tail -n 20 "$work/torch.txt"; fail "pip install torch==$torch_version"; }
else
  # Debian's Python: a venv over the system's packages (python3-torch).
  "$python" -m venv --system-site-packages "$work/venv"
fi
# The package itself never reaches the index.
export PIP_NO_INDEX=1
py=$work/venv/bin/python
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$copy/python/muon_cpp/__init__.py")
[[ -n $version ]] || fail "no __version__ in python/muon_cpp/__init__.py"

check_import() {  # where the package must be imported from
  (cd "$work" && "$py" - "$version" "$1" <<'PY'
import os, sys, torch
import muon_cpp
version, where = sys.argv[1], os.path.realpath(sys.argv[2])
assert muon_cpp.__version__ == version, (muon_cpp.__version__, version)
assert muon_cpp.build_info()["version"] == version, muon_cpp.build_info()
path = os.path.realpath(muon_cpp.__file__)
assert path.startswith(where + os.sep), (path, where)
w = torch.nn.Parameter(torch.randn(8, 4))
w.grad = torch.randn(8, 4)
before = w.detach().clone()
opt = muon_cpp.Muon([w], lr=0.02)
opt.step()
assert not torch.equal(before, w.detach()), "the step changed nothing"
print("pip_install_test: imported", muon_cpp.__version__, "from", path)
PY
  ) || fail "import from $1"
  (cd "$work" && "$py" -m muon_cpp.doctor) >"$work/doctor.txt" || { cat "$work/doctor.txt"; fail "doctor"; }
  tail -n 1 "$work/doctor.txt" | grep -q '^muon_cpp doctor: OK' || { cat "$work/doctor.txt"; fail "doctor verdict"; }
}

check_uninstalled() {
  "$py" -m pip uninstall -y muon-cpp >"$work/uninstall.txt" 2>&1 || { cat "$work/uninstall.txt"; fail "pip uninstall"; }
  left=$(cd "$site" && ls -d muon_cpp* muon-cpp* __editable__*muon* 2>/dev/null || true)
  [[ -z $left ]] || fail "left in $site after uninstall: $left"
  if (cd "$work" && "$py" -c "import muon_cpp" 2>/dev/null); then fail "muon_cpp still imports after uninstall"; fi
}

# 1. pip install .
(cd "$copy" && "$py" -m pip install --no-build-isolation .) >"$work/install.txt" 2>&1 ||
  { tail -n 40 "$work/install.txt"; fail "pip install --no-build-isolation ."; }
check_import "$site/muon_cpp"
ext=$(ls "$site"/muon_cpp/_C*.so)
[[ -f $site/muon_cpp/libmuon.so.$(echo "$version" | cut -d. -f1) ]] || fail "libmuon is not shipped beside _C"
runpath=$(readelf -d "$ext" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p; s/.*(RPATH).*\[\(.*\)\]/\1/p')
[[ $runpath == '$ORIGIN' ]] || fail "_C's run path is '$runpath', not \$ORIGIN"
check_uninstalled

# 2. pip install -e . (reuses the CMake build directory: no rebuild)
(cd "$copy" && "$py" -m pip install --no-build-isolation -e .) >"$work/install-e.txt" 2>&1 ||
  { tail -n 40 "$work/install-e.txt"; fail "pip install -e ."; }
check_import "$copy/python/muon_cpp"
check_uninstalled

# 3. Missing tools: one line naming what is missing, before any build.
expect_one_line() {  # what, expected text, then the command
  local what=$1 text=$2
  shift 2
  if (cd "$copy" && "$@") >"$work/missing.txt" 2>&1; then fail "install without $what succeeded"; fi
  n=$(grep -c '^ *muon_cpp: error:' "$work/missing.txt" || true)
  [[ $n -eq 1 ]] || { cat "$work/missing.txt"; fail "without $what: $n 'muon_cpp: error:' lines, not 1"; }
  grep '^ *muon_cpp: error:' "$work/missing.txt" | grep -q "$text" ||
    { cat "$work/missing.txt"; fail "without $what: the error does not say '$text'"; }
  [[ $(grep '^ *muon_cpp: error:' "$work/missing.txt" | wc -c) -lt 400 ]] || fail "without $what: the error is too long"
}
expect_one_line cmake "cmake not found" env PATH="$work/venv/bin" "$py" -m pip install --no-build-isolation .
expect_one_line "a C++ compiler" "no C++ compiler" env CXX=/nonexistent/c++ "$py" -m pip install --no-build-isolation .
expect_one_line "a working C++ compiler" "compiler '/bin/true' (CXX) does not compile" env CXX=/bin/true "$py" -m pip install --no-build-isolation .
echo "pip_install_test: ok"
