"""Builds the Python package muon_cpp with the project's CMake build.

pip runs this through setuptools (pyproject.toml): `pip install
--no-build-isolation .` or `pip install -e .`. The extension muon_cpp._C and
the library it links (libmuon) are built by CMake against the torch of the
Python running pip (its `torch.utils.cmake_prefix_path`, then the system's
LibTorch, e.g. Debian's libtorch-dev) and shipped side by side in the
package, which finds the library through an $ORIGIN run path.

Environment:
  CMAKE_ARGS              extra arguments for the CMake configure step
  MUON_CMAKE_BUILD_DIR    the CMake build directory (default: build-pip in
                          the source tree, reused by later installs)
  MUON_BUILD_JOBS         parallel build jobs (default: the CPU count)

Anything missing (cmake, a C++ compiler, torch, LibTorch's headers) stops the
build with one line that names it and how to get it.
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(message):
    # One line, without a traceback (pip shows what the build printed).
    print(f"muon_cpp: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def torch_info():
    """The running interpreter's torch: version and its CMake prefix."""
    try:
        import torch
        import torch.utils
    except Exception as e:  # noqa: BLE001 - any import failure means no usable torch
        fail(f"torch cannot be imported by {sys.executable} ({type(e).__name__}: "
             f"{str(e)[:120]}); install it first (Debian: apt-get install python3-torch) "
             "and build with --no-build-isolation so the build sees it")
    return torch.__version__, getattr(torch.utils, "cmake_prefix_path", "")


def find_torch_config(prefix):
    """TorchConfig.cmake of that torch: its own CMake prefix, else the system's."""
    candidates = []
    if prefix:
        candidates.append(os.path.join(prefix, "Torch"))
    candidates += sorted(glob.glob("/usr/lib/*/cmake/Torch")) + ["/usr/share/cmake/Torch",
                                                                  "/usr/local/share/cmake/Torch"]
    for d in candidates:
        if os.path.isfile(os.path.join(d, "TorchConfig.cmake")):
            return d
    return None


def cxx_compiler():
    """The C++ compiler CMake's configure will use, as (where it comes from,
    its command line): -DCMAKE_CXX_COMPILER in CMAKE_ARGS, else CXX, else c++."""
    for arg in shlex.split(os.environ.get("CMAKE_ARGS", "")):
        m = re.match(r"-DCMAKE_CXX_COMPILER(?::[A-Z]+)?=(.*)$", arg)
        if m:
            return "CMAKE_CXX_COMPILER", m.group(1)
    if os.environ.get("CXX", "").strip():
        return "CXX", os.environ["CXX"]
    return "the default", "c++"


def check_compiler():
    """Stops in one line naming the compiler unless it compiles an empty C++
    file to an object file (CMake's configure would only say it failed)."""
    source, cxx = cxx_compiler()
    command = shlex.split(cxx)
    if not command or shutil.which(command[0]) is None:
        what = (f"the C++ compiler '{cxx}' ({source}) is not executable"
                if command and os.path.isfile(command[0]) else
                f"no C++ compiler '{cxx}' ({source}) on PATH")
        fail(f"{what}; install one (Debian: apt-get install g++) or set CXX")
    with tempfile.TemporaryDirectory(prefix="muon_cpp_cxx_") as tmp:
        src, obj = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.o")
        with open(src, "w", encoding="utf-8") as f:
            f.write("int muon_cpp_probe(int x) { return x + 1; }\n")
        try:
            result = subprocess.run(command + ["-c", src, "-o", obj], capture_output=True,
                                    text=True, errors="replace", timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            fail(f"the C++ compiler '{cxx}' ({source}) does not run: {type(e).__name__}: "
                 f"{str(e)[:120]}; install one (Debian: apt-get install g++) or set CXX")
        ok = result.returncode == 0 and os.path.isfile(obj) and os.path.getsize(obj) > 0
        if not ok:
            said = " ".join((result.stderr or result.stdout).split())[:160]
            how = (f"exit {result.returncode}" + (f": {said}" if said else "")
                   if result.returncode != 0 else "it exited 0 without writing the object file")
            fail(f"the C++ compiler '{cxx}' ({source}) does not compile an empty C++ file ({how}); "
                 "install one (Debian: apt-get install g++) or set CXX to a working compiler")


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def run(self):
        cmake = shutil.which("cmake")
        if cmake is None:
            fail("cmake not found on PATH; install it (Debian: apt-get install cmake ninja-build g++)")
        check_compiler()
        version, prefix = torch_info()
        torch_dir = find_torch_config(prefix)
        if torch_dir is None:
            fail(f"LibTorch's C++ headers and CMake files for torch {version} were not found "
                 f"(no TorchConfig.cmake under {prefix or 'torch.utils.cmake_prefix_path'} or "
                 "/usr/lib/*/cmake/Torch); install them (Debian: apt-get install libtorch-dev)")
        for ext in self.extensions:
            self.build_cmake(ext, cmake, torch_dir)

    def build_cmake(self, ext, cmake, torch_dir):
        build_dir = os.environ.get("MUON_CMAKE_BUILD_DIR") or os.path.join(HERE, "build-pip")
        os.makedirs(build_dir, exist_ok=True)
        configure = [
            cmake, "-S", HERE, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DTorch_DIR={torch_dir}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DMUON_BUILD_PYTHON=ON", "-DMUON_BUILD_TESTS=OFF",
            "-DMUON_BUILD_BENCHMARKS=OFF", "-DMUON_BUILD_EXAMPLES=OFF",
            # libmuon ships beside _C in the package.
            "-DMUON_PYTHON_RPATH=$ORIGIN",
        ]
        if shutil.which("ninja") and not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        jobs = os.environ.get("MUON_BUILD_JOBS") or str(os.cpu_count() or 1)
        self.run_step("configure", configure)
        self.run_step("build", [cmake, "--build", build_dir, "--target", "muon_cpp_C", "-j", jobs])

        built = glob.glob(os.path.join(build_dir, "python", "muon_cpp", "_C*.so"))
        if len(built) != 1:
            fail(f"the build made {len(built)} extension files in {build_dir}/python/muon_cpp, not one")
        libs = [p for p in glob.glob(os.path.join(build_dir, "libmuon.so.*"))
                if os.path.basename(p).count(".") == 2]  # libmuon.so.<SOVERSION>: what _C needs
        if len(libs) != 1:
            fail(f"libmuon.so.<version> not found (or ambiguous) in {build_dir}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built[0], target)
        # The library _C needs, under the name it asks for (libmuon.so.<SOVERSION>).
        shutil.copyfile(os.path.realpath(libs[0]), os.path.join(os.path.dirname(target),
                                                                os.path.basename(libs[0])))

    def run_step(self, what, command):
        print(f"muon_cpp: {what}: {' '.join(shlex.quote(c) for c in command)}", flush=True)
        result = subprocess.run(command, cwd=HERE)
        if result.returncode != 0:
            fail(f"the CMake {what} step failed (exit {result.returncode}); its output is above")


setup(ext_modules=[CMakeExtension("muon_cpp._C")], cmdclass={"build_ext": CMakeBuild})
