#!/usr/bin/env python3
"""muon::plan's predictions for published distributed-Muon setups, side by
side with the published numbers (REFERENCE: NVIDIA/Megatron on GB300, the
Megatron-FSDP seed, dion#96), for the layout each used and for each of ours.

  bench/plan/project_published.py [--build build]

Prints the Markdown tables of docs/scale.md ("Projected there"). Every
input is a preset of muon::plan (src/distributed/plan/plan_io.cpp: model shapes,
machine figures), named in docs/scale.md.
"""
import argparse
import json
import os
import subprocess
import sys

OURS = ["replicated", "layerwise", "sharded", "sharded-replicated"]


def plan(binary, model, machine, world, layout=None, extra=()):
    cmd = [binary, "--model", model, "--machine", machine, "--world", str(world), "--ns-dtype", "bf16",
           "--optimizer-step", "--json"] + list(extra)
    if layout:
        cmd += ["--layout", layout]
    return {p["layout"]: p for p in json.loads(subprocess.check_output(cmd))}


def pct(x):
    return f"{100 * x:.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    b = os.path.join(a.build, "muon-plan")

    print("### Muon's throughput cost against AdamW (NVIDIA, GB300)\n")
    print("| setup | published cost | model, their layout (layerwise) | ratio | sharded (ours) | "
          "replicated | sharded-replicated | Muon step ms, layerwise → sharded |")
    print("|---|---|---|---|---|---|---|---|")
    for model, world, published, label in (("kimi-k2", 64, 0.021, "Kimi-K2, 256 GPUs (a PP stage: DP64·EP64)"),
                                           ("qwen3-30b-a3b", 8, 0.038, "Qwen3-30B-A3B, 8 GPUs (DP8·EP8)")):
        p = plan(b, model, "gb300", world)
        lw = p["layerwise"]["throughput_cost"]
        print(f"| {label} | {pct(published)} | {pct(lw)} | {lw / published:.2f} | "
              f"{pct(p['sharded']['throughput_cost'])} | {pct(p['replicated']['throughput_cost'])} | "
              f"{pct(p['sharded-replicated']['throughput_cost'])} | "
              f"{1e3 * p['layerwise']['step_s']:.0f} → {1e3 * p['sharded']['step_s']:.0f} |")

    print("\n### Training step against Adam (Megatron-FSDP seed, 8 H100, FSDP over 8)\n")
    print("| model | published (Muon ÷ Adam) | model, their layout (sharded-replicated) | sharded (ours) | "
          "layerwise | NS ms, theirs → ours | sent/step, theirs → ours |")
    print("|---|---|---|---|---|---|---|")
    for model in ("dsv3-proxy-1b", "dsv3-proxy-3b", "dsv3-proxy-8b"):
        p = plan(b, model, "h100", 8)
        t, o = p["sharded-replicated"], p["sharded"]
        print(f"| {model} | 1.5–2.7× (1B–8B) | {t['iteration_ratio']:.2f}× | {o['iteration_ratio']:.2f}× | "
              f"{p['layerwise']['iteration_ratio']:.2f}× | {1e3 * t['newton_schulz_s']:.0f} → "
              f"{1e3 * o['newton_schulz_s']:.0f} | {t['bytes_sent'] / 2**30:.2f} → {o['bytes_sent'] / 2**30:.2f} GiB |")

    print("\n### NorDion2's optimizer step (dion#96, H100, FSDP2, width 5120, 8 layers)\n")
    print("| GPUs | published step ms | model (sharded rows, FSDP2 gathers) | ratio | published NS ms | "
          "model NS ms | ratio |")
    print("|---|---|---|---|---|---|---|")
    for world, step, ns in ((1, 117.9, 85), (2, 61.8, 44), (4, 31.4, 22)):
        p = plan(b, "dion-5120x8", "h100", world, "sharded", ["--row-fraction", "0.25"])["sharded"]
        # FSDP2 reduce-scatters the gradients and gathers the parameters in
        # backward and forward: the optimizer's step is the rest (compute and
        # the owner exchange, serial: the published step is a GPU wall time).
        rest = sum(c["seconds"] for c in p["collectives"]
                   if c["what"] not in ("gradients reduce-scatter", "updated rows all-gather"))
        opt = p["newton_schulz_s"] + p["elementwise_s"] + rest
        print(f"| {world} | {step} | {1e3 * opt:.1f} | {1e3 * opt / step:.2f} | {ns} | "
              f"{1e3 * p['newton_schulz_s']:.1f} | {1e3 * p['newton_schulz_s'] / ns:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
