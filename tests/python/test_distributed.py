"""muon_cpp's distributed layouts from Python, on real processes over gloo.

Each layout's cases run in one start of W processes (a module-scoped fixture;
the parametrized tests check one mode each) through torch.multiprocessing
(forkserver; W = 2, or 4 for the layouts that need a 2 x 2 mesh: the 2-D
TP x sharded layout, and two expert-data-parallel groups of two ranks; the
two share one start). Each rank runs one thread and a real gloo process group
over TCP (torch.distributed.init_process_group, 60 s timeout). The per-rank
bodies are in dist_cases.py: every rank builds the same seeded matrices, keeps
its piece, runs a few steps of a muon_cpp optimizer with the layout and
returns its pieces; rank 0 also runs the single-process optimizer (same
options, no layout) on the whole matrices. The tests reassemble the pieces
here and compare, with the assertion the C++ test of the same layout uses
(tests/test_dist_*.cpp):

- bit-identical (torch.equal) where the layout runs the single-process code on
  the same whole matrix: tensor-parallel 'duplicated'; layer-wise replicas
  are compared with each other bit for bit (the all-gather copies bytes).
- relative error <= 1e-5 (docs/distributed.md's bound) where the layout
  computes the same thing in another summation order: the distributed TP mode
  sums the Gram matrix and the norm over blocks (and may iterate on the long
  side's Gram), row shards go through batched BLAS calls, AdaptiveMuon sums
  its row statistics and norms over the parts, the layer-wise owner runs with
  its own thread count. Each is a few fp32 roundings (2^-24 ~ 6e-8 relative)
  per step, carried through Newton-Schulz's polynomial, whose iterates stay
  O(1), over 3-4 steps: the C++ tests measure <= 1.3e-6, 8x under the bound.
  The measure is the C++ test's: max|p - p_ref| over the largest change the
  single-process optimizer made (TP), or over max|p_ref| (row shards,
  layer-wise). A real error is far larger: Newton-Schulz of a shard or a
  TP block instead of the whole matrix is off by > 1e-2 of the change
  (checked below, so the comparisons could tell).
- blockwise TP equals single-process Muon on each block as its own matrix
  (1e-6 of the change: the same operations on the same data) and is NOT
  whole-matrix Muon (> 1e-2).

A rank's exception fails the test with every failed rank's traceback:
torch.multiprocessing's join sees the rank exit and ends the other ranks; a
deadline (DEADLINE_S) ends ranks that hang. The last test runs dist_cases.py
under real torchrun.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_cases as dc  # noqa: E402
from ranks import DEADLINE_S, free_port, run_ranks  # noqa: E402

import muon_cpp  # noqa: E402,F401  (fails collection when the package is not importable)
from muon_cpp import distributed as mdist  # noqa: E402,F401

FP32_LAYOUT_TOL = 1e-5  # docs/distributed.md's bound; reasoning in the module docstring
BLOCKWISE_TOL = 1e-6  # tests/test_dist_tensor_parallel.cpp: same ops, same data
WRONG_ORTHOGONALIZATION = 1e-2  # what NS on a slice instead of the matrix is off by, at least


def max_abs(t):
    return t.detach().abs().max().item() if t.numel() else 0.0


def rel_to_change(p, ref, p0):
    """max|p - ref| / max|ref - p0|: the error relative to the largest change the
    single-process optimizer made (tests/test_dist_tensor_parallel.cpp)."""
    return max_abs(p - ref) / max_abs(ref - p0)


def rel_to_scale(p, ref, whole):
    """max|p - ref| / max|whole| (tests/test_dist_sharded.cpp, layerwise, make)."""
    return max_abs(p - ref) / max_abs(whole)


def from_rows(shards, rows, m):
    """The matrix of `m` rows from its row shards (rank order), padding dropped."""
    full = torch.cat(shards, 0)
    assert full.shape[0] == sum(rows)
    return full[:m]


def ranks_fixture(case, world, **kwargs):
    """A module-scoped fixture (named by the variable it is assigned to): case's
    results from one start of world ranks (run_ranks)."""
    return pytest.fixture(scope="module")(lambda: run_ranks(case, world, **kwargs))


def mode_results(all_results, mode):
    """Every rank's results of `mode`, with rank 0's row counts and reference."""
    results = [r[mode] for r in all_results]
    return results, results[0]["rows"], results[0]["ref"]


def whole_from_row_shards(results, variant, k, rows, m):
    """Matrix `k` of `m` rows from every rank's row shard of it in `variant`,
    each checked to hold its rank's `rows`."""
    shards = [res["shards"][variant][k] for res in results]
    for r, shard in enumerate(shards):
        assert shard.shape[0] == rows[r], (variant, k, r)
    return from_rows(shards, rows, m)


def check_whole(whole, ref, scale, init, what):
    """`whole` is one process's `ref` within FP32_LAYOUT_TOL relative to `scale`,
    and the optimizer moved it away from `init`."""
    err = max_abs(whole - ref) / scale
    assert err <= FP32_LAYOUT_TOL, what + (err,)
    assert max_abs(whole - init) > 1e-3, what


# ---- the harness ----------------------------------------------------------------------


def test_a_failing_rank_fails_the_test_instead_of_hanging():
    # Rank 0 waits in a barrier that rank 1 never reaches.
    with pytest.raises(AssertionError) as info:
        run_ranks("fail_on_rank_1", 2)
    assert "rank 1 of 2 raised" in str(info.value) and "deliberate failure on rank 1" in str(info.value)


# ---- layer-wise -----------------------------------------------------------------------


LAYERWISE_VARIANTS = [("muon", 2), ("hybrid", 0), ("hybrid", 2), ("make", 2), ("make_lr_schedule", 2)]


layerwise_results = ranks_fixture("layerwise", 2, variants=LAYERWISE_VARIANTS)


@pytest.mark.parametrize("kind,max_in_flight", LAYERWISE_VARIANTS)
def test_layerwise_equals_single_process(layerwise_results, kind, max_in_flight):
    results = [r[(kind, max_in_flight)] for r in layerwise_results]
    ref, init, names = results[0]["ref"], results[0]["init"], results[0]["names"]
    for k, name in enumerate(names):
        # Every rank holds every parameter whole after the all-gather, byte for byte.
        assert torch.equal(results[0]["params"][k], results[1]["params"][k]), name
        # The owner runs the single-process code on the same data; the gather
        # copies bytes. 1e-5 of max|p| leaves room only for BLAS summation order
        # (tests/test_dist_layerwise.cpp).
        assert rel_to_scale(results[0]["params"][k], ref[k], ref[k]) <= FP32_LAYOUT_TOL, name
        assert max_abs(ref[k] - init[k]) > 1e-3, name  # the comparison is not vacuous
    # Each parameter has exactly one owner, the only rank that keeps state for it.
    owned = [set(r["with_state"]) for r in results]
    assert owned[0].isdisjoint(owned[1]), owned
    assert owned[0] | owned[1] == set(range(len(names))), owned
    assert owned[0] and owned[1], "both ranks should own a share: %s" % owned
    if kind == "make_lr_schedule":
        # lr edits through param_groups (StepLR, one group by hand) reach the layout.
        # The schedule changed every parameter far beyond the tolerance.
        for k, name in enumerate(names):
            unscheduled = results[0]["ref_unscheduled"][k]
            assert rel_to_scale(unscheduled, ref[k], ref[k]) > 100 * FP32_LAYOUT_TOL, name


def test_layerwise_ranks_that_disagree_raise_on_every_rank():
    results = run_ranks("layerwise_disagree", 2)
    for r, res in enumerate(results):
        assert res["type"] == "ValueError", (r, res)
        assert "disagree" in res["message"] and "lr" in res["message"], (r, res["message"])


# ---- tensor parallel ------------------------------------------------------------------


TP_MODES = ["duplicated", "distributed", "blockwise"]


tensor_parallel_results = ranks_fixture("tensor_parallel", 2, modes=TP_MODES)


@pytest.mark.parametrize("mode", TP_MODES)
def test_tensor_parallel(tensor_parallel_results, mode):
    world = 2
    results = [r[mode] for r in tensor_parallel_results]
    r0 = results[0]
    init = r0["init"]
    for dim in (0, 1):
        sizes = r0["sizes"][dim]
        for c in range(len(dc.TP_CONFIGS)):
            ref = r0["ref"][c]
            for k, shape in enumerate(dc.TP_SHAPES):
                what = "dim %d config %d matrix %s" % (dim, c, shape)
                blocks = [results[r]["blocks"][(dim, c)][k] for r in range(world)]
                for r in range(world):
                    assert list(blocks[r].shape)[dim] == sizes[k][r], what
                    if sizes[k][r]:  # the step moved the block (the test is not vacuous)
                        assert max_abs(blocks[r] - dc.block_of(init[k], dim, sizes[k], r)) > 1e-3, what
                whole = torch.cat(blocks, dim)
                if mode == "blockwise":
                    for r in range(world):
                        if sizes[k][r] == 0:
                            continue
                        expected = r0["block_ref"][(dim, c, k, r)]
                        p0 = dc.block_of(init[k], dim, sizes[k], r)
                        # Per-block Muon: the same operations on the same data.
                        assert rel_to_change(blocks[r], expected, p0) <= BLOCKWISE_TOL, (what, r)
                    if k == 0:
                        # A different optimizer from whole-matrix Muon, visibly.
                        assert rel_to_change(whole, ref[k], init[k]) > WRONG_ORTHOGONALIZATION, what
                    continue
                err = rel_to_change(whole, ref[k], init[k])
                assert err <= FP32_LAYOUT_TOL, (what, err)
                if mode == "duplicated":
                    # newton_schulz of the gathered whole matrix: the single-process code
                    # on the same data, bit for bit.
                    assert torch.equal(whole, ref[k]), (what, err)


# ---- sharded ---------------------------------------------------------------------------


SHARDED_MODES = ["owner_compute", "replicated"]


sharded_results = ranks_fixture("sharded", 2, modes=SHARDED_MODES)


@pytest.mark.parametrize("mode", SHARDED_MODES)
def test_sharded_equals_single_process(sharded_results, mode):
    results, rows, ref = mode_results(sharded_results, mode)
    r0 = results[0]
    scale = max(max_abs(t) for t in ref)
    assert any(0 in rs for rs in rows) and any(sum(rs) > s[0] for rs, (s, _) in zip(rows, dc.SHARDED_MODEL))
    for in_flight in (0, 2):
        for k, (shape, split) in enumerate(dc.SHARDED_MODEL):
            whole = whole_from_row_shards(results, in_flight, k, rows[k], shape[0])
            # The owner runs newton_schulz on the same whole matrix as one process;
            # momentum and the update are element-wise (bound: module docstring).
            check_whole(whole, ref[k], scale, dc.sharded_param(k, shape), (mode, in_flight, k, shape, split))
    # Orthogonalizing rank 0's rows alone (the DeepSpeed bug) would be caught.
    # (Relative to the change the optimizer made, as the blockwise TP check.)
    rows0 = rows[0][0]
    p0 = dc.sharded_param(0, dc.SHARDED_MODEL[0][0])[:rows0]
    assert rel_to_change(r0["slice_ref"][:rows0], ref[0][:rows0], p0) > WRONG_ORTHOGONALIZATION


def test_sharded_gradient_on_some_ranks_only_raises_on_every_rank():
    results = run_ranks("sharded_gradient_on_one_rank", 2)
    for r, res in enumerate(results):
        assert res["type"] == "ValueError" and "gradient" in res["message"], (r, res)
        # The check runs before any change: no parameter moved, no state made.
        assert res["unchanged"] and res["state"] == 0, (r, res)


# One start of 4 processes for both 2 x 2 layouts.
mesh4_results = ranks_fixture("mesh4", 4)


def test_sharded_expert_groups(mesh4_results):
    # Two expert-data-parallel groups of two ranks each (a 2 x 2 expert mesh):
    # the dense matrices shard over the world, each group's experts over it.
    world = 4
    results = [r["experts"] for r in mesh4_results]
    ref = results[0]["ref"]
    seen = set()
    for k, (shape, split) in enumerate(dc.EXPERT_ALL):
        holders = [r for r in range(world) if k in results[r]["ids"]]
        dense = k < len(dc.EXPERT_DENSE)
        assert holders == (list(range(world)) if dense else [2 * ((k - 2) // 2), 2 * ((k - 2) // 2) + 1]), k
        rows = results[holders[0]]["rows"][k]
        shards = [results[r]["shards"][results[r]["ids"].index(k)] for r in holders]
        whole = from_rows(shards, rows, shape[0])
        # As the dense case: the owner orthogonalizes the whole matrix.
        check_whole(whole, ref[k], max_abs(ref[k]), dc.sharded_param(k, shape), (k, shape, split))
        seen.add(k)
    assert seen == set(range(len(dc.EXPERT_ALL)))


def test_stacked_experts_over_their_expert_group(mesh4_results):
    # Row shards of a stack over the expert group: each rank orthogonalizes its
    # whole experts (2 and 1) alone; together they are one process's stacked
    # Muon (a slice-wise or whole-stack result would be far from it) ...
    results = [r["experts"] for r in mesh4_results]
    ref, init = results[0]["stack_ref"], results[0]["stack_init"]
    for g, members in ((0, [0, 1]), (1, [2, 3])):
        whole = torch.cat([results[r]["row_stack"] for r in members])
        assert rel_to_scale(whole, ref[g][0], ref[g][0]) <= FP32_LAYOUT_TOL, g
        assert max_abs(whole - init[g]) > 1e-3, g
    # ... and the layer-wise layout over the expert group runs them: each group's
    # stacks (3 experts, batched Newton-Schulz) equal one process's stacked Muon,
    # identical on the group's two ranks.
    for g, members in ((0, [0, 1]), (1, [2, 3])):
        for k in range(2):
            a, b = (results[r]["stacks"][k] for r in members)
            assert torch.equal(a, b), (g, k)
            assert rel_to_scale(a, ref[g][k], ref[g][k]) <= FP32_LAYOUT_TOL, (g, k)
            assert max_abs(a - init[g] * (1.0 if k == 0 else 0.5)) > 1e-3, (g, k)


def test_two_dimensional_tensor_parallel_inside_sharded(mesh4_results):
    # (dp 2, tp 2) mesh: TP groups {0, 1}, {2, 3}; DP groups {0, 2}, {1, 3}.
    results = [r["two_d"] for r in mesh4_results]
    r0 = results[0]
    ref = r0["ref"]
    for mode in dc.TWO_D_MODES:
        for k, (shape, dim, split) in enumerate(dc.TWO_D_MODEL):
            sizes = dc.two_d_block_sizes(k)
            blocks = []
            for t in range(2):
                rows = dc.two_d_rows(k, t)
                shards = [results[2 * d + t]["shards"][mode][k] for d in range(2)]
                block_rows = sizes[t] if dim == 0 else shape[0]
                block = from_rows(shards, rows, block_rows)
                expected = r0["block_ref"][(k, t)] if mode == "blockwise" else dc.two_d_block(ref[k], k, t)
                # As the 1-D layouts (tests/test_dist_sharded.cpp, TwoDimensional).
                err = max_abs(block - expected) / max_abs(ref[k])
                assert err <= FP32_LAYOUT_TOL, (mode, k, shape, t, err)
                blocks.append(block)
            if mode == "duplicated":
                whole = torch.cat(blocks, dim)
                assert max_abs(whole - dc.sharded_param(k, shape)) > 1e-3, k
        if mode == "blockwise":
            # The check above could tell blockwise from whole-matrix Muon.
            # (Relative to the change the optimizer made, as in the 1-D TP test.)
            t0 = dc.two_d_block(ref[0], 0, 0)
            p0 = dc.two_d_block(dc.sharded_param(0, dc.TWO_D_MODEL[0][0]), 0, 0)
            assert rel_to_change(r0["block_ref"][(0, 0)], t0, p0) > WRONG_ORTHOGONALIZATION


def test_layerwise_over_data_parallel_subgroups(mesh4_results):
    # Two DP groups {0, 2} and {1, 3} (torch.distributed.new_group), each with its
    # own replicated model: each equals one process on its model, as the
    # world-group layer-wise test, and its two ranks own disjoint halves.
    results = [r["layerwise_subgroups"] for r in mesh4_results]
    ref, init = results[0]["ref"], results[0]["init"]
    for g, members in ((0, [0, 2]), (1, [1, 3])):
        assert [results[r]["group"] for r in members] == [g, g]
        for k, (name, _) in enumerate(dc.MATRICES):
            a, b = (results[r]["params"][k] for r in members)
            assert torch.equal(a, b), (g, name)
            assert rel_to_scale(a, ref[g][k], ref[g][k]) <= FP32_LAYOUT_TOL, (g, name)
            assert max_abs(ref[g][k] - init[g][k]) > 1e-3, (g, name)
        owned = [set(results[r]["with_state"]) for r in members]
        assert owned[0].isdisjoint(owned[1]) and owned[0] | owned[1] == set(range(len(dc.MATRICES))), owned
    # The groups trained different models (the comparison tells them apart).
    assert max_abs(ref[0][0] - ref[1][0]) > 1e-2


ADAPTIVE_MODES = ["normuon", "adamuon"]


adaptive_results = ranks_fixture("adaptive_sharded", 2, adaptive_modes=ADAPTIVE_MODES)


@pytest.mark.parametrize("adaptive_mode", ADAPTIVE_MODES)
def test_adaptive_muon_sharded(adaptive_results, adaptive_mode):
    world = 2
    results, rows, ref = mode_results(adaptive_results, adaptive_mode)
    for sharded_mode in ("owner_compute", "replicated"):
        for k, shape in enumerate(dc.ADAPTIVE_SHAPES):
            whole = whole_from_row_shards(results, sharded_mode, k, rows[k], shape[0])
            # Only the order of fp32 sums differs (Gram, norm, row means and the
            # stage's two norms summed over parts): a stage using a part's own
            # statistics would be off by ~1e-3 (tests/test_dist_adaptive.cpp).
            check_whole(whole, ref[k], max_abs(ref[k]), dc.adaptive_param(k),
                        (adaptive_mode, sharded_mode, k, shape))
            for r in range(world):
                if rows[k][r] == 0:
                    continue
                # The second moment lives with this rank's rows (padding included):
                # one value per row (normuon) or per element (adamuon) of the shard.
                sm = results[r]["second_moment_shapes"][sharded_mode][k]
                assert sm is not None and sm[0] == rows[k][r], (sharded_mode, k, r, sm)
                if adaptive_mode == "adamuon":
                    assert tuple(sm) == (rows[k][r], shape[1]), (sharded_mode, k, r, sm)
                else:
                    assert all(d == 1 for d in sm[1:]), (sharded_mode, k, r, sm)


# ---- save / load ----------------------------------------------------------------------


def test_save_load_per_rank_resumes_bit_identically():
    # docs/distributed.md: a run saved after k steps (this rank's state_dict,
    # through torch.save/torch.load), loaded into a fresh optimizer with the same
    # layout and continued equals the uninterrupted run bit for bit.
    results = run_ranks("save_load", 2)
    for r, res in enumerate(results):
        for kind, run in res.items():
            for k, (a, b) in enumerate(zip(run["straight"], run["resumed"])):
                assert torch.equal(a, b), (kind, "rank %d" % r, "param %d" % k)
            assert run["state_entries"] > 0, (kind, r)
    # Layer-wise: each rank saves the state of the parameters it owns (3 in all).
    assert sum(res["layerwise"]["state_entries"] for res in results) == 3


# ---- torchrun ------------------------------------------------------------------------


def test_torchrun_training_script():
    """dist_cases.py under `python -m torch.distributed.run` with 2 ranks: gloo from
    torchrun's environment, the layer-wise layout through make_optimizer."""
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(muon_cpp.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in [env.get("PYTHONPATH")] if p])
    env["MUON_TIMEOUT"] = "60"
    # muon_cpp.torchrun: torchrun, with the classic TCPStore where torch has no
    # libuv (Debian 13's 2.6 cannot start a job otherwise; docs/python.md).
    cmd = [sys.executable, "-m", "muon_cpp.torchrun", "--nproc_per_node", "2",
           "--master_port", str(free_port()), "--monitor_interval", "0.5",
           # No --redirects/--tee: Debian's torchrun 1.13 on Python 3.11
           # crashes with their defaults, and muon_cpp.torchrun supplies
           # values that work there (this runs that path on 1.13).
           os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_cases.py")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    results = {}
    for line in proc.stdout.splitlines():
        if "RESULT " in line:
            res = json.loads(line.split("RESULT ", 1)[1])
            results[res["rank"]] = res
    assert sorted(results) == [0, 1], output
    r0, r1 = results[0], results[1]
    assert r0["world"] == 2
    # Replicated parameters stay identical on every rank, byte for byte.
    assert r0["digest"] == r1["digest"]
    # Each parameter has one owner, the only rank with state for it.
    assert r0["with_state"] and r1["with_state"], (r0["with_state"], r1["with_state"])
    assert sorted(r0["with_state"] + r1["with_state"]) == sorted(r0["names"]), (r0, r1)
    # It trains: the full-batch loss fell.
    assert r0["losses"][-1] < 0.5 * r0["losses"][0], r0["losses"]
    # It is one process's training: the same gradients ((g0 + g1) / 2 both ways)
    # and the same optimizer code on each parameter's owner (bound as above).
    assert r0["max_rel_diff"] <= FP32_LAYOUT_TOL, r0
    for a, b in zip(r0["losses"], r0["ref_losses"]):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (r0["losses"], r0["ref_losses"])
