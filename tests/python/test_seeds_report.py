"""examples/train_gpt/seeds_report.py: steps and wall time to the baseline's
final loss over seeds, from muon-train-gpt's CSV logs.

The logs are written by hand so that every ratio is known in closed form:
linear interpolation between two evaluations, as the job's own table does.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "train_gpt", "seeds_report.py")
HEADER = "step,tokens,train_loss,valid_loss,seconds,optimizer_seconds\n"


def write(path, rows):
    """rows: (step, valid_loss, seconds, optimizer_seconds)."""
    with open(path, "w") as f:
        f.write(HEADER)
        for step, loss, sec, opt in rows:
            f.write(f"{step},{step * 100},{loss},{loss},{sec},{opt}\n")


def report(out, *extra):
    done = subprocess.run([sys.executable, SCRIPT, str(out), *extra], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {line.split()[0]: line for line in done.stdout.splitlines()[2:] if line and not line.startswith("plot")}


def test_ratios_interpolate_between_evaluations_and_average_over_seeds(tmp_path):
    # Seed 1: adamw ends at 2.0 at step 100 (50 s); muon passes 2.0 halfway
    # between steps 20 (loss 2.5, 12 s) and 40 (loss 1.5, 24 s): step 30 and
    # 18 s, so 0.30x the steps and 0.36x the time.
    s1 = tmp_path / "seed-1"
    s1.mkdir()
    write(s1 / "adamw.csv", [(0, 4.0, 0, 0), (50, 3.0, 25, 1), (100, 2.0, 50, 2)])
    write(s1 / "muon.csv", [(0, 4.0, 0, 0), (20, 2.5, 12, 2), (40, 1.5, 24, 4), (100, 1.0, 60, 10)])
    # Seed 2: adamw ends at 2.2 (step 100, 40 s); muon reaches 2.2 at
    # evaluation step 50 (28 s) exactly: 0.50x steps, 0.70x time.
    s2 = tmp_path / "seed-2"
    s2.mkdir()
    write(s2 / "adamw.csv", [(0, 4.0, 0, 0), (100, 2.2, 40, 2)])
    write(s2 / "muon.csv", [(0, 4.0, 0, 0), (50, 2.2, 28, 5), (100, 1.2, 60, 10)])
    # seeds.sh writes each seed's log beside its directory: not a seed.
    (tmp_path / "seed-1.log").write_text("muon-train-gpt: 2 rank(s) on cpu\n")
    rows = report(tmp_path)
    assert set(rows) == {"muon", "adamw"}
    muon = rows["muon"]
    assert "0.40x (0.30..0.50)" in muon, muon  # steps: mean of 0.30 and 0.50
    assert "0.53x (0.36..0.70)" in muon, muon  # time: mean of 0.36 and 0.70
    assert "1.1000±0.1000" in muon, muon  # final losses 1.0 and 1.2
    assert " 600 " in muon, muon  # ms/step: 60 s / 100 steps in both seeds
    assert "16.7%" in muon, muon  # optimizer share 10/60
    adamw = rows["adamw"]
    assert "1.00x (1.00..1.00)" in adamw, adamw
    assert (tmp_path / "seeds.png").stat().st_size > 10000


def test_a_run_that_never_reaches_the_target_is_counted_missed(tmp_path):
    seed = tmp_path / "seed-1"
    seed.mkdir()
    write(seed / "adamw.csv", [(0, 4.0, 0, 0), (10, 2.0, 5, 1)])
    write(seed / "lion.csv", [(0, 4.0, 0, 0), (10, 3.0, 5, 1)])
    rows = report(tmp_path)
    assert "not reached (1 missed)" in rows["lion"], rows["lion"]


def test_no_seed_directories_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip() == f"seeds_report: no {tmp_path}/seed-*/ directories"
