"""``python3 -m muon_cpp.torchrun ...``: torchrun, also where torch was built
without libuv.

Since torch 2.4 the TCPStore that torchrun's rendezvous creates uses the
libuv backend unless told otherwise, and its static and c10d rendezvous
never read ``USE_LIBUV``. A torch built without libuv (Debian 13's 2.6.0
is) then cannot start any job: "use_libuv was requested but PyTorch was
build without libuv support". This entry point finds out whether this
torch's TCPStore has libuv; when it does not, it makes the classic backend
the default for the agent's stores and sets ``USE_LIBUV=0`` for the workers
(``init_process_group``'s env:// rendezvous reads it), then runs torchrun
with the same arguments. Where libuv works, or on torch 1.13 (which has
only the classic backend), it is torchrun unchanged, except for one
Debian 12 defect (``_with_redirects``).

Restarts (``--max-restarts``) with the c10d rendezvous: torch 2.4-2.6's
agents share their rendezvous store with the workers, and that breaks
every restart. The workers' keys of the attempt before stay in the shared
store (init_process_group no longer prefixes them by attempt), so the new
ranks read the dead ranks' addresses ("Gloo connectFullMesh failed"), and
a node that becomes group rank 0 on a restart trips an assertion in the
agent (``_shared_tcp_store_server is not None``). This entry point sets
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` unless it is set: rank 0 of each
attempt hosts a store of its own, as before torch 2.4.

    python3 -m muon_cpp.torchrun --nproc_per_node 2 train.py
"""
import importlib
import os
import sys


def libuv_available():
    """Whether this torch's TCPStore can use libuv: True or False, or None when
    it has no such option (torch < 2.2: the classic backend only)."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True, wait_for_workers=False)
    except TypeError:
        return None
    except RuntimeError as e:
        if "libuv" in str(e):
            return False
        raise
    del store
    return True


def _default_to_classic_store():
    import torch.distributed as dist

    base = dist.TCPStore

    class ClassicTCPStore(base):
        """torch's TCPStore, the classic backend unless use_libuv is given."""

        def __init__(self, *args, **kwargs):
            if len(args) < 9:
                kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    ClassicTCPStore.__name__ = "TCPStore"
    ClassicTCPStore.__qualname__ = "TCPStore"
    dist.TCPStore = ClassicTCPStore
    # init_process_group's env:// rendezvous bound the name when
    # torch.distributed was imported.
    # (torch.distributed.rendezvous is also the name of a function there:
    # take the module itself.)
    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    if getattr(rendezvous, "TCPStore", None) is base:
        rendezvous.TCPStore = ClassicTCPStore


def main(argv=None):
    import torch.distributed as dist

    if not dist.is_available():
        sys.exit("muon_cpp.torchrun: this torch has no torch.distributed")
    args = _with_redirects(list(sys.argv[1:] if argv is None else argv))
    # Read by the agent's rendezvous (torch >= 2.4); see the module's text.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    classic = (os.environ.get("USE_LIBUV") != "1" and hasattr(dist, "TCPStore")
               and libuv_available() is False)
    if classic:
        os.environ["USE_LIBUV"] = "0"
        # Before torch.distributed.run imports the rendezvous modules, which
        # import TCPStore by name.
        _default_to_classic_store()
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import record

    parsed = run.parse_args(args)
    if classic and not parsed.no_python:
        # Python workers connect to the agent's store with TCPStore's
        # defaults (torch.distributed.rendezvous, agent store): they start
        # through muon_cpp._torchrun_worker, which changes the default there
        # too, then runs the script or module as __main__.
        target = ["-m", parsed.training_script] if parsed.module else [parsed.training_script]
        parsed.training_script_args = target + list(parsed.training_script_args)
        parsed.training_script = "muon_cpp._torchrun_worker"
        parsed.module = True
    record(run.run)(parsed)


def _with_redirects(args):
    """Debian's torch 1.13 on Python 3.11 fails to parse torchrun's default
    ``--redirects 0 --tee 0`` (and 3) and crashes in the agent; without
    those flags, give it 2 and 2 (each rank's stderr to its log and copied
    to the console; stdout goes to the console as it does by default). Only
    the launcher's own flags (before the .py script) count."""
    import torch

    if not torch.__version__.startswith("1."):
        return args
    launcher = []
    for a in args:
        if a.endswith(".py"):
            break
        launcher.append(a)
    if any(a.split("=")[0] in ("--redirects", "-r", "--tee", "-t") for a in launcher):
        return args
    return ["--redirects", "2", "--tee", "2"] + args


if __name__ == "__main__":
    main()
