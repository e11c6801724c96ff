"""``python3 -m muon_cpp.doctor``: what a bug report needs, and a verdict.

Prints the versions (muon_cpp, Python, torch, the LibTorch the extension was
built against, compiler, C++11 ABI), the CPU and its instruction sets, the
BLAS library loaded and its threads, torch's intra-op and inter-op threads,
the c10d backends available to torch and to muon_cpp, and whether the
extension matches the running torch; the last line is a one-line verdict::

    muon_cpp doctor: OK (...)
    muon_cpp doctor: PROBLEM: <what is wrong and what to do>

Exit status 0 when OK, 1 otherwise. ``--json`` prints one JSON object instead.
"""
import ctypes
import json
import os
import platform
import sys


def _cpu():
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("unknown", "", platform.machine()):
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "amx_bf16", "amx_tile"]
    return model, [f for f in wanted if f in flags]


def _loaded_blas():
    """Paths of the BLAS libraries mapped into this process."""
    found = []
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                name = os.path.basename(path)
                if any(k in name for k in ("openblas", "libblas", "mkl_rt", "libmkl", "blis")):
                    if path not in found:
                        found.append(path)
    except OSError:
        pass
    return found


def _blas_threads(paths):
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in ("openblas_get_num_threads", "MKL_Get_Max_Threads", "bli_thread_get_num_threads"):
            fn = getattr(lib, symbol, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return int(fn())
    return None


def _local_world_size(value, problems):
    """LOCAL_WORLD_SIZE (the ranks on this machine; 1 when unset or empty), or
    1 with a line in `problems` naming it and its value when it is not a
    positive integer (muon_cpp's process groups refuse it too)."""
    if value is None or not value.strip():
        return 1
    text = value.strip()
    if text.isascii() and text.isdigit() and len(text) <= 10 and 1 <= int(text) <= 2**31 - 1:
        return int(text)
    problems.append(f"LOCAL_WORLD_SIZE should be an integer in [1, 2147483647] (the ranks on "
                    f"this machine) but is {_short(value)}")
    return 1


def _short(value, limit=40):
    """repr(value), at most `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def collect():
    """Everything the doctor reports, as a dict (``problems`` lists what is wrong)."""
    report = {"python": sys.version.split()[0], "python_executable": sys.executable,
              "platform": platform.platform(), "problems": [], "warnings": []}
    report["cpu"], report["cpu_flags"] = _cpu()
    report["cpu_count"] = os.cpu_count()
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        report["problems"].append(f"torch cannot be imported ({type(e).__name__}: {str(e)[:160]})")
        return report
    report["torch"] = torch.__version__
    report["torch_path"] = os.path.dirname(torch.__file__)
    report["torch_cxx11_abi"] = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False))
    report["intra_op_threads"] = torch.get_num_threads()
    report["inter_op_threads"] = torch.get_num_interop_threads()
    cpu_backend = getattr(torch.backends, "cpu", None)
    if cpu_backend is not None and hasattr(cpu_backend, "get_cpu_capability"):
        report["aten_cpu_capability"] = cpu_backend.get_cpu_capability()
    report["cuda_available"] = bool(torch.cuda.is_available())
    dist = torch.distributed
    report["torch_c10d"] = dist.is_available()
    report["torch_c10d_backends"] = [name for name, ok in (
        ("gloo", dist.is_available() and dist.is_gloo_available()),
        ("nccl", dist.is_available() and dist.is_nccl_available()),
        ("mpi", dist.is_available() and dist.is_mpi_available())) if ok]
    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                      "OPENBLAS_CORETYPE", "ONEDNN_MAX_CPU_ISA",
                                      "ATEN_CPU_CAPABILITY", "LOCAL_WORLD_SIZE") if k in os.environ}
    report["environment"] = {k: v if len(v) <= 80 else v[:77] + "..." for k, v in env.items()}

    import muon_cpp
    report["muon_cpp"] = muon_cpp.__version__
    report["muon_cpp_path"] = os.path.dirname(muon_cpp.__file__)
    if muon_cpp._C is None:
        report["problems"].append(muon_cpp._problem)
    else:
        info = muon_cpp._C.build_info()
        report["built_against_torch"] = info["torch_version"]
        report["compiler"] = info["compiler"]
        report["cxx11_abi"] = info["cxx11_abi"]
        report["pybind11"] = info["pybind11"]
        report["built_for_python"] = info["python"]
        report["cblas_library"] = info["cblas_library"] or "none (blocked fallback kernels)"
        report["dnnl_library"] = info["dnnl_library"] or "none"
        report["muon_c10d_backends"] = list(info["c10d_backends"])
        report["newton_schulz_kernels"] = {
            "float32": muon_cpp.newton_schulz_cpu_kernels(torch.float32),
            "bfloat16": muon_cpp.newton_schulz_cpu_kernels(torch.bfloat16)}
        problem = muon_cpp._extension_problem(info)
        report["extension_matches_torch"] = problem is None
        if problem:
            report["problems"].append(problem)
        if info["python"] != ".".join(report["python"].split(".")[:2]):
            report["problems"].append(f"the extension was built for Python {info['python']}, "
                                      f"this is Python {report['python']}")
    blas = _loaded_blas()
    report["blas_loaded"] = blas
    threads = _blas_threads(blas)
    report["blas_threads"] = threads
    # Several ranks per machine, each with a full BLAS pool, spin against each other.
    ranks = _local_world_size(env.get("LOCAL_WORLD_SIZE"), report["problems"])
    cores = os.cpu_count() or 1
    per_rank = max(threads or 1, report["intra_op_threads"])
    if ranks * per_rank > cores:
        report["warnings"].append(
            f"{ranks} local rank(s) x {per_rank} threads each > {cores} cores: set "
            f"OMP_NUM_THREADS/OPENBLAS_NUM_THREADS to {max(1, cores // ranks)} (torchrun and "
            "muon-launch do when they start the ranks)")
    return report


def verdict(report):
    if report["problems"]:
        return "muon_cpp doctor: PROBLEM: " + "; ".join(report["problems"])
    extra = f"; warning: {'; '.join(report['warnings'])}" if report["warnings"] else ""
    return (f"muon_cpp doctor: OK (muon_cpp {report.get('muon_cpp')} on torch {report.get('torch')}, "
            f"extension built against {report.get('built_against_torch')}{extra})")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    report = collect()
    line = verdict(report)
    if "--json" in argv:
        report["verdict"] = line
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        for key in ("muon_cpp", "muon_cpp_path", "python", "python_executable", "platform",
                    "torch", "torch_path", "built_against_torch", "extension_matches_torch", "compiler", "cxx11_abi",
                    "torch_cxx11_abi", "pybind11", "built_for_python", "cpu", "cpu_count",
                    "cpu_flags", "aten_cpu_capability", "newton_schulz_kernels", "blas_loaded",
                    "blas_threads", "cblas_library", "dnnl_library", "intra_op_threads",
                    "inter_op_threads", "torch_c10d_backends", "muon_c10d_backends",
                    "cuda_available", "environment"):
            if key in report:
                print(f"{key:22} {report[key]}")
        print(line)
    return 0 if not report["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
