"""muon_cpp over FSDP2 (torch.distributed.fsdp.fully_shard), on real gloo processes.

The parameters FSDP2 hands the optimizer are DTensors with a Shard(0)
placement; a muon_cpp optimizer runs the sharded (owner-compute) layout on
their local rows, reading each matrix's global shape and process group from
the DTensor. Bodies in fsdp2_cases.py; the harness (real processes, every
failed rank's traceback, a deadline) in ranks.py.

Tolerance: 1e-5 of max|p| (docs/distributed.md's bound for the sharded
layout, tests/test_distributed.py's FP32_LAYOUT_TOL). Against one process
the differences are fp32 summation orders: FSDP2 sums the ranks' gradients
in a reduce-scatter where the reference sums the whole batch in one
backward, and the owner orthogonalizes through batched BLAS calls. Each is
a few roundings (2^-24 relative) per step, carried through Newton-Schulz
over 5 steps; a real error is far larger: orthogonalizing a row shard
instead of the whole matrix moves the update by > 1e-2 of it
(tests/test_distributed.py checks that bound for the same layout).

Needs torch with FSDP2 (fully_shard in torch.distributed.fsdp, torch >=
2.6): the torch 2.6 suite (scripts/test-torch2.sh) runs these; on torch 1.13
the module is skipped, naming the version.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except Exception:  # noqa: BLE001 - ImportError, or 1.13's FSDP failing on Python 3.11
    pytest.skip("FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6; this torch is %s"
                % torch.__version__, allow_module_level=True)

import fsdp2_cases as fc  # noqa: E402
from ranks import run_ranks  # noqa: E402

TOL = 1e-5
KINDS = ["hybrid", "muon"]


def max_abs(t):
    return t.abs().max().item() if t.numel() else 0.0


def rel(p, ref):
    return max_abs(p - ref) / max_abs(ref)


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def trained(request):
    # Both kinds in one start of the ranks: a model and optimizer each, one
    # after the other over the same process group.
    world = request.param
    return world, run_ranks("fsdp2_train", world, kinds=KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_fully_sharded_training_equals_one_process(trained, kind):
    world, results = trained
    r0 = results[0][kind]
    ref = r0["ref"]
    for name, p in r0["params"].items():
        # Every rank gathers the same parameters.
        for r in range(1, world):
            assert torch.equal(results[r][kind]["params"][name], p), (name, r)
        if kind == "muon" and (name.endswith("bias") or name.startswith("embed")):
            assert torch.equal(p, r0["init"][name]), name  # not in the optimizer
            continue
        assert max_abs(ref["params"][name] - r0["init"][name]) > 1e-3, name  # not vacuous
        assert rel(p, ref["params"][name]) <= TOL, (name, rel(p, ref["params"][name]))
    for a, b in zip(r0["losses"], ref["losses"]):
        assert abs(a - b) <= TOL * max(1.0, abs(b)), (r0["losses"], ref["losses"])
    expect_state_equal(r0["full_state"], ref["state"])


def expect_state_equal(state, ref):
    """The optimizer state, gathered, against the single-process run's. Muon's
    and AdamW's updates do not change when every gradient is scaled by the
    same factor (orthogonalization and m/sqrt(v) undo it); their momentum
    and moments do: this is what shows FSDP2 averaged the gradients."""
    assert set(state) == set(ref)
    for name, s in state.items():
        assert set(s) == set(ref[name]), (name, s.keys(), ref[name].keys())
        for key, v in s.items():
            if key == "step":
                assert v == ref[name][key], (name, v, ref[name][key])
            else:
                assert rel(v, ref[name][key]) <= TOL, (name, key, rel(v, ref[name][key]))


@pytest.mark.parametrize("kind", KINDS)
def test_shards_are_uneven_and_state_is_dtensor_like_the_parameter(trained, kind):
    world, results = trained
    rows = [results[r][kind]["local_rows"] for r in range(world)]
    # fc1 (10 rows) is uneven at 4 ranks; fc2 (3 rows) leaves rank 3 empty.
    assert [rs["fc1.weight"] for rs in rows] == ([5, 5] if world == 2 else [3, 3, 3, 1])
    if world == 4:
        assert [rs["fc2.weight"] for rs in rows] == [1, 1, 1, 0]
    for r in range(world):
        state = results[r][kind]["state"]
        for name, s in state.items():
            stepped = kind == "hybrid" or not (name.endswith("bias") or name.startswith("embed"))
            assert bool(s) == stepped, (r, name, s)
            for key, (typ, same_placement, shape) in s.items():
                if key == "step":
                    assert shape == fc.STEPS, (r, name, s)
                    continue
                # A DTensor over this rank's rows, with the parameter's placements
                # and global shape: what torch.distributed.checkpoint reshards.
                assert typ == "DTensor" and same_placement, (r, name, key, s)
                assert shape == tuple(results[0][kind]["params"][name].shape), (r, name, key)
    # Optimizer state is split across ranks, by rows: the ranks' bytes add up to
    # the whole state, fp32 momentum of every Muon matrix (plus AdamW's two
    # moments in the hybrid).
    params = results[0][kind]["params"]
    whole = 0
    for name, p in params.items():
        if kind == "muon":
            whole += 4 * p.numel() if p.dim() == 2 and not name.startswith("embed") else 0
        else:
            muon = p.dim() == 2 and name.startswith("fc")
            whole += 4 * p.numel() * (1 if muon else 2)
    assert sum(results[r][kind]["state_bytes"] for r in range(world)) == whole


def test_hybrid_sharding_equals_one_process():
    # HSDP on a (2 replicas) x (2 shards) mesh: placements (Replicate(), Shard(0));
    # each replica pair runs the sharded layout over its shard group, FSDP
    # averages the gradients over all four ranks.
    results = run_ranks("fsdp2_train", 4, kinds=["hybrid"], mesh_shape=(2, 2))
    r0 = results[0]["hybrid"]
    rows = [results[r]["hybrid"]["local_rows"]["fc1.weight"] for r in range(4)]
    assert rows == [5, 5, 5, 5], rows  # 10 rows over the 2 shards of each replica
    for name, p in r0["params"].items():
        for r in range(1, 4):
            assert torch.equal(results[r]["hybrid"]["params"][name], p), (name, r)
        assert rel(p, r0["ref"]["params"][name]) <= TOL, (name, rel(p, r0["ref"]["params"][name]))
    expect_state_equal(r0["full_state"], r0["ref"]["state"])
    # Each replica holds the whole state once: the four ranks hold it twice.
    assert sum(results[r]["hybrid"]["state_bytes"] for r in range(4)) == 2 * sum(
        results[r]["hybrid"]["state_bytes"] for r in range(2))


def test_checkpoint_at_4_ranks_resumes_at_2_on_the_same_curve(tmp_path):
    path = str(tmp_path / "ckpt")
    saved = run_ranks("fsdp2_save", 4, kind="hybrid", steps=3, path=path)
    resumed = run_ranks("fsdp2_resume", 2, kind="hybrid", first_step=3, steps=3, path=path)
    r0 = resumed[0]
    ref = r0["ref"]
    for name, p in saved[0]["params"].items():
        # The model comes back bit for bit; the optimizer state too (checked by
        # the continued curve below, and by its step counters).
        assert torch.equal(r0["loaded"][name], p), name
        assert r0["steps_after_load"][name] == 3, (name, r0["steps_after_load"])
    for name, p in r0["params"].items():
        assert torch.equal(resumed[1]["params"][name], p), name
        assert max_abs(p - saved[0]["params"][name]) > 1e-3, name  # it trained after loading
        assert rel(p, ref["params"][name]) <= TOL, (name, rel(p, ref["params"][name]))
    # The losses continue the single-process curve of 6 steps.
    curve = saved[0]["losses"] + r0["losses"]
    for a, b in zip(curve, ref["losses"]):
        assert abs(a - b) <= TOL * max(1.0, abs(b)), (curve, ref["losses"])


def test_a_fresh_optimizer_loaded_without_its_state_would_not_continue_the_curve(tmp_path):
    # The comparison above can tell: restarting the optimizer (momentum and
    # AdamW moments lost) after the same 3 steps ends far from the reference.
    path = str(tmp_path / "ckpt")
    run_ranks("fsdp2_save", 2, kind="hybrid", steps=3, path=path)
    fresh = run_ranks("fsdp2_resume", 2, kind="hybrid", first_step=3, steps=3, path=path,
                      load_optimizer=False)
    r0 = fresh[0]
    worst = max(rel(p, r0["ref"]["params"][n]) for n, p in r0["params"].items())
    assert worst > 100 * TOL, worst


def test_unsupported_placements_and_layouts_are_refused_by_name():
    results = run_ranks("fsdp2_errors", 2)
    for r, out in enumerate(results):
        assert out["ok"] is None, (r, out)
        assert out["layerwise"] and "Layerwise cannot step DTensor (FSDP2) parameters" in out["layerwise"]
        for key in ("shard1", "replicate"):
            msg = out[key]
            assert msg and msg.startswith("ValueError") and "parameter 'w'" in msg, (r, key, msg)
            assert "placements (%s)" % ("Shard(dim=1)" if key == "shard1" else "Replicate()") in msg, msg
            assert len(msg) < 400, msg


def test_twenty_models_and_optimizers_built_one_after_another_over_one_group():
    # The pattern of a sweep or an evaluation loop: a new FSDP2 model and a new
    # optimizer over the same process group, again and again. A rank whose
    # c10d worker frees a collective's output needs the GIL; the optimizer's
    # construction runs collectives, and holding the GIL through them
    # deadlocked that rank (within a few rounds at 4 ranks on 2 cores).
    rounds = 20
    results = run_ranks("fsdp2_rebuild", 4, rounds=rounds)
    assert [len(r) for r in results] == [rounds] * 4
    for i in range(rounds):
        kind = results[0][i]["kind"]
        first = results[0][i]["params"]
        for r in range(1, 4):
            assert results[r][i]["kind"] == kind
            assert results[r][i]["losses"] == results[0][i]["losses"], (i, r)
            for name, p in first.items():
                assert torch.equal(results[r][i]["params"][name], p), (i, r, name)
    # Each round starts from the same seeded model at a different batch: the
    # rounds really trained (their losses differ).
    assert len({round(res["losses"][0], 6) for res in results[0]}) > 1


def test_average_on_gloo_is_an_average_synchronous_or_not():
    # Every op returns the mean of the ranks' inputs. Tolerance: the engine
    # sums W = 2 fp32 values and divides by 2 (exact), the reference takes
    # torch.stack(...).mean(0): the same one rounding of the sum, so at most
    # an ulp of the largest |x|.
    results = run_ranks("fsdp2_average", 2)
    for r, res in enumerate(results):
        for mode in ("sync", "async"):
            for op, (got, want) in res[mode].items():
                ulp = 2.0 ** -23 * max(want.abs().max().item(), 1e-30)
                assert (got - want).abs().max().item() <= ulp, (r, mode, op, got, want)
