"""Shared helpers of the GPU benchmarks and the summary of scripts/gpu-check.sh.

bench/gpu_newton_schulz.py and bench/gpu_muon_step.py import the timing,
environment and table helpers below. scripts/gpu-check.sh runs

    python3 bench/gpu_common.py summarize OUTDIR --mode gpu|nogpu --elapsed S --budget S

which reads what the steps left in OUTDIR (steps.tsv, env.json, the gtest
JSON, the pytest JUnit XML, the benchmarks' JSON and markdown, the main
job's summary and log) and writes OUTDIR/summary.json and OUTDIR/summary.md.
The summary needs the standard library only (no torch).
"""
import argparse
import json
import os
import statistics
import sys
import time


# ---- the benchmarks' helpers (torch imported inside) ---------------------------------

def import_muon_cpp():
    """(module, None) or (None, why): the benchmarks still time torch without it."""
    try:
        import muon_cpp
        return muon_cpp, None
    except Exception as e:  # noqa: BLE001  (ImportError, or the extension's own)
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def pick_device(name):
    import torch
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (torch.cuda.is_available() is False); "
                         "run with --device cpu --quick")
    return torch.device(name)


def sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device):
    """Seconds of one call of fn: CUDA events on the GPU (the queue drained
    first), perf_counter on the CPU."""
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def time_round_robin(fns, device, warmup, reps):
    """{name: [seconds...]}: each function warmed up, then `reps` rounds that
    call every function once, in an order rotated every round, so that each
    sees the same state of the machine (clocks, temperature, caches)."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    sync(device)
    times = {name: [] for name in names}
    for r in range(reps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(time_call(fns[name], device))
    return times


def median(xs):
    return statistics.median(xs) if xs else None


def gemm_tflops(device, n, dtype, warmup, reps):
    """TFLOP/s of torch.mm on n×n operands (2n³ per product), median of reps."""
    import torch
    g = torch.Generator(device=device).manual_seed(1)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    out = torch.empty(n, n, device=device, dtype=dtype)
    times = time_round_robin({"mm": lambda: torch.mm(a, b, out=out)}, device, warmup, reps)["mm"]
    del a, b, out
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "median_s": median(times),
            "tflops": 2.0 * n ** 3 / median(times) / 1e12, "times_s": times}


def environment(device, muon_cpp=None, muon_error=None):
    import platform
    import torch
    e = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "device": str(device),
         "python": platform.python_version(), "cpu_count": os.cpu_count(),
         "torch_threads": torch.get_num_threads(), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        e.update(gpu=p.name, capability="%d.%d" % (p.major, p.minor),
                 multiprocessors=p.multi_processor_count,
                 gpu_memory_gib=round(p.total_memory / 2 ** 30, 1))
    else:
        e["cpu"] = platform.processor() or platform.machine()
    if muon_cpp is not None:
        try:
            e["muon_cpp"] = muon_cpp.build_info()
        except Exception as ex:  # noqa: BLE001
            e["muon_cpp"] = f"build_info failed: {ex}"
    else:
        e["muon_cpp"] = None
        e["muon_cpp_error"] = muon_error
    return e


def fmt(x, digits=3):
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if x != 0 and (abs(x) < 10 ** -(digits) or abs(x) >= 1e6):
            return f"{x:.{digits - 1}e}"
        return f"{x:.{digits}f}"
    return str(x)


def md_table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        out.append("| " + " | ".join(fmt(v) if not isinstance(v, str) else v for v in r) + " |")
    return "\n".join(out) + "\n"


def goal(name, value, target, op=">=", note=""):
    """A target check: PASS/FAIL, or n/a when the value is missing."""
    if value is None:
        status = "n/a"
    elif op == ">=":
        status = "PASS" if value >= target else "FAIL"
    else:
        status = "PASS" if value <= target else "FAIL"
    return {"goal": name, "value": value, "target": f"{op} {target}", "status": status, "note": note}


def goals_markdown(goals):
    return md_table(["goal", "value", "target", "result", "note"],
                    [[g["goal"], g["value"], g["target"], g["status"], g.get("note", "")] for g in goals])


def finish(result, markdown, args):
    """Prints the table, writes --json and --markdown with the goals' table
    appended; exits 1 under --strict when a goal failed."""
    markdown += ("" if markdown.endswith("\n\n") else "\n") + goals_markdown(result["goals"])
    print(markdown)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown)
    if args.strict and any(g["status"] == "FAIL" for g in result["goals"]):
        sys.exit(1)


# ---- scripts/gpu-check.sh's summary ----------------------------------------------------

def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _read_text(path, limit=None):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return text[-limit:] if limit else text


def _gtest(path):
    d = _read_json(path)
    if d is None:
        return None
    passed, failed, skipped = [], [], []
    for suite in d.get("testsuites", []):
        for t in suite.get("testsuite", []):
            name = f"{suite.get('name')}.{t.get('name')}"
            if t.get("failures"):
                failed.append({"name": name, "message": t["failures"][0].get("failure", "")[:500]})
            elif t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                skipped.append(name)
            else:
                passed.append(name)
    return {"tests": d.get("tests"), "passed": len(passed), "failed": len(failed),
            "skipped": len(skipped), "failures": failed, "skipped_names": skipped,
            "time": d.get("time")}


def _junit(path):
    import xml.etree.ElementTree as ET
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for s in suites:
        out["tests"] += int(s.get("tests", 0))
        out["failed"] += int(s.get("failures", 0))
        out["errors"] += int(s.get("errors", 0))
        out["skipped"] += int(s.get("skipped", 0))
        for case in s.iter("testcase"):
            for bad in list(case.findall("failure")) + list(case.findall("error")):
                out["failures"].append({"name": f"{case.get('classname')}.{case.get('name')}",
                                        "message": (bad.get("message") or "")[:500]})
    out["passed"] = out["tests"] - out["failed"] - out["errors"] - out["skipped"]
    return out


def _train_table(log):
    """The comparison table muon-train-gpt prints at its end."""
    if not log:
        return None
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if "val loss" in line and "ms/step" in line:
            return "\n".join(lines[i:i + 12])
    return None


def summarize(outdir, mode, elapsed, budget):
    steps = []
    try:
        with open(os.path.join(outdir, "steps.tsv")) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 4:
                    steps.append({"step": parts[0], "status": parts[1], "rc": parts[2],
                                  "seconds": int(parts[3] or 0), "note": (parts[4] if len(parts) > 4 else "").strip()})
    except OSError:
        pass
    p = lambda name: os.path.join(outdir, name)  # noqa: E731
    ns = _read_json(p("ns_bench.json"))
    step = _read_json(p("step_bench.json"))
    train = _read_json(p("train_summary.json"))
    summary = {
        "mode": mode, "elapsed_s": elapsed, "budget_s": budget,
        "ok": bool(steps) and all(s["status"] in ("pass", "skip") for s in steps),
        "steps": steps,
        "env": _read_json(p("env.json")),
        "cmake_cache": (_read_text(p("cmake-cache.txt")) or "").splitlines(),
        "missing_targets": (_read_text(p("missing-targets.txt")) or "").split(),
        "test_cuda": _gtest(p("test_cuda.json")),
        "pytest_cuda": _junit(p("pytest_cuda.xml")),
        "ns_bench": ns, "step_bench": step,
        "train": {"summary": train, "table": _train_table(_read_text(p("train.log")))},
        "goals": [dict(g, bench=name) for name, d in (("ns_bench", ns), ("step_bench", step)) if d
                  for g in d.get("goals", [])],
    }
    tmp = p(f".summary.json.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, p("summary.json"))

    md = [f"# gpu-check ({mode})", ""]
    env = summary["env"] or {}
    if env:
        md.append(f"- GPU: {env.get('gpu', 'none')} (capability {env.get('capability', '–')}, "
                  f"{env.get('gpu_memory_gib', '–')} GiB); {env.get('cpu_count')} cores")
        md.append(f"- torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), Python "
                  f"{env.get('python_version')} ({env.get('python')}), Python.h: {env.get('python_h')}")
        md.append(f"- nvcc: {' '.join(env.get('nvcc') or ['–'])}; cmake: {' '.join(env.get('cmake') or [])}; "
                  f"c++: {' '.join(env.get('cxx') or [])}")
    md.append(f"- elapsed {elapsed} s of a {budget} s budget; steps: "
              f"{'all passed or skipped' if summary['ok'] else 'NOT all passed'}")
    if summary["goals"]:
        counts = {}
        for g in summary["goals"]:
            counts[g["status"]] = counts.get(g["status"], 0) + 1
        md.append("- benchmark goals: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
                  + " (tables below)")
    md += ["", "## Steps", "", md_table(["step", "status", "rc", "s", "note"],
                                        [[s["step"], s["status"], s["rc"], str(s["seconds"]), s["note"][:300]]
                                         for s in steps])]
    for key, title in (("test_cuda", "test_cuda (gtest)"), ("pytest_cuda", "tests/python/test_cuda.py")):
        r = summary[key]
        if r:
            md.append(f"**{title}**: {r['tests']} tests, {r['passed']} passed, {r['failed']} failed"
                      f"{', %d errors' % r['errors'] if r.get('errors') else ''}, {r['skipped']} skipped")
            for f_ in r["failures"][:20]:
                md.append(f"- FAILED {f_['name']}: {f_['message'][:300]}")
            md.append("")
    for name, title in (("ns_bench.md", "Newton–Schulz (bench/gpu_newton_schulz.py)"),
                        ("step_bench.md", "Optimizer step (bench/gpu_muon_step.py)")):
        text = _read_text(p(name))
        if text:
            md += [f"## {title}", "", text.strip(), ""]
    if summary["train"]["table"] or train:
        md += ["## Main job (muon-train-gpt)", ""]
        if summary["train"]["table"]:
            md += ["```", summary["train"]["table"], "```", ""]
        if train:
            md.append(md_table(["run", "val loss", "ms/step", "optimizer ms/step"],
                               [[r["name"], r["valid_loss"], r["ms_per_step"], r["optimizer_ms_per_step"]]
                                for r in train.get("runs", [])]))
    tmp = p(f".summary.md.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write("\n".join(md) + "\n")
    os.replace(tmp, p("summary.md"))
    return summary


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize", help="write OUTDIR/summary.json and summary.md")
    s.add_argument("outdir")
    s.add_argument("--mode", default="gpu")
    s.add_argument("--elapsed", type=int, default=0)
    s.add_argument("--budget", type=int, default=0)
    a = ap.parse_args(argv)
    summary = summarize(a.outdir, a.mode, a.elapsed, a.budget)
    print(f"summary: {len(summary['steps'])} steps, ok={summary['ok']}")


if __name__ == "__main__":
    main(sys.argv[1:])
