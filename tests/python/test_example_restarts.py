"""examples/python/train_gpt.py beyond one machine, with real processes.

Each node is a process tree of its own (a torchrun agent in its own session
and the ranks it starts); the nodes meet through torchrun's c10d
rendezvous over TCP on this host, as two machines would, and a node dies
by SIGKILL of its whole tree.

- two agents (--nnodes 2 --nproc_per_node 2) train one process's curve;
- a rank killed under --max-restarts: the group restarts and --resume auto
  continues from the newest checkpoint to the uninterrupted curve;
- a node killed under --nnodes 1:2: the other restarts at 2 ranks from the
  checkpoint 4 ranks wrote, on one process's curve.

torchrun is ``python3 -m muon_cpp.torchrun`` (torchrun with the same
arguments; it also starts jobs where torch has no libuv).
"""
import csv
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_gpt.py")

TINY = ["--runs", "muon", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "16",
        "--batch", "8", "--eval-every", "5", "--eval-windows", "8", "--chars", "20000",
        "--threads", "1"]

# Another world size changes only the order of fp32 sums (gradients averaged
# over 4 ranks or 2, evaluation sums split otherwise), a few units of
# rounding each; over tens of steps training keeps them below 1e-4 relative,
# while a batch lost or counted twice moves the loss by more than 1e-2.
CURVE_TOLERANCE = 1e-4
# The same ranks resuming from a checkpoint redo the same arithmetic in the
# same order on the state saved bit for bit: the curve is the uninterrupted
# one up to the CSV's 9 significant digits (5e-9 relative); 1e-7 allows a
# unit of fp32 rounding and nothing more.
SAME_WORLD_TOLERANCE = 1e-7


def _env():
    import muon_cpp

    env = dict(os.environ)
    package = os.path.dirname(os.path.dirname(os.path.abspath(muon_cpp.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package, env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_curve(path):
    with open(path) as f:
        return [(int(r["step"]), int(r["tokens"]), float(r["train_loss"]), float(r["valid_loss"]))
                for r in csv.DictReader(f)]


def _difference(a, b):
    """The largest relative difference of two curves' losses; their logged
    steps and token counts must be equal (a step lost or counted twice
    changes them)."""
    assert [r[:2] for r in a] == [r[:2] for r in b], (a, b)
    worst = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        worst = max(worst, abs(x[3] - y[3]) / abs(y[3]))
        if i > 0:
            worst = max(worst, abs(x[2] - y[2]) / abs(y[2]))
    return worst


def _descendants(root):
    parent = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        parent[int(name)] = int(text[text.rfind(")") + 2:].split()[1])
    found = [root]
    for pid in found:
        found.extend(p for p, pp in parent.items() if pp == pid)
    return found[1:]


class Node:
    """A torchrun agent in a session of its own, its output in a file."""

    def __init__(self, log, nnodes, port, agent_flags, script_args):
        cmd = [sys.executable, "-m", "muon_cpp.torchrun", "--nnodes", nnodes, "--nproc_per_node",
               "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
               "--rdzv_id", "muon_py_test", "--monitor_interval", "1"] + agent_flags
        cmd += [EXAMPLE] + script_args
        self.log = log
        self._file = open(log, "w")
        self.proc = subprocess.Popen(cmd, env=_env(), stdout=self._file, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self):
        with open(self.log) as f:
            return f.read()

    def workers(self):
        return [p for p in _descendants(self.proc.pid)
                if EXAMPLE in open(f"/proc/{p}/cmdline").read().replace("\0", " ")]

    def kill_all(self):
        """A machine dying: SIGKILL to the agent and everything below it."""
        below = _descendants(self.proc.pid)
        for pid in [self.proc.pid] + below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def wait(self, limit):
        try:
            return self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.kill_all()
            return None
        finally:
            self._file.close()

    def __del__(self):
        if self.proc.poll() is None:
            self.kill_all()


def _has_fsdp2():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or 1.13's FSDP failing on Python 3.11
        return False
    return True


# The example's two layouts: DDP (the Muon run layer-wise, whole
# checkpoints gathered by rank 0) and FSDP2 (sharded, checkpoints of
# torch.distributed.checkpoint), torch >= 2.6.
PARALLEL = pytest.mark.parametrize("parallel", [
    "ddp",
    pytest.param("fsdp2", marks=pytest.mark.skipif(
        not _has_fsdp2(), reason="FSDP2 (fully_shard) needs torch >= 2.6; this torch is %s"
        % torch.__version__)),
])


def _one_process(tmp_path, steps):
    out = tmp_path / "one"
    r = subprocess.run([sys.executable, EXAMPLE] + TINY + ["--steps", str(steps), "--out", str(out)],
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return _read_curve(out / "muon.csv")


def _wait_for_checkpoint(directory, node, limit=240):
    """The step of the first complete checkpoint in ``directory``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if os.path.isdir(directory):
            steps = [int(m.group(1)) for m in map(re.compile(r"step-(\d+)(\.pt)?$").match,
                                                  os.listdir(directory)) if m]
            if steps:
                return max(steps)
        assert node.proc.poll() is None, node.output()
        time.sleep(0.005)
    pytest.fail("no checkpoint within %d s:\n%s" % (limit, node.output()))


def _continued_from(text):
    m = re.search(r"--resume auto: continuing from step (\d+)", text)
    return int(m.group(1)) if m else -1


@PARALLEL
def test_two_agents_give_the_one_process_curve(tmp_path, parallel):
    one = _one_process(tmp_path, 20)
    port = _free_port()
    args = TINY + ["--steps", "20", "--out", str(tmp_path / "two_nodes"), "--parallel", parallel]
    a = Node(str(tmp_path / "a.log"), "2", port, [], args)
    b = Node(str(tmp_path / "b.log"), "2", port, [], args)
    assert a.wait(300) == 0, a.output() + "\n---- node b ----\n" + b.output()
    assert b.wait(300) == 0, b.output()
    assert f"4 rank(s) ({parallel})" in a.output() + b.output()
    d = _difference(_read_curve(tmp_path / "two_nodes" / "muon.csv"), one)
    print(f"{parallel}: 2 nodes x 2 ranks vs one process: {d:.2e}")
    assert d <= CURVE_TOLERANCE


@PARALLEL
def test_killed_rank_restarts_from_the_newest_checkpoint(tmp_path, parallel):
    steps = 60
    straight = tmp_path / "straight"
    port = _free_port()
    common = TINY + ["--steps", str(steps), "--parallel", parallel]
    # The uninterrupted run: the same 2 ranks, once.
    node = Node(str(tmp_path / "straight.log"), "1", port, [], common + ["--out", str(straight)])
    assert node.wait(300) == 0, node.output()
    uninterrupted = _read_curve(straight / "muon.csv")

    save = tmp_path / "save"
    out = tmp_path / "restarted"
    node = Node(str(tmp_path / "agent.log"), "1", _free_port(), ["--max_restarts", "1"],
                common + ["--save", str(save), "--save-every", "10", "--resume", "auto",
                          "--out", str(out)])
    saved = _wait_for_checkpoint(save / "muon", node)
    workers = node.workers()
    assert len(workers) == 2, node.output()
    os.kill(workers[1], signal.SIGKILL)
    assert node.wait(300) == 0, node.output()
    text = node.output()
    assert "--resume auto: no checkpoint" in text, text
    start = _continued_from(text)
    assert saved <= start < steps, ("the rank was killed after the run ended; the test needs a "
                                    "longer run", text)
    d = _difference(_read_curve(out / "muon.csv"), uninterrupted)
    print(f"{parallel}: killed a rank after checkpoint {saved}, continued from {start}: {d:.2e}")
    assert d <= SAME_WORLD_TOLERANCE


@PARALLEL
def test_node_dying_restarts_at_the_smaller_world(tmp_path, parallel):
    steps = 60
    one = _one_process(tmp_path, steps)
    save = tmp_path / "save"
    out = tmp_path / "elastic"
    args = TINY + ["--steps", str(steps), "--save", str(save), "--save-every", "10",
                   "--resume", "auto", "--out", str(out), "--parallel", parallel]
    port = _free_port()
    # Node a hosts the rendezvous store; node b dies. Between 1 and 2 nodes:
    # after b is gone, a waits last_call_timeout for more and goes on alone.
    elastic = ["--max_restarts", "2", "--rdzv_conf", "last_call_timeout=5,is_host=%d"]
    elastic_b = elastic[:-1] + [elastic[-1] % 0]
    elastic_a = elastic[:-1] + [elastic[-1] % 1]
    b = Node(str(tmp_path / "b.log"), "1:2", port, elastic_b, args)
    a = Node(str(tmp_path / "a.log"), "1:2", port, elastic_a, args)
    saved = _wait_for_checkpoint(save / "muon", a)
    b.kill_all()
    assert a.wait(400) == 0, a.output() + "\n---- node b ----\n" + b.output()
    text = a.output()
    assert f"4 rank(s) ({parallel})" in text + b.output(), text
    assert f"2 rank(s) ({parallel})" in text, text
    assert "written by 4 rank(s); this run: 2" in text, text
    start = _continued_from(text)
    assert saved <= start < steps, ("the node was killed after the run ended; the test needs a "
                                    "longer run", text)
    d = _difference(_read_curve(out / "muon.csv"), one)
    print(f"{parallel}: node killed after checkpoint {saved}; 2 ranks continued from {start}: "
          f"{d:.2e}")
    assert d <= CURVE_TOLERANCE


def test_checkpoint_flags_fail_in_one_line_naming_them(tmp_path):
    def run(*extra):
        r = subprocess.run([sys.executable, EXAMPLE] + TINY + ["--steps", "4"] + list(extra),
                           env=_env(), capture_output=True, text=True, timeout=300)
        return r.returncode, (r.stdout + r.stderr).strip().splitlines()

    code, lines = run("--resume", "auto")
    assert code == 2 and "--resume auto" in lines[-1] and "--save" in lines[-1], lines
    code, lines = run("--resume", str(tmp_path / "empty"), "--out", str(tmp_path / "o1"))
    assert code == 1 and "no checkpoint of run 'muon'" in lines[-1], lines
    # A checkpoint of another model names the flag and both values, and
    # nothing is trained.
    save = tmp_path / "save"
    code, lines = run("--save", str(save), "--out", str(tmp_path / "o2"))
    assert code == 0, lines
    code, lines = run("--resume", str(save), "--d-model", "64", "--out", str(tmp_path / "o3"))
    assert code == 1 and "--d-model 32, this run has 64" in lines[-1], lines
    assert not (tmp_path / "o3" / "muon.csv").exists()
