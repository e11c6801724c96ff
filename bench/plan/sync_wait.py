"""The wait a collective adds when the ranks compute on shared CPU cores.

Each rank runs a loop of Newton–Schulz-like products (one thread), and each
iteration is followed by a tiny all-gather (8 bytes a rank) or by nothing.
The difference per iteration is what one collective costs inside a step
whose ranks all compute. That is the term muon-plan's time model lacks on
CPU nodes (docs/scale.md, "Validated here"): between otherwise idle
processes a collective takes 50-110 µs here, inside such a loop about 1 ms
at 2 ranks on 2 cores and 4-6 ms at 4.

    /usr/bin/torchrun --standalone --nproc_per_node 2 --redirects 2 --tee 2 \\
        bench/plan/sync_wait.py [--reps 5] [--iters 60]
"""
import argparse
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="products per iteration (its compute)")
    ap.add_argument("--iters", type=int, default=60, help="iterations per measurement")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.randn(128, 512)

    def compute():
        y = x
        for _ in range(a.reps):
            y = (y @ y.t()) @ y * 1e-3 + y

    small = torch.zeros(2)
    out = [torch.zeros(2) for _ in range(world)]
    ms = {}
    for mode in ("compute", "sync", "compute", "sync"):  # each twice, the second kept
        dist.barrier()
        t = time.perf_counter()
        for _ in range(a.iters):
            compute()
            if mode == "sync":
                dist.all_gather(out, small)
        dist.barrier()
        ms[mode] = (time.perf_counter() - t) / a.iters * 1e3
    if rank == 0:
        print(f"{world} ranks: compute {ms['compute']:.2f} ms per iteration, with an all-gather "
              f"{ms['sync']:.2f} ms: {ms['sync'] - ms['compute']:.2f} ms per collective")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
