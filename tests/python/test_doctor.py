"""python3 -m muon_cpp.doctor and the check that the extension matches torch."""
import json
import os
import subprocess
import sys

import torch

import muon_cpp


def run_doctor(*args, env=None):
    return subprocess.run([sys.executable, "-m", "muon_cpp.doctor", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_doctor_reports_every_section_and_an_ok_verdict():
    result = run_doctor()
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("muon_cpp doctor: OK"), lines[-1]
    text = result.stdout
    for key in ("muon_cpp", "torch", "built_against_torch", "extension_matches_torch", "compiler",
                "cxx11_abi", "blas_loaded", "blas_threads", "intra_op_threads",
                "torch_c10d_backends", "muon_c10d_backends", "cpu_flags"):
        assert any(line.split()[:1] == [key] for line in lines), f"{key} missing:\n{text}"


def test_doctor_json_agrees_with_the_running_torch_and_build():
    result = run_doctor("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["torch"] == torch.__version__
    assert report["intra_op_threads"] == torch.get_num_threads()
    assert report["muon_cpp"] == muon_cpp.__version__
    assert report["built_against_torch"] == muon_cpp.build_info()["torch_version"]
    assert report["extension_matches_torch"] is True
    assert "gloo" in report["muon_c10d_backends"]
    assert report["verdict"].startswith("muon_cpp doctor: OK")


def test_doctor_warns_when_local_ranks_oversubscribe_the_cores():
    env = dict(os.environ, LOCAL_WORLD_SIZE=str(4 * (os.cpu_count() or 1)))
    result = run_doctor("--json", env=env)
    report = json.loads(result.stdout)
    assert any("local rank(s)" in w for w in report["warnings"]), report["warnings"]
    assert "warning:" in report["verdict"]


def test_a_bad_local_world_size_is_one_line_naming_it():
    for value, args in (("abc", ()), ("2.5", ("--json",)), ("0", ()), ("9" * 5000, ("--json",))):
        result = run_doctor(*args, env=dict(os.environ, LOCAL_WORLD_SIZE=value))
        assert result.returncode == 1, (value[:20], result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        line = (json.loads(result.stdout)["verdict"] if args else
                result.stdout.strip().splitlines()[-1])
        assert line.startswith("muon_cpp doctor: PROBLEM: LOCAL_WORLD_SIZE "), line
        assert repr(value)[:20] in line and len(line) < 300, line
        assert max(map(len, result.stdout.splitlines())) < 400
    result = run_doctor(env=dict(os.environ, LOCAL_WORLD_SIZE=" 1 "))
    assert result.returncode == 0, result.stdout + result.stderr


def test_build_info_names_the_torch_it_was_built_against():
    info = muon_cpp.build_info()
    assert info["version"] == muon_cpp.__version__
    assert muon_cpp._torch_release(info["torch_version"]) == muon_cpp._torch_release(torch.__version__)
    assert info["cxx11_abi"] == bool(torch._C._GLIBCXX_USE_CXX11_ABI)


def test_a_mismatched_extension_is_named_with_what_to_do():
    info = dict(muon_cpp.build_info())
    assert muon_cpp._extension_problem(info) is None
    major, minor, _ = muon_cpp._torch_release(torch.__version__)
    info["torch_version"] = f"{major}.{minor + 1}.0"
    problem = muon_cpp._extension_problem(info)
    assert problem is not None and info["torch_version"] in problem and "rebuild" in problem
    info = dict(muon_cpp.build_info(), cxx11_abi=not muon_cpp.build_info()["cxx11_abi"])
    problem = muon_cpp._extension_problem(info)
    assert problem is not None and "_GLIBCXX_USE_CXX11_ABI" in problem


def test_torch_release_parses_local_and_pre_release_versions():
    assert muon_cpp._torch_release("2.6.0+debian") == (2, 6, 0)
    assert muon_cpp._torch_release("1.13.0a0") == (1, 13, 0)
    assert muon_cpp._torch_release("2.1") == (2, 1, 0)
