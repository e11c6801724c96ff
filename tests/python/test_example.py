"""examples/python/train_gpt.py: the GPT example under torchrun, and its data.

The run test starts the example as a real 2-rank torchrun job (gloo over
sockets; DDP with muon_cpp.MuonWithAdamW in the layer-wise layout, or FSDP2's
fully_shard with the sharded layout, against torch.optim.AdamW) at a tiny
size and checks what it prints and writes.
The data test checks the Python port of the C++ main job's corpus and
batches against numbers recorded from the C++ build
(examples/train_gpt/data.cpp), so the two jobs train on the same tokens.
"""
import csv
import json
import hashlib
import math
import os
import re
import socket
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_gpt.py")


def _package_dir():
    """The directory holding the muon_cpp this test process imports (PYTHONPATH
    or conftest's MUON_CPP_PATH), for the ranks' PYTHONPATH."""
    import muon_cpp

    return os.path.dirname(os.path.dirname(os.path.abspath(muon_cpp.__file__)))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _example_module():
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import train_gpt
    finally:
        sys.path.pop(0)
    return train_gpt


TABLE_ROW = re.compile(r"^(adamw|muon)\s+(\S+)\s+(\S+)\s+(\S+)%\s+(.+)$")


def _has_fsdp2():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or 1.13's FSDP failing on Python 3.11
        return False
    return True


@pytest.mark.parametrize("parallel", [
    "ddp",
    pytest.param("fsdp2", marks=pytest.mark.skipif(
        not _has_fsdp2(), reason="FSDP2 (fully_shard) needs torch >= 2.6; this torch is %s"
        % torch.__version__)),
])
def test_two_rank_run_prints_the_table_and_muon_lowers_the_loss(tmp_path, parallel):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_dir(), env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = tmp_path / "out"
    # torchrun as `python -m torch.distributed.run` (the Python with torch);
    # a free port for its static rendezvous; "--redirects 2 --tee 2" (stderr
    # to a log, copied to the console) works around Debian's torchrun 1.13 on
    # Python 3.11, whose default "0" parses to None and crashes the agent.
    # muon_cpp.torchrun: torchrun, with the classic TCPStore where torch has no
    # libuv (Debian 13's 2.6 cannot start a job otherwise; docs/python.md).
    cmd = [sys.executable, "-m", "muon_cpp.torchrun", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "--redirects", "2", "--tee", "2", "--log_dir", str(tmp_path / "logs"),
           EXAMPLE, "--steps", "6", "--runs", "adamw,muon", "--d-model", "32", "--layers", "1",
           "--heads", "2", "--seq", "16", "--batch", "4", "--eval-every", "3",
           "--eval-windows", "8", "--chars", "20000", "--out", str(out), "--parallel", parallel]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert "2 rank(s) (%s)" % parallel in r.stdout, text

    # The table: a header, then one row per run with finite numbers.
    assert re.search(r"run\s+val loss\s+ms/step\s+opt share\s+steps to adamw's loss", r.stdout), text
    rows = {}
    for line in r.stdout.splitlines():
        m = TABLE_ROW.match(line.strip())
        if m:
            rows[m.group(1)] = m.groups()[1:]
    assert set(rows) == {"adamw", "muon"}, text
    for run, (val, ms, share, reach) in rows.items():
        assert math.isfinite(float(val)) and float(val) > 0, (run, text)
        assert float(ms) > 0 and 0 <= float(share) <= 100, (run, text)
    # AdamW is the baseline: it reaches its own final loss at its last step.
    assert rows["adamw"][3].strip() == "6 (1.00x)", text

    # The CSVs: evaluations at steps 0, 3, 6 on every run (rank 0 writes them),
    # the final validation loss the table shows, and Muon's loss going down.
    for run in ("adamw", "muon"):
        with open(out / f"{run}.csv") as f:
            log = list(csv.DictReader(f))
        assert [int(row["step"]) for row in log] == [0, 3, 6], (run, log)
        valid = [float(row["valid_loss"]) for row in log]
        assert all(math.isfinite(v) for v in valid), (run, log)
        assert f"{valid[-1]:.4f}" == rows[run][0], (run, log, text)
        if run == "muon":
            # Initial loss ~ln(vocab) (a near-uniform prediction at init);
            # 5 steps of Muon at lr 0.02 must lower it.
            assert valid[-1] < valid[0], log
            train = [float(row["train_loss"]) for row in log[1:]]
            assert train[-1] < valid[0], log


# Recorded from the C++ build: examples/train_gpt/data.cpp's generate_corpus(200000)
# (md5 of its bytes), and train_batch(train, step, 8, 16, rank 1, world 2, seed 7)
# (sum, first token) for steps 0..2 and valid_windows(valid, 128, 64) (rows, sum)
# over make_dataset of that text.
CPP_CORPUS_MD5 = "aee142068a739a89f64d44382fb59867"
CPP_BATCHES = [(1723, 32), (1834, 1), (1719, 2)]
CPP_VALID = (128, 212299)


def test_corpus_and_batches_are_the_cpp_jobs():
    T = _example_module()
    text = T.generate_corpus(200000)
    assert hashlib.md5(text.encode("latin-1")).hexdigest() == CPP_CORPUS_MD5
    vocab, train, valid = T.make_dataset(text)
    assert vocab == bytes(sorted(set(text.encode("latin-1"))))
    assert train.numel() == 180000 and valid.numel() == 20000
    decoded = bytes(vocab[i] for i in torch.cat([train, valid]).tolist())
    assert decoded == text.encode("latin-1")
    for step, (total, first) in enumerate(CPP_BATCHES):
        b = T.train_batch(train, step, 8, 16, 1, 2, 7)
        assert b.shape == (4, 17)
        assert (int(b.sum()), int(b[0, 0])) == (total, first), step
        # Every world size sees the same global batch: rank r's rows of W ranks.
        whole = T.train_batch(train, step, 8, 16, 0, 1, 7)
        halves = torch.cat([T.train_batch(train, step, 8, 16, r, 2, 7) for r in range(2)])
        quarters = torch.cat([T.train_batch(train, step, 8, 16, r, 4, 7) for r in range(4)])
        assert torch.equal(whole, halves) and torch.equal(whole, quarters)
        assert torch.equal(halves[4:], b)
    w = T.valid_windows(valid, 128, 64)
    assert (w.size(0), int(w.sum())) == CPP_VALID


@pytest.mark.parametrize("steps", [1, 20, 400])
def test_lr_schedule_is_the_cpp_presets(steps):
    T = _example_module()
    # muon::lr_at with warmup max(1, steps/20) from 0, cosine to 0.1 at `steps`.
    warmup = max(1, steps // 20)
    assert T.lr_factor(0, steps) == 0.0
    if warmup < steps:
        assert T.lr_factor(warmup, steps) == pytest.approx(1.0)
    assert T.lr_factor(steps, steps) == pytest.approx(0.1)
    if steps > warmup + 1:
        mid = warmup + (steps - warmup) / 2
        assert T.lr_factor(mid, steps) == pytest.approx(0.55)


# ---- examples/python/torch_muon_program.py: torch.optim.Muon's program, `--muon muon_cpp` changes one import ----

PROGRAM = os.path.join(ROOT, "examples", "python", "torch_muon_program.py")


def _run_program(path, *args):
    env = dict(os.environ, PYTHONPATH=_package_dir())
    proc = subprocess.run([sys.executable, path, "--steps", "40", *args], env=env, capture_output=True,
                          text=True, timeout=300)
    return proc


def _result(proc):
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(lines) == 1, proc.stdout + proc.stderr
    return json.loads(lines[0][len("RESULT "):])


def test_torch_muon_swap_differs_only_in_the_import():
    with open(PROGRAM) as f:
        program = f.read()
    # The switch picks the class in one place (muon_class) and nowhere else:
    # the rest of the program is the same for both.
    assert program.count("args.muon") == 1
    imports = [line.strip() for line in program.splitlines() if line.strip().startswith("from ")
               and line.strip().endswith(" import Muon")]
    assert imports == ["from muon_cpp.compat.torch import Muon", "from torch.optim import Muon"]


def test_torch_muon_swap_trains_and_matches_torch_where_it_has_muon():
    ours = _result(_run_program(PROGRAM, "--muon", "muon_cpp"))
    losses = ours["losses"]
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.6 * losses[0]
    theirs_proc = _run_program(PROGRAM)
    if not hasattr(torch.optim, "Muon"):
        # The original program says so and stops (exit 3).
        assert theirs_proc.returncode == 3 and "no torch.optim.Muon" in theirs_proc.stderr
        return
    theirs = _result(theirs_proc)["losses"]
    # Both run bf16 Newton–Schulz from the same seed: the runs part only by
    # bf16 roundings (a few % of each update), far less than the training's
    # own change of the loss (40 % and more).
    for a, b in zip(losses, theirs):
        assert abs(a - b) <= 0.03 * b, (a, b)
