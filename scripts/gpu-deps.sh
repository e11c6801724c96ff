#!/usr/bin/env bash
# Makes .gpu-deps/ at the repository root: what the build needs and a lent
# GPU machine lacks, unpacked from Debian 12's packages (and pybind11's wheel
# from the Python package index), to travel beside the checkout (the device
# run's `carry`) and be used there by scripts/gpu-check.sh. Run it HERE, on
# a machine with apt and the package index; the GPU machine has no network.
#
#   scripts/gpu-deps.sh           # prints the path to carry on its last line
#
#   .gpu-deps/root/usr/  the packages unpacked (dpkg-deb -x): headers, static
#                        GoogleTest, libre2.so.9, pkgconf, the CMake configs
#   .gpu-deps/pybind11/  the pybind11 wheel unpacked (its CMake dir:
#                        pybind11/share/cmake/pybind11)
#   .gpu-deps/MANIFEST   package versions, for the record
#
# The downloaded .deb files and the wheel are cached outside the checkout
# (GPU_DEPS_CACHE, default /var/tmp/muon-cpp-gpu-deps-cache): a second run
# downloads nothing, and the folder to carry holds only what is used.
# Everything in it is relocatable: the CMake configs compute their prefix
# from their own location, and the pkg-config files are rewritten to
# ${pcfiledir}-relative paths, so the folder works wherever the checkout lies.
# Idempotent: root/ and pybind11/ are unpacked anew from the cached files.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${GPU_DEPS_DIR:-.gpu-deps}
CACHE=${GPU_DEPS_CACHE:-/var/tmp/muon-cpp-gpu-deps-cache}
say() { echo "gpu-deps: $*" >&2; }
die() { echo "gpu-deps: error: $*" >&2; exit 1; }

# The build's Debian packages (see CMakeLists.txt and scripts/setup.sh):
#   libcli11-dev nlohmann-json3-dev     header-only, CMake configs
#   libre2-dev libre2-9                 RE2 (headers, libre2.so.9, re2.pc): its only
#                                       runtime needs are libc and libstdc++
#   libxxhash-dev                       xxhash.h (used header-only: XXH_INLINE_ALL)
#   libgtest-dev libgmock-dev           static GoogleTest and its CMake config (GMock's
#                                       targets file sits beside GTest's)
#   libgloo-dev                         Gloo's headers: LibTorch's ProcessGroupGloo.hpp
#                                       includes them and the torch wheel ships none
#   pkgconf-bin libpkgconf3             a pkg-config for find_package(PkgConfig) where
#                                       the machine has none
packages=(libcli11-dev nlohmann-json3-dev libre2-dev libre2-9 libxxhash-dev
          libgtest-dev libgmock-dev libgloo-dev pkgconf-bin libpkgconf3)
PYBIND11_VERSION=${PYBIND11_VERSION:-3.0.1}

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || die "needs apt-get and dpkg-deb (Debian)"
mkdir -p "$CACHE/debs" "$CACHE/wheels"

# apt's lists: apt-get download needs them (a fresh machine has none).
if ! apt-cache show libre2-dev >/dev/null 2>&1; then
  say "apt-get update"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
fi

for p in "${packages[@]}"; do
  version=$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')
  [[ -n $version && $version != "(none)" ]] || die "no candidate version of $p"
  # apt-get download names files NAME_VERSION_ARCH.deb with ':' as %3a.
  if ! compgen -G "$CACHE/debs/${p}_${version//:/%3a}_*.deb" >/dev/null; then
    rm -f "$CACHE/debs/${p}"_*.deb
    say "downloading $p $version"
    (cd "$CACHE/debs" && apt-get download -q -o APT::Sandbox::User="$(id -un)" "$p=$version" >/dev/null) || die "apt-get download $p failed"
  fi
done

# Unpacked anew every run.
rm -rf "$DEST/root" "$DEST/pybind11"
mkdir -p "$DEST/root"
: >"$DEST/MANIFEST"
for p in "${packages[@]}"; do
  deb=$(ls "$CACHE/debs/${p}"_*.deb | head -n 1)
  dpkg-deb -x "$deb" "$DEST/root"
  echo "deb $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" >>"$DEST/MANIFEST"
done
root="$DEST/root"
multiarch=x86_64-linux-gnu
# Not needed: documentation, and links to libraries that do not travel
# (libxxhash0: xxhash is used header-only; static libraries nobody links; libgloo0: only Gloo's headers are
# compiled, its code is inside libtorch). A dangling link could otherwise be
# found by find_library.
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian" \
       "$root/usr/src" "$root/usr/lib/$multiarch/cmake/Gloo" \
       "$root/usr/lib/$multiarch/libxxhash.so" "$root/usr/lib/$multiarch/libgloo.so" \
       "$root/usr/lib/$multiarch/libxxhash.a" "$root/usr/lib/$multiarch/libre2.a" "$root/usr/share/doc-base" \
       "$root/usr/lib/$multiarch/pkgconfig/libxxhash.pc" "$root/usr/lib/$multiarch/pkgconfig/gloo.pc"
# pkg-config files: /usr → ${pcfiledir}-relative (pcfiledir is
# usr/lib/<multiarch>/pkgconfig, three levels under usr).
for pc in "$root/usr/lib/$multiarch/pkgconfig/"*.pc "$root/usr/share/pkgconfig/"*.pc; do
  [[ -f $pc ]] || continue
  case $pc in
    */share/pkgconfig/*) up='${pcfiledir}/../..' ;;
    *) up='${pcfiledir}/../../..' ;;
  esac
  sed -i -E "s#=/usr(/|\$)#=${up}\1#; s#([ =])-I/usr/#\1-I${up}/#g; s#([ =])-L/usr/#\1-L${up}/#g" "$pc"
done
# A pkg-config named as CMake looks for it, running pkgconf with its library
# beside it (the script's own directory, wherever the folder lies).
cat >"$root/usr/bin/pkg-config" <<'EOF'
#!/bin/sh
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/../lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/pkgconf" "$@"
EOF
chmod +x "$root/usr/bin/pkg-config"
# Check that it runs and resolves re2 inside the folder.
re2_cflags=$(PKG_CONFIG_PATH="$root/usr/lib/$multiarch/pkgconfig" PKG_CONFIG_LIBDIR="$root/usr/lib/$multiarch/pkgconfig" \
  "$root/usr/bin/pkg-config" --cflags --libs re2) || die "the unpacked pkg-config cannot resolve re2"
[[ $re2_cflags == *"$root"* || $re2_cflags == *".gpu-deps"* ]] || die "re2.pc still points outside $DEST: $re2_cflags"
[[ -e $root/usr/lib/$multiarch/libre2.so.9 ]] || die "libre2.so.9 missing"

# pybind11 (a py3-none-any wheel: headers and CMake files). The machine's
# Python may have another pybind11 or none; the build uses this one.
if ! compgen -G "$CACHE/wheels/pybind11-${PYBIND11_VERSION}-*.whl" >/dev/null; then
  pip=()
  for py in "${GPU_DEPS_PYTHON:-}" /var/tmp/muon-cpp-venv-torch2.11/bin/python python3; do
    [[ -n $py ]] && "$py" -m pip --version >/dev/null 2>&1 && { pip=("$py" -m pip); break; }
  done
  ((${#pip[@]})) || die "no Python with pip to download pybind11 (set GPU_DEPS_PYTHON)"
  say "downloading pybind11 $PYBIND11_VERSION"
  "${pip[@]}" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$CACHE/wheels" "pybind11==$PYBIND11_VERSION" >&2 || die "pip download pybind11 failed"
fi
wheel=$(ls "$CACHE/wheels/pybind11-${PYBIND11_VERSION}"-*.whl | head -n 1)
mkdir -p "$DEST/pybind11"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$DEST/pybind11"
[[ -f $DEST/pybind11/pybind11/share/cmake/pybind11/pybind11Config.cmake ]] || die "no pybind11Config.cmake in $wheel"
echo "wheel pybind11 $PYBIND11_VERSION" >>"$DEST/MANIFEST"

say "$(wc -l <"$DEST/MANIFEST") packages unpacked; $DEST is $(du -sh "$DEST" | cut -f1) ($(find "$DEST" -type f | wc -l) files)"
say "carry: ${DEST#./} (run scripts/gpu-check.sh there)"
echo "${DEST#./}"
