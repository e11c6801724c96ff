"""A torchrun worker started by ``muon_cpp.torchrun`` where torch has no libuv:
makes the classic TCPStore the default in this process (the worker's
rendezvous connects to the agent's store with TCPStore's defaults), then runs
the training script (``_torchrun_worker.py SCRIPT ARGS...``) or module
(``-m MODULE ARGS...``) as ``__main__``."""
import os
import runpy
import sys

from .torchrun import _default_to_classic_store


def main():
    if len(sys.argv) < 2:
        sys.exit("muon_cpp._torchrun_worker: expected a script or -m MODULE")
    _default_to_classic_store()
    if sys.argv[1] == "-m":
        if len(sys.argv) < 3:
            sys.exit("muon_cpp._torchrun_worker: -m needs a module")
        module = sys.argv[2]
        sys.argv = [module] + sys.argv[3:]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script = sys.argv[1]
        sys.argv = sys.argv[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
