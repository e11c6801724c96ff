"""Starting a case of dist_cases.py on W real processes (gloo over TCP), for
the distributed test files: a rank's exception fails the test with every
failed rank's traceback, and ranks that hang are killed at a deadline."""
import multiprocessing
import os
import socket
import tempfile
import time

import torch
import torch.multiprocessing as mp

import dist_cases as dc

# Longest a case may take before its ranks are killed and the test fails (a
# case takes 0.5-3 s here; the gloo and engine timeouts inside are 60 s).
DEADLINE_S = 120

# Ranks fork from a forkserver that has imported torch and muon_cpp once (a
# fresh interpreter that has run nothing else, so forking it is safe): each
# start then costs a fork instead of two interpreters importing torch.
START_METHOD = os.environ.get("MUON_DIST_TEST_START_METHOD", "forkserver")
multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "muon_cpp", "dist_cases"])


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(case, world, **kwargs):
    """Runs dist_cases.CASES[case](rank, world, **kwargs) on `world` processes;
    returns their results by rank. When a rank fails, raises AssertionError with
    every failed rank's traceback (by rank: the cause and the ranks that failed
    because of it); AssertionError too when ranks still run after DEADLINE_S."""
    with tempfile.TemporaryDirectory(prefix="muon_dist_") as outdir:
        ctx = mp.start_processes(dc.run_rank, args=(world, free_port(), case, outdir, kwargs),
                                 nprocs=world, join=False, start_method=START_METHOD)
        deadline = time.monotonic() + DEADLINE_S
        failure = None
        try:
            # join() returns True when all ranks ended, False on its timeout, and
            # raises (ending the other ranks) as soon as one rank fails.
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    failure = "ranks still running after %d s" % DEADLINE_S
                    break
        except Exception as e:  # noqa: BLE001 - re-raised below with every rank's error
            failure = "%s: %s" % (type(e).__name__, e)
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
        if failure is not None:
            errors = []
            for r in range(world):
                path = os.path.join(outdir, "rank%d.err" % r)
                if os.path.exists(path):
                    with open(path) as f:
                        errors.append("---- rank %d of %d raised:\n%s" % (r, world, f.read()))
            raise AssertionError("case %r %s failed: %s\n%s" % (case, kwargs, failure, "\n".join(errors)))
        return [torch.load(os.path.join(outdir, "rank%d.pt" % r)) for r in range(world)]
