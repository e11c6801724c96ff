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
            steps = [int(m.group(1)) for m in map(re.compile(r"step-(\d+)\.pt$").match,
                                                  os.listdir(directory)) if m]
            if steps:
                return max(steps)
        assert node.proc.poll() is None, node.output()
        time.sleep(0.005)
    pytest.fail("no checkpoint within %d s:\n%s" % (limit, node.output()))


def _continued_from(text):
    m = re.search(r"--resume auto: continuing from step (\d+)", text)
    return int(m.group(1)) if m else -1


def test_two_agents_give_the_one_process_curve(tmp_path):
    one = _one_process(tmp_path, 20)
    port = _free_port()
    args = TINY + ["--steps", "20", "--out", str(tmp_path / "two_nodes")]
    a = Node(str(tmp_path / "a.log"), "2", port, [], args)
    b = Node(str(tmp_path / "b.log"), "2", port, [], args)
    assert a.wait(300) == 0, a.output() + "\n---- node b ----\n" + b.output()
    assert b.wait(300) == 0, b.output()
    assert "4 rank(s) (ddp)" in a.output() + b.output()
    d = _difference(_read_curve(tmp_path / "two_nodes" / "muon.csv"), one)
    print(f"2 nodes x 2 ranks vs one process: {d:.2e}")
    assert d <= CURVE_TOLERANCE


def test_killed_rank_restarts_from_the_newest_checkpoint(tmp_path):
    steps = 60
    straight = tmp_path / "straight"
    port = _free_port()
    common = TINY + ["--steps", str(steps)]
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
    print(f"killed a rank after checkpoint {saved}, continued from {start}: {d:.2e}")
    assert d <= SAME_WORLD_TOLERANCE


def test_node_dying_restarts_at_the_smaller_world(tmp_path):
    steps = 60
    one = _one_process(tmp_path, steps)
    save = tmp_path / "save"
    out = tmp_path / "elastic"
    args = TINY + ["--steps", str(steps), "--save", str(save), "--save-every", "10",
                   "--resume", "auto", "--out", str(out)]
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
    assert "4 rank(s) (ddp)" in text + b.output(), text
    assert "2 rank(s) (ddp)" in text, text
    assert "written by 4 rank(s); this run: 2" in text, text
    start = _continued_from(text)
    assert saved <= start < steps, ("the node was killed after the run ended; the test needs a "
                                    "longer run", text)
    d = _difference(_read_curve(out / "muon.csv"), one)
    print(f"node killed after checkpoint {saved}; 2 ranks continued from {start}: {d:.2e}")
    assert d <= CURVE_TOLERANCE
