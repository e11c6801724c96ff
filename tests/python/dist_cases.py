"""Per-rank bodies of tests/python/test_distributed.py, and a tiny training script.

Each case runs on every rank of a real gloo process group (processes started
by the test with torch.multiprocessing, one thread each), builds the same
seeded matrices as every other rank, keeps this rank's piece (the whole
tensor for the layer-wise layout, a tensor-parallel block, a row shard, or a
row shard of a TP block), runs a few steps of a muon_cpp optimizer with the
layout and returns its pieces. Rank 0 also runs the single-process optimizer
(no layout, no communication) on the whole matrices in the same kind of
process and returns that reference; the test reassembles the pieces in the
parent and compares. The data and splits follow the C++ tests
(tests/test_dist_*.cpp) case by case.

Run as a script (`python -m torch.distributed.run --nproc_per_node 2 dist_cases.py`)
it trains a small MLP with the layer-wise layout and prints one `RESULT {json}`
line per rank (test_distributed.py::test_torchrun_training_script).
"""
import json
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=60)

# ---- data, identical on every rank --------------------------------------------------


def randn(shape, seed):
    """Standard-normal fp32 tensor from its own generator: the same on every rank."""
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(list(shape), generator=gen, dtype=torch.float32)


def uneven_sizes(total, world):
    """tests/tensor_parallel_util.h: rank r gets a share ~ r + 1, the last the rest
    (24 over 2 ranks: 8, 16)."""
    weight_sum = world * (world + 1) // 2
    sizes = [max(1, total * (r + 1) // weight_sum) for r in range(world - 1)]
    sizes.append(total - sum(sizes))
    return sizes


def balanced_sizes(total, parts):
    """muon::distributed::balanced_split_sizes: the first total % parts blocks one larger."""
    sizes = [total // parts] * parts
    for i in range(total % parts):
        sizes[i] += 1
    return sizes


def split_rows(m, world, split):
    """Rows per rank (tests/test_dist_sharded.cpp): balanced, padded (equal chunks,
    the tail is padding past the end) or first (every other rank empty)."""
    if split == "balanced":
        return balanced_sizes(m, world)
    if split == "padded":
        return [(m + world - 1) // world] * world
    if split == "first":
        return [m] + [0] * (world - 1)
    raise ValueError(split)


def block_of(whole, dim, sizes, rank):
    """Rank `rank`'s block (sizes along `dim`) of `whole`, contiguous."""
    return whole.narrow(dim, sum(sizes[:rank]), sizes[rank]).contiguous()


def local_rows(full, rows, rank):
    """muon::distributed::local_rows: this rank's rows of `full`, zero rows past the end."""
    offset, count = sum(rows[:rank]), rows[rank]
    out = torch.zeros([count] + list(full.shape[1:]), dtype=full.dtype)
    end = min(offset + count, full.shape[0])
    if end > offset:
        out[: end - offset] = full[offset:end]
    return out


def leaf(t):
    return t.clone().requires_grad_(True)


def pieces(params):
    return [p.detach().clone() for p in params]


def run_steps(opt, params, grad_of, steps, after_step=None):
    """`steps` steps; grad_of(k, s) is parameter k's gradient at step s;
    after_step(opt, s) runs after step s (an lr schedule)."""
    for s in range(steps):
        for k, p in enumerate(params):
            p.grad = grad_of(k, s)
        opt.step()
        if after_step is not None:
            after_step(opt, s)


def single_process(make_opt, inits, grad_of, steps, after_step=None):
    """The reference: the same optimizer without a layout on the whole tensors."""
    params = [leaf(t) for t in inits]
    run_steps(make_opt(params), params, grad_of, steps, after_step)
    return pieces(params)


# ---- the rank entry point ----------------------------------------------------------


def run_rank(rank, world, port, case, outdir, kwargs):
    """torch.multiprocessing entry point: one gloo process group over TCP, the case,
    its result saved to outdir/rank<r>.pt. An exception is written to
    outdir/rank<r>.err and propagates (the parent's join sees the rank fail and
    ends the other ranks)."""
    torch.set_num_threads(1)
    # MUON_TIMEOUT: the engine's own wait on a collective, as gloo's (seconds).
    # USE_LIBUV=0: the classic TCPStore, which every torch has (torch 2.4+
    # defaults to libuv, which Debian's 2.6 was built without).
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), MUON_TIMEOUT=str(int(TIMEOUT.total_seconds())),
                      USE_LIBUV="0")
    # For the parent's message: the first rank to fail is the cause; the
    # others usually fail after it (connection closed by peer). A rank writes
    # its error before it leaves the process group: leaving resets the other
    # ranks' connections, and the parent ends every rank once one has failed.
    err = os.path.join(outdir, "rank%d.err" % rank)

    def record_error():
        if not os.path.exists(err):
            with open(err, "w") as f:
                f.write(traceback.format_exc())

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=TIMEOUT)
        try:
            if case.startswith("fsdp2_"):
                import fsdp2_cases  # torch >= 2.4 only
                result = fsdp2_cases.CASES[case](rank, world, **kwargs)
            else:
                result = CASES[case](rank, world, **kwargs)
            torch.save(result, os.path.join(outdir, "rank%d.pt" % rank))
            # Every rank is done with the group before any leaves it: a case
            # whose last collective returns on one rank first (a single
            # all_reduce) otherwise tears down gloo's pairs under the other.
            dist.barrier()
        except BaseException:
            record_error()
            raise
        finally:
            dist.destroy_process_group()
    except BaseException:
        record_error()
        raise


# ---- layer-wise ---------------------------------------------------------------------

# tests/test_dist_layerwise.cpp's model: hidden matrices for Muon; embedding,
# head, norm gains and a bias for AdamW (the hybrid's default routing).
HYBRID_MODEL = [
    ("wte.weight", (40, 16)), ("blocks.0.qkv.weight", (48, 16)),
    ("blocks.0.proj.weight", (16, 16)), ("blocks.0.norm.weight", (16,)),
    ("blocks.0.fc1.weight", (64, 16)), ("blocks.0.fc1.bias", (64,)),
    ("blocks.0.fc2.weight", (16, 64)), ("blocks.1.qkv.weight", (48, 16)),
    ("blocks.1.fc2.weight", (16, 64)), ("lm_head.weight", (40, 16)),
]
MATRICES = [(n, s) for n, s in HYBRID_MODEL if len(s) == 2 and n.startswith("blocks.")]
LAYERWISE_STEPS = 4
SMALL_BUCKET_MB = 4096 / 2.0 ** 20  # 4 KiB buckets: several per rank, as the C++ test


def layerwise_config(layout):
    """tests/test_dist_make.cpp's config: a rule gives qkv its own lr."""
    return {
        "optimizer": "muon", "lr": 0.02, "weight_decay": 0.1, "layout": layout,
        "muon_scale_mode": "shape_scaling",
        "overrides": [{"match": {"name": "*.qkv.*"}, "set": {"lr": 0.01}}],
    }


def case_layerwise(rank, world, variants):
    """Every (kind, max_in_flight) of `variants`, by variant."""
    return {v: layerwise_run(rank, world, *v) for v in variants}


def lr_schedule():
    """after_step for run_steps: torch.optim.lr_scheduler.StepLR halving every lr after
    each step, and the last param group's lr alone times 0.3 after step 1 (an
    edit of one group's dict): param_groups edits reach the layout's groups."""
    scheds = {}

    def after_step(opt, s):
        if id(opt) not in scheds:
            scheds[id(opt)] = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        scheds[id(opt)].step()
        if s == 1:
            opt.param_groups[-1]["lr"] *= 0.3
    return after_step


def layerwise_run(rank, world, kind, max_in_flight):
    """kind: muon (matrices only), hybrid (MuonWithAdamW, named), make (make_optimizer
    with a config whose layout is layerwise), or make_lr_schedule (make with an
    lr schedule and a one-group lr edit)."""
    import muon_cpp
    from muon_cpp import distributed as mdist

    model = MATRICES if kind == "muon" else HYBRID_MODEL
    names = [n for n, _ in model]
    inits = [randn(s, 1000 + i) for i, (_, s) in enumerate(model)]

    def grad_of(k, s):  # already averaged over the ranks (the same everywhere)
        return randn(model[k][1], 7919 * (s + 1) + k)

    def build(params, layout):
        if kind == "muon":
            return muon_cpp.Muon(params, lr=0.02, weight_decay=0.1, layout=layout)
        named = list(zip(names, params))
        if kind == "hybrid":
            return muon_cpp.MuonWithAdamW(named, lr=0.02, weight_decay=0.1, adamw_lr=1e-2,
                                          adamw_weight_decay=0.1, layout=layout)
        return muon_cpp.make_optimizer(
            named, layerwise_config("layerwise" if layout is not None else "none"), layout=layout)

    params = [leaf(t) for t in inits]
    layout = mdist.Layerwise(dist.group.WORLD, bucket_mb=SMALL_BUCKET_MB, max_in_flight=max_in_flight)
    opt = build(params, layout)
    schedule = lr_schedule() if kind == "make_lr_schedule" else None
    run_steps(opt, params, grad_of, LAYERWISE_STEPS, schedule)
    # Only the owner of a parameter builds state for it.
    with_state = [k for k, p in enumerate(params) if len(opt.state.get(p, {})) > 0]
    out = {"params": pieces(params), "names": names, "with_state": with_state}
    if rank == 0:
        out["ref"] = single_process(lambda ps: build(ps, None), inits, grad_of, LAYERWISE_STEPS,
                                    lr_schedule() if schedule else None)
        out["init"] = inits
        if schedule:  # the schedule changed the result (the comparison can tell)
            out["ref_unscheduled"] = single_process(lambda ps: build(ps, None), inits, grad_of,
                                                    LAYERWISE_STEPS)
    return out


def case_layerwise_disagree(rank, world):
    """Ranks built with different lr: every rank must raise ValueError (the layout's
    agreement check), none may hang or train apart."""
    import muon_cpp
    from muon_cpp import distributed as mdist

    params = [leaf(randn((16, 8), 3))]
    try:
        opt = muon_cpp.Muon(params, lr=0.02 if rank == 0 else 0.01,
                            layout=mdist.Layerwise(dist.group.WORLD))
        params[0].grad = randn((16, 8), 4)
        opt.step()
    except Exception as e:  # noqa: BLE001 - the test checks type and message
        return {"type": type(e).__name__, "message": str(e)}
    return {"type": None, "message": ""}


# ---- tensor parallel ----------------------------------------------------------------

# tests/test_dist_tensor_parallel.cpp: a wide and a tall matrix (both Gram sides
# occur), uneven blocks; plus a 3x8 matrix whose block is empty on the last rank.
TP_SHAPES = [(24, 40), (40, 24), (3, 8)]
TP_STEPS = 4
TP_CONFIGS = [
    dict(lr=0.05, momentum=0.9, nesterov=True, scale_mode="shape_scaling", weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, nesterov=False, scale_mode="spectral", weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, nesterov=True, scale_mode="unit_rms_norm", weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, nesterov=False, scale_mode="match_rms_adamw", weight_decay=0.01),
]


def tp_initial(k):
    return randn(TP_SHAPES[k], k + 5) * 0.1


def tp_gradient(k, s):
    return randn(TP_SHAPES[k], 1000 * s + k + 17)


def tp_sizes(k, dim, world):
    n = TP_SHAPES[k][dim]
    if k == 2:  # everything on the first ranks, the last rank's block empty
        return balanced_sizes(n, world - 1) + [0]
    return uneven_sizes(n, world)


def case_tensor_parallel(rank, world, modes):
    return {mode: tensor_parallel_run(rank, world, mode) for mode in modes}


def tensor_parallel_run(rank, world, mode):
    import muon_cpp
    from muon_cpp import distributed as mdist

    group = dist.group.WORLD
    out = {"blocks": {}, "sizes": {}}
    for dim in (0, 1):
        sizes = [tp_sizes(k, dim, world) for k in range(len(TP_SHAPES))]
        out["sizes"][dim] = sizes
        for c, cfg in enumerate(TP_CONFIGS):
            params = [leaf(block_of(tp_initial(k), dim, sizes[k], rank)) for k in range(len(TP_SHAPES))]
            layout = mdist.TensorParallel(shards={
                p: mdist.TensorParallelShard(list(TP_SHAPES[k]), dim, group) for k, p in enumerate(params)})
            opt = muon_cpp.Muon(params, layout=layout, tp_mode=mode, **cfg)
            run_steps(opt, params, lambda k, s: block_of(tp_gradient(k, s), dim, sizes[k], rank), TP_STEPS)
            out["blocks"][(dim, c)] = pieces(params)
    if rank == 0:
        inits = [tp_initial(k) for k in range(len(TP_SHAPES))]
        out["init"] = inits
        out["ref"] = {}
        for c, cfg in enumerate(TP_CONFIGS):
            out["ref"][c] = single_process(lambda ps: muon_cpp.Muon(ps, **cfg), inits, tp_gradient, TP_STEPS)
        if mode == "blockwise":
            # Every rank's block as a matrix of its own through plain Muon.
            out["block_ref"] = {}
            for dim in (0, 1):
                sizes = out["sizes"][dim]
                for c, cfg in enumerate(TP_CONFIGS):
                    for k in range(len(TP_SHAPES)):
                        for r in range(world):
                            if sizes[k][r] == 0:
                                continue
                            out["block_ref"][(dim, c, k, r)] = single_process(
                                lambda ps: muon_cpp.Muon(ps, **cfg), [block_of(inits[k], dim, sizes[k], r)],
                                lambda _, s: block_of(tp_gradient(k, s), dim, sizes[k], r), TP_STEPS)[0]
    return out


# ---- sharded (row shards) ------------------------------------------------------------

# tests/test_dist_sharded.cpp's mixed model: tall, wide, square, one with fewer
# rows than ranks, a 3-D conv weight; balanced, padded and empty shards (odd row
# counts where the C++ test has even ones, so that 2 ranks get padding rows).
SHARDED_MODEL = [
    ((24, 16), "balanced"), ((17, 40), "padded"), ((16, 16), "first"), ((30, 8), "balanced"),
    ((3, 12), "balanced"), ((13, 4, 3), "padded"), ((16, 40), "balanced"), ((23, 16), "padded"),
]
SHARDED_STEPS = 3
SHARDED_OPTIONS = dict(lr=0.02, weight_decay=0.1)


def sharded_param(k, shape):
    return randn(shape, 100 + k)


def sharded_grad(k, shape, s):
    return randn(shape, 5000 + 97 * s + k)


def case_sharded(rank, world, modes):
    return {mode: sharded_run(rank, world, mode) for mode in modes}


def sharded_run(rank, world, mode):
    import muon_cpp
    from muon_cpp import distributed as mdist

    group = dist.group.WORLD
    shapes = [s for s, _ in SHARDED_MODEL]
    rows = [split_rows(s[0], world, split) for s, split in SHARDED_MODEL]
    out = {"rows": rows, "shards": {}}
    for in_flight in (0, 2):
        params = [leaf(local_rows(sharded_param(k, s), rows[k], rank)) for k, s in enumerate(shapes)]
        layout = mdist.Sharded(shards={p: mdist.RowShard(list(shapes[k]), group) for k, p in enumerate(params)},
                               mode=mode, max_in_flight=in_flight)
        opt = muon_cpp.Muon(params, layout=layout, **SHARDED_OPTIONS)
        run_steps(opt, params, lambda k, s: local_rows(sharded_grad(k, shapes[k], s), rows[k], rank),
                  SHARDED_STEPS)
        out["shards"][in_flight] = pieces(params)
    if rank == 0:
        out["ref"] = single_process(lambda ps: muon_cpp.Muon(ps, **SHARDED_OPTIONS),
                                    [sharded_param(k, s) for k, s in enumerate(shapes)],
                                    lambda k, s: sharded_grad(k, shapes[k], s), SHARDED_STEPS)
        # The DeepSpeed bug (Newton-Schulz on a shard instead of the matrix): Muon on
        # rank 0's rows of matrix 0 alone, to show the comparison would catch it.
        out["slice_ref"] = single_process(
            lambda ps: muon_cpp.Muon(ps, **SHARDED_OPTIONS), [local_rows(sharded_param(0, shapes[0]), rows[0], 0)],
            lambda _, s: local_rows(sharded_grad(0, shapes[0], s), rows[0], 0), SHARDED_STEPS)[0]
    return out


def case_sharded_gradient_on_one_rank(rank, world):
    """tests/test_dist_sharded.cpp, GradientOnSomeRanksOnlyFailsOnEveryRank: rank 1
    steps one matrix without a gradient; every rank must raise ValueError before
    changing anything (the step's checks agree over the group first)."""
    import muon_cpp
    from muon_cpp import distributed as mdist

    shapes = [s for s, _ in SHARDED_MODEL]
    rows = [split_rows(s[0], world, split) for s, split in SHARDED_MODEL]
    params = [leaf(local_rows(sharded_param(k, s), rows[k], rank)) for k, s in enumerate(shapes)]
    opt = muon_cpp.Muon(params, layout=mdist.Sharded(
        shards={p: mdist.RowShard(list(shapes[k]), None) for k, p in enumerate(params)}), **SHARDED_OPTIONS)
    for k, p in enumerate(params):
        p.grad = local_rows(sharded_grad(k, shapes[k], 0), rows[k], rank)
    if rank == 1:
        params[3].grad = None
    before = pieces(params)
    out = {"type": None, "message": ""}
    try:
        opt.step()
    except Exception as e:  # noqa: BLE001 - the test checks type and message
        out = {"type": type(e).__name__, "message": str(e)}
    out["unchanged"] = all(torch.equal(a, b) for a, b in zip(before, pieces(params)))
    out["state"] = sum(1 for p in params if len(opt.state.get(p, {})) > 0)
    return out


# Expert groups (tests/test_dist_sharded.cpp, Sharded.ExpertsShardOverTheirOwnGroup):
# world 4; dense matrices sharded over all ranks; two expert-data-parallel groups
# {0, 1} and {2, 3}, each holding its own two experts, sharded within it.
EXPERT_DENSE = [((24, 16), "balanced"), ((16, 40), "padded")]
EXPERTS = [((20, 12), "balanced"), ((12, 20), "balanced"), ((20, 12), "padded"), ((12, 20), "first")]
EXPERT_ALL = EXPERT_DENSE + EXPERTS


def expert_ids(rank):
    """Indices into EXPERT_ALL of the matrices rank `rank` holds a shard of."""
    first = len(EXPERT_DENSE) + 2 * (rank // 2)
    return list(range(len(EXPERT_DENSE))) + [first, first + 1]


def case_experts(rank, world):
    import muon_cpp
    from muon_cpp import distributed as mdist

    assert world == 4
    expert_groups = [dist.new_group([0, 1], timeout=TIMEOUT), dist.new_group([2, 3], timeout=TIMEOUT)]
    mine = expert_groups[rank // 2]
    ids = expert_ids(rank)
    params, shards, rows = [], {}, {}
    for k in ids:
        shape, split = EXPERT_ALL[k]
        dense = k < len(EXPERT_DENSE)
        g, size, r = (dist.group.WORLD, world, rank) if dense else (mine, 2, rank % 2)
        rows[k] = split_rows(shape[0], size, split)
        p = leaf(local_rows(sharded_param(k, shape), rows[k], r))
        params.append(p)
        shards[p] = mdist.RowShard(list(shape), g)
    opt = muon_cpp.Muon(params, layout=mdist.Sharded(shards=shards), **SHARDED_OPTIONS)

    def grad_of(j, s):
        k = ids[j]
        r = rank if k < len(EXPERT_DENSE) else rank % 2
        return local_rows(sharded_grad(k, EXPERT_ALL[k][0], s), rows[k], r)

    run_steps(opt, params, grad_of, SHARDED_STEPS)
    out = {"ids": ids, "rows": rows, "shards": pieces(params)}

    # Stacked experts (one E x m x n tensor, stacked_experts=True) as row
    # shards over the expert group: each rank holds whole experts (2 and 1 of
    # 3) and orthogonalizes them alone; the group's rows together equal one
    # process's stacked Muon. Replicated over the expert group they run
    # layer-wise over it, each group its own stack, equal to the same.
    stack_rows = [2, 1]
    stack = leaf(local_rows(stacked_param(rank // 2), stack_rows, rank % 2))
    opt = muon_cpp.Muon([stack], stacked_experts=True, **SHARDED_OPTIONS,
                        layout=mdist.Sharded(shards={stack: mdist.RowShard(list(STACK_SHAPE), mine)}))
    run_steps(opt, [stack], lambda k, s: local_rows(stacked_grad(rank // 2, 0, s), stack_rows, rank % 2),
              SHARDED_STEPS)
    out["row_stack"] = pieces([stack])[0]
    stacks = [leaf(stacked_param(rank // 2)), leaf(stacked_param(rank // 2) * 0.5)]
    opt = muon_cpp.Muon(stacks, stacked_experts=True, layout=mdist.Layerwise(mine), **SHARDED_OPTIONS)
    run_steps(opt, stacks, lambda k, s: stacked_grad(rank // 2, k, s), SHARDED_STEPS)
    out["stacks"] = pieces(stacks)
    if rank == 0:
        out["ref"] = single_process(lambda ps: muon_cpp.Muon(ps, **SHARDED_OPTIONS),
                                    [sharded_param(k, s) for k, (s, _) in enumerate(EXPERT_ALL)],
                                    lambda k, s: sharded_grad(k, EXPERT_ALL[k][0], s), SHARDED_STEPS)
        out["stack_ref"] = [single_process(lambda ps: muon_cpp.Muon(ps, stacked_experts=True, **SHARDED_OPTIONS),
                                           [stacked_param(g), stacked_param(g) * 0.5],
                                           lambda k, s: stacked_grad(g, k, s), SHARDED_STEPS) for g in range(2)]
        out["stack_init"] = [stacked_param(g) for g in range(2)]
    return out


STACK_SHAPE = (3, 12, 20)  # 3 experts of 12 x 20


def stacked_param(group):
    return randn(STACK_SHAPE, 700 + group)


def stacked_grad(group, k, s):
    return randn(STACK_SHAPE, 7100 + 10 * group + 3 * s + k)


# 2-D (tests/test_dist_sharded.cpp, TwoDimensional): world 4 as a (dp 2, tp 2)
# mesh, TP fastest (world ranks 0, 1 are one TP group). Each matrix is split over
# TP (unevenly where the size is odd) and each TP block row-sharded over DP.
TWO_D_MODEL = [
    ((24, 16), 0, "balanced"), ((16, 40), 1, "padded"), ((21, 10), 0, "first"),
    ((12, 15), 1, "balanced"), ((24, 16), 0, "padded"),
]
TWO_D_MODES = ("duplicated", "distributed", "blockwise")


def two_d_block_sizes(k):
    shape, dim, _ = TWO_D_MODEL[k]
    return balanced_sizes(shape[dim], 2)


def two_d_block(full, k, tp_rank):
    _, dim, _ = TWO_D_MODEL[k]
    return block_of(full, dim, two_d_block_sizes(k), tp_rank)


def two_d_rows(k, tp_rank):
    """Rows per DP rank of TP block `tp_rank` of matrix k."""
    shape, dim, split = TWO_D_MODEL[k]
    block_rows = two_d_block_sizes(k)[tp_rank] if dim == 0 else shape[0]
    return split_rows(block_rows, 2, split)


def case_two_d(rank, world):
    import muon_cpp
    from muon_cpp import distributed as mdist

    assert world == 4
    # Every rank creates every group, in the same order (torch.distributed's rule).
    tp_groups = [dist.new_group([0, 1], timeout=TIMEOUT), dist.new_group([2, 3], timeout=TIMEOUT)]
    dp_groups = [dist.new_group([0, 2], timeout=TIMEOUT), dist.new_group([1, 3], timeout=TIMEOUT)]
    tp_rank, dp_rank = rank % 2, rank // 2
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    shapes = [s for s, _, _ in TWO_D_MODEL]
    out = {"shards": {}}
    for mode in TWO_D_MODES:
        params, shards = [], {}
        for k, (shape, dim, _) in enumerate(TWO_D_MODEL):
            block = two_d_block(sharded_param(k, shape), k, tp_rank)
            p = leaf(local_rows(block, two_d_rows(k, tp_rank), dp_rank))
            params.append(p)
            shards[p] = mdist.RowShard(list(block.shape), dp,
                                       tensor_parallel=mdist.TensorParallelShard(list(shape), dim, tp),
                                       tp_mode=mode)
        opt = muon_cpp.Muon(params, layout=mdist.Sharded(shards=shards), **SHARDED_OPTIONS)
        run_steps(opt, params, lambda k, s: local_rows(two_d_block(sharded_grad(k, shapes[k], s), k, tp_rank),
                                                       two_d_rows(k, tp_rank), dp_rank), SHARDED_STEPS)
        out["shards"][mode] = pieces(params)
    if rank == 0:
        out["ref"] = single_process(lambda ps: muon_cpp.Muon(ps, **SHARDED_OPTIONS),
                                    [sharded_param(k, s) for k, s in enumerate(shapes)],
                                    lambda k, s: sharded_grad(k, shapes[k], s), SHARDED_STEPS)
        # Blockwise: single-process Muon on each TP block alone.
        out["block_ref"] = {}
        for k, shape in enumerate(shapes):
            for t in range(2):
                out["block_ref"][(k, t)] = single_process(
                    lambda ps: muon_cpp.Muon(ps, **SHARDED_OPTIONS), [two_d_block(sharded_param(k, shape), k, t)],
                    lambda _, s: two_d_block(sharded_grad(k, shape, s), k, t), SHARDED_STEPS)[0]
    return out


# AdaptiveMuon under row shards (tests/test_dist_adaptive.cpp, RowShardsEqualOneProcess):
# sizes no world divides evenly; matrix 1 padded (the last rank holds 2 rows past
# the end); the 3-row matrix sits on rank 0 alone (rank 1's shard is empty).
ADAPTIVE_SHAPES = [(24, 16), (16, 40), (21, 10), (12, 15), (3, 12)]
ADAPTIVE_OPTIONS = dict(lr=0.02, weight_decay=0.1, scale_mode="spectral", beta2=0.9)


def adaptive_rows(k, world):
    rows = balanced_sizes(ADAPTIVE_SHAPES[k][0], world)
    if k == 1:
        rows[-1] += 2
    if k == 4:
        rows = split_rows(ADAPTIVE_SHAPES[k][0], world, "first")
    return rows


def adaptive_param(k):
    return randn(ADAPTIVE_SHAPES[k], 40 + k)


def adaptive_grad(k, s):
    return randn(ADAPTIVE_SHAPES[k], 900 + 17 * s + k)


def case_adaptive_sharded(rank, world, adaptive_modes):
    return {mode: adaptive_sharded_run(rank, world, mode) for mode in adaptive_modes}


def adaptive_sharded_run(rank, world, adaptive_mode):
    import muon_cpp
    from muon_cpp import distributed as mdist

    group = dist.group.WORLD
    n = len(ADAPTIVE_SHAPES)
    rows = [adaptive_rows(k, world) for k in range(n)]
    out = {"rows": rows, "shards": {}}
    for sharded_mode in ("owner_compute", "replicated"):
        params = [leaf(local_rows(adaptive_param(k), rows[k], rank)) for k in range(n)]
        layout = mdist.Sharded(shards={p: mdist.RowShard(list(ADAPTIVE_SHAPES[k]), group)
                                       for k, p in enumerate(params)}, mode=sharded_mode)
        opt = muon_cpp.AdaptiveMuon(params, layout=layout, mode=adaptive_mode, **ADAPTIVE_OPTIONS)
        run_steps(opt, params, lambda k, s: local_rows(adaptive_grad(k, s), rows[k], rank), SHARDED_STEPS)
        out["shards"][sharded_mode] = pieces(params)
        # The second moment lives with this rank's rows.
        out.setdefault("second_moment_shapes", {})[sharded_mode] = [
            tuple(opt.state[p]["second_moment"].shape) if "second_moment" in opt.state.get(p, {}) else None
            for p in params]
    if rank == 0:
        out["ref"] = single_process(
            lambda ps: muon_cpp.AdaptiveMuon(ps, mode=adaptive_mode, **ADAPTIVE_OPTIONS),
            [adaptive_param(k) for k in range(n)], adaptive_grad, SHARDED_STEPS)
    return out


# ---- save / load per rank ------------------------------------------------------------


def case_save_load(rank, world):
    """docs/distributed.md: save/load works in every layout, per rank. For each
    layout: 4 steps straight, against 2 steps, state_dict() through
    torch.save/torch.load, a fresh optimizer (same layout) over a copy of the
    parameters, load_state_dict, 2 more steps. Returns both runs' parameters."""
    import io

    import muon_cpp
    from muon_cpp import distributed as mdist

    group = dist.group.WORLD
    shapes = [(24, 16), (17, 40), (16,)]
    full = [sharded_param(k, s) for k, s in enumerate(shapes)]
    names = ["a.weight", "b.weight", "b.bias"]

    def grad_full(k, s):
        return sharded_grad(k, shapes[k], s)

    def layerwise():
        def make(params):
            return muon_cpp.MuonWithAdamW(list(zip(names, params)), lr=0.02, weight_decay=0.1,
                                          adamw_lr=1e-2, layout=mdist.Layerwise(group, bucket_mb=SMALL_BUCKET_MB))
        return make, list(full), grad_full

    def tensor_parallel():
        sizes = [uneven_sizes(s[0], world) for s in shapes[:2]]

        def make(params):
            shards = {p: mdist.TensorParallelShard(list(shapes[k]), 0, group) for k, p in enumerate(params)}
            return muon_cpp.Muon(params, lr=0.02, weight_decay=0.1, tp_mode="distributed",
                                 layout=mdist.TensorParallel(shards=shards))
        return (make, [block_of(full[k], 0, sizes[k], rank) for k in range(2)],
                lambda k, s: block_of(grad_full(k, s), 0, sizes[k], rank))

    def sharded():
        rows = [split_rows(s[0], world, "padded") for s in shapes[:2]]

        def make(params):
            shards = {p: mdist.RowShard(list(shapes[k]), group) for k, p in enumerate(params)}
            return muon_cpp.Muon(params, lr=0.02, weight_decay=0.1, layout=mdist.Sharded(shards=shards))
        return (make, [local_rows(full[k], rows[k], rank) for k in range(2)],
                lambda k, s: local_rows(grad_full(k, s), rows[k], rank))

    out = {}
    for kind, setup in (("layerwise", layerwise), ("tensor_parallel", tensor_parallel), ("sharded", sharded)):
        make, inits, grad_of = setup()
        straight = [leaf(t) for t in inits]
        run_steps(make(straight), straight, grad_of, 4)
        first = [leaf(t) for t in inits]
        opt = make(first)
        run_steps(opt, first, grad_of, 2)
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        buf.seek(0)
        saved = torch.load(buf)
        resumed = [leaf(p.detach()) for p in first]
        opt2 = make(resumed)
        opt2.load_state_dict(saved)
        run_steps(opt2, resumed, lambda k, s: grad_of(k, s + 2), 2)
        out[kind] = {"straight": pieces(straight), "resumed": pieces(resumed),
                     "state_entries": len(saved["state"])}
    return out


# ---- the harness itself ---------------------------------------------------------------


def case_fail_on_rank_1(rank, world):
    """Rank 1 raises while rank 0 waits in a collective: the test must see rank 1's
    exception promptly (the parent ends rank 0), not hang."""
    if rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    dist.barrier()
    return {}


def case_layerwise_subgroups(rank, world):
    """Layer-wise over sub-groups: world 4 as two data-parallel groups {0, 2} and
    {1, 3}, each replicating its own model (seeded by the group), as the DP groups
    of a (dp 2, tp 2) mesh do. Each group must equal one process on its model."""
    import muon_cpp
    from muon_cpp import distributed as mdist

    assert world == 4
    dp_groups = [dist.new_group([0, 2], timeout=TIMEOUT), dist.new_group([1, 3], timeout=TIMEOUT)]
    g = rank % 2

    def inits_of(g):
        return [randn(s, 300 + 50 * g + i) for i, (_, s) in enumerate(MATRICES)]

    def grad_of_group(g):
        return lambda k, s: randn(MATRICES[k][1], 8000 + 50 * g + 7 * s + k)

    params = [leaf(t) for t in inits_of(g)]
    opt = muon_cpp.Muon(params, lr=0.02, weight_decay=0.1,
                        layout=mdist.Layerwise(dp_groups[g], bucket_mb=SMALL_BUCKET_MB))
    run_steps(opt, params, grad_of_group(g), LAYERWISE_STEPS)
    out = {"group": g, "params": pieces(params),
           "with_state": [k for k, p in enumerate(params) if len(opt.state.get(p, {})) > 0]}
    if rank == 0:
        out["ref"] = [single_process(lambda ps: muon_cpp.Muon(ps, lr=0.02, weight_decay=0.1),
                                     inits_of(h), grad_of_group(h), LAYERWISE_STEPS) for h in range(2)]
        out["init"] = [inits_of(h) for h in range(2)]
    return out


def case_mesh4(rank, world):
    """The 2 x 2 layouts in one start of 4 processes: expert groups, 2-D, layer-wise
    over sub-groups."""
    return {"experts": case_experts(rank, world), "two_d": case_two_d(rank, world),
            "layerwise_subgroups": case_layerwise_subgroups(rank, world)}


# ---- QK-clip ---------------------------------------------------------------------

def case_qk_clip_max(rank, world):
    """Each rank passes its own maxima; muon_cpp.qk_clip all-reduces them with
    MAX over the group: every rank gets the gamma and weights of the maximum."""
    import muon_cpp
    base = torch.tensor([0.5, 6.0, 1.0, 2.5], dtype=torch.float64)
    mine = base.clone()
    for h in range(4):
        if h % world != rank:
            mine[h] -= 1.0 + rank
    weight = randn((2 * (2 + 2) * 3, 5), 7)  # 4 query heads in 2 groups, head_dim 3, grouped rows
    gamma = muon_cpp.qk_clip(weight, mine, num_heads=4, num_kv_heads=2, head_dim=3,
                             threshold=2.0, group=dist.group.WORLD)
    return {"gamma": gamma, "weight": weight}


def case_compat_keller(rank, world):
    """muon_cpp.compat.keller.MuonWithAuxAdam over the default group (layer-wise
    Muon, Adam on every rank) and SingleDeviceMuonWithAuxAdam on the same data:
    5 steps of bf16 Newton–Schulz (as Keller's) on matrices of several shapes."""
    from muon_cpp.compat.keller import MuonWithAuxAdam, SingleDeviceMuonWithAuxAdam
    shapes = [(12, 8), (8, 12), (6, 2, 3, 3), (16, 4), (10, 10), (7,), (9, 4)]

    def groups(params):
        return [dict(params=params[:5], use_muon=True, lr=0.05, weight_decay=0.1),
                dict(params=params[5:], use_muon=False, lr=0.01)]

    def train(cls):
        params = [torch.nn.Parameter(randn(s, 100 + i)) for i, s in enumerate(shapes)]
        opt = cls(groups(params))
        for step in range(5):
            for i, p in enumerate(params):
                p.grad = randn(p.shape, 1000 * step + i)
            opt.step()
        return params, opt

    params, opt = train(MuonWithAuxAdam)
    single, _ = train(SingleDeviceMuonWithAuxAdam)
    return {"rank": rank, "params": [p.detach() for p in params],
            "single": [p.detach() for p in single], "owners": opt.engine.owners()}


CASES = {
    "compat_keller": case_compat_keller,
    "qk_clip_max": case_qk_clip_max,
    "mesh4": case_mesh4,
    "layerwise": case_layerwise,
    "layerwise_disagree": case_layerwise_disagree,
    "tensor_parallel": case_tensor_parallel,
    "sharded": case_sharded,
    "save_load": case_save_load,
    "sharded_gradient_on_one_rank": case_sharded_gradient_on_one_rank,
    "experts": case_experts,
    "two_d": case_two_d,
    "adaptive_sharded": case_adaptive_sharded,
    "fail_on_rank_1": case_fail_on_rank_1,
}


# ---- a tiny training script for torchrun ---------------------------------------------

TRAIN_STEPS = 15
TRAIN_BATCH = 32  # per rank


def train_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


def train_data(world):
    """A fixed regression task; rank r's batch is rows [r·B, (r+1)·B)."""
    x = randn((world * TRAIN_BATCH, 8), 11)
    y = torch.tanh(x @ randn((8, 4), 12))
    return x, y


def train(model, opt, batches, reduce_grads):
    """TRAIN_STEPS steps of MSE on `batches` (one per rank this process plays), the
    gradients averaged by `reduce_grads`. Returns the losses (mean over batches)."""
    losses = []
    for _ in range(TRAIN_STEPS):
        opt.zero_grad()
        per_batch = []
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            per_batch.append(loss)
        reduce_grads(model, per_batch)
        losses.append(float(sum(l.item() for l in per_batch) / len(per_batch)))
        opt.step()
    return losses


def torchrun_main():
    """Under torchrun: gloo from the environment, the layer-wise layout from a config,
    gradients averaged with all_reduce (what DDP does). Rank 0 then trains the
    same model in one process, averaging the two half-batch gradients the way the
    all-reduce does ((g0 + g1) / 2), with the same config without a layout."""
    import hashlib

    import muon_cpp
    from muon_cpp import distributed as mdist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    config = {"optimizer": "muon", "lr": 0.02, "weight_decay": 0.01, "layout": "layerwise"}
    x, y = train_data(world)
    mine = (x[rank * TRAIN_BATCH:(rank + 1) * TRAIN_BATCH], y[rank * TRAIN_BATCH:(rank + 1) * TRAIN_BATCH])

    model = train_model()
    opt = muon_cpp.make_optimizer(list(model.named_parameters()), config, layout=mdist.Layerwise())

    def all_reduce_mean(m, per_batch):
        per_batch[0].backward()
        for p in m.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(world)

    losses = train(model, opt, [mine], all_reduce_mean)
    # Every rank's own loss differs (its own batch); the mean over ranks is the
    # full-batch loss.
    mean_losses = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(mean_losses)
    mean_losses /= world
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params.values())).hexdigest()
    result = {"rank": rank, "world": world, "losses": mean_losses.tolist(), "digest": digest,
              "names": list(params),
              "with_state": [n for n, p in model.named_parameters() if len(opt.state.get(p, {})) > 0]}
    if rank == 0:
        ref_model = train_model()
        ref_opt = muon_cpp.make_optimizer(list(ref_model.named_parameters()), dict(config, layout="none"))

        def sum_then_mean(m, per_batch):
            grads = []
            for loss in per_batch:
                m.zero_grad()
                loss.backward()
                grads.append([p.grad.clone() for p in m.parameters()])
            for i, p in enumerate(m.parameters()):
                total = grads[0][i].clone()
                for g in grads[1:]:
                    total += g[i]
                p.grad = total.div_(len(grads))

        batches = [(x[r * TRAIN_BATCH:(r + 1) * TRAIN_BATCH], y[r * TRAIN_BATCH:(r + 1) * TRAIN_BATCH])
                   for r in range(world)]
        ref_losses = train(ref_model, ref_opt, batches, sum_then_mean)
        scale = max(p.abs().max().item() for p in ref_model.parameters())
        diff = max((params[n] - p.detach()).abs().max().item() for n, p in ref_model.named_parameters())
        result["ref_losses"] = ref_losses
        result["max_rel_diff"] = diff / scale
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    torchrun_main()
    # Leave without finalizing the interpreter. torch 2.11's gloo worker
    # thread may still be releasing the last collective's work (which holds
    # Python tensors) when the main thread starts finalization; the release
    # then takes the GIL, the thread is made to exit mid-destructor and the
    # process aborts ("terminate called without an active exception";
    # pytorch/pytorch#117762, #190489). A torch-only script of the same shape
    # (all_reduce, barrier, destroy_process_group, exit) aborts 2 runs in 40
    # on 2 cores. Everything this case checks is printed and flushed above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
