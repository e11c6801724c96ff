"""setup.py (what `pip install .` runs) with a C++ compiler that does not
compile: one line naming the compiler, before CMake's configure starts.

Each case runs `setup.py build_ext` with its outputs in a temporary
directory; it stops at the compiler check, in well under a second.
tests/pip_install_test.sh runs the full `pip install` path.
"""
import os
import subprocess
import sys

import pytest

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def build_ext(tmp_path, **env):
    build = tmp_path / "cmake-build"
    full = dict(os.environ, MUON_CMAKE_BUILD_DIR=str(build), PYTHONDONTWRITEBYTECODE="1")
    full.pop("CMAKE_ARGS", None)
    full.update(env)
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "temp")],
        cwd=SOURCE, env=full, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, result.stdout + result.stderr
    errors = [line for line in (result.stdout + result.stderr).splitlines()
              if line.startswith("muon_cpp: error:")]
    assert len(errors) == 1, result.stdout + result.stderr
    assert len(errors[0]) < 400, errors[0]
    assert not build.exists(), "CMake's configure ran"
    return errors[0]


def text_file(tmp_path, executable):
    path = tmp_path / "not-a-compiler.txt"
    path.write_text("this is a text file, not a compiler\n")
    path.chmod(0o755 if executable else 0o644)
    return str(path)


@pytest.mark.parametrize("how", ["CXX", "CMAKE_ARGS"])
def test_a_compiler_that_writes_nothing_is_named(tmp_path, how):
    env = {"CXX": "/bin/true"} if how == "CXX" else {
        "CMAKE_ARGS": "-DCMAKE_CXX_COMPILER=/bin/true", "CXX": "c++"}
    line = build_ext(tmp_path, **env)
    assert "'/bin/true'" in line and "does not compile" in line, line
    assert ("(CXX)" if how == "CXX" else "(CMAKE_CXX_COMPILER)") in line, line


@pytest.mark.parametrize("executable", [True, False])
def test_a_text_file_as_the_compiler_is_named(tmp_path, executable):
    path = text_file(tmp_path, executable)
    line = build_ext(tmp_path, CXX=path)
    assert f"'{path}' (CXX)" in line, line
    assert ("does not" if executable else "is not executable") in line, line


def test_a_missing_compiler_is_named(tmp_path):
    line = build_ext(tmp_path, CXX="/nonexistent/c++")
    assert "no C++ compiler '/nonexistent/c++' (CXX) on PATH" in line, line
