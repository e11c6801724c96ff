"""Per-rank bodies of tests/python/test_fsdp2.py: muon_cpp over FSDP2.

Every rank builds the same seeded model, shards it with
``torch.distributed.fsdp.fully_shard`` over a 1-D CPU mesh (gloo), trains a
few steps on its slice of each step's batch and returns the parameters'
full tensors and the losses. Rank 0 also trains the same model, unsharded,
in one process on the whole batch with the same muon_cpp optimizer and no
layout: the reference. FSDP2 averages the ranks' gradients (reduce-scatter),
and each rank's loss is the mean over an equal slice of the batch, so the
reference's gradient (mean over the whole batch) is the same gradient.

The model has matrices whose rows do not divide by the world size (uneven
shards), one with fewer rows than ranks (an empty shard at 4 ranks), an
embedding and an output head (AdamW in the hybrid) and biases.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, WIDTH, HIDDEN, NARROW, SEQ, BATCH = 11, 12, 10, 3, 6, 8
STEPS = 5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.fc1 = nn.Linear(WIDTH, HIDDEN)   # 10 rows
        self.fc2 = nn.Linear(HIDDEN, NARROW)  # 3 rows: an empty shard at 4 ranks
        self.fc3 = nn.Linear(NARROW, HIDDEN)  # 10 rows
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        x = torch.tanh(self.fc1(x))
        x = torch.tanh(self.fc3(torch.tanh(self.fc2(x))))
        return self.lm_head(x)


def make_model():
    torch.manual_seed(0)
    return Net()


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def make_optimizer(kind, named):
    import muon_cpp

    if kind == "hybrid":
        return muon_cpp.MuonWithAdamW(named, lr=0.05, weight_decay=0.1, adamw_lr=1e-2)
    if kind == "muon":
        matrices = [(n, p) for n, p in named if p.dim() == 2 and not n.startswith("embed")]
        return muon_cpp.Muon(matrices, lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=True)
    raise ValueError(kind)


def shard(model, mesh):
    from torch.distributed.fsdp import fully_shard

    # torch 2.6 on CPU: no re-gather in backward (muon_cpp.distributed.enable_fsdp2_on_cpu).
    for m in (model.embed, model.fc1, model.fc2, model.fc3, model.lm_head):
        fully_shard(m, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


def train(model, opt, steps, rank, world, first_step=0):
    """`steps` steps; each rank takes rows [rank*B/W, (rank+1)*B/W) of the batch."""
    per = BATCH // world
    losses = []
    for s in range(first_step, first_step + steps):
        tokens = batch(s)[rank * per:(rank + 1) * per]
        loss = loss_of(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        if world > 1:
            dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def full_params(model):
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def full_state(model, opt):
    """The optimizer state of every parameter, whole (DTensors gathered)."""
    out = {}
    for n, p in model.named_parameters():
        out[n] = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v)
                  for k, v in opt.state.get(p, {}).items()}
    return out


def reference(kind, steps):
    model = make_model()
    opt = make_optimizer(kind, list(model.named_parameters()))
    losses = train(model, opt, steps, 0, 1)
    return {"params": full_params(model), "losses": losses, "state": full_state(model, opt)}


def mesh_of(world, shape=None):
    """A CPU device mesh over the ranks: 1-D (FSDP), or (replicas, shards) (HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh

    from muon_cpp import distributed as mdist

    mdist.enable_fsdp2_on_cpu()
    if shape is None:
        return init_device_mesh("cpu", (world,))
    return init_device_mesh("cpu", tuple(shape), mesh_dim_names=("replicate", "shard"))


def case_fsdp2_train(rank, world, kinds, mesh_shape=None):
    """Each optimizer kind: STEPS steps on the fully_shard'ed model (HSDP when
    `mesh_shape` is (replicas, shards)). Returns the full parameters, the
    losses, what the optimizer state looks like and (rank 0) the
    single-process reference."""
    from torch.distributed.tensor import DTensor

    mesh = mesh_of(world, mesh_shape)
    out = {}
    for kind in kinds:
        model = shard(make_model(), mesh)
        opt = make_optimizer(kind, list(model.named_parameters()))
        init = full_params(model)
        losses = train(model, opt, STEPS, rank, world)
        state = {}
        for n, p in model.named_parameters():
            s = opt.state.get(p, {})
            state[n] = {k: (type(v).__name__, tuple(v.placements) == tuple(p.placements)
                            if isinstance(v, DTensor) else None,
                            tuple(v.shape) if isinstance(v, torch.Tensor) else v)
                        for k, v in s.items()}
        out[kind] = {"init": init, "params": full_params(model), "losses": losses,
                     "state": state, "full_state": full_state(model, opt),
                     "state_bytes": opt.state_bytes(),
                     "local_rows": {n: p.to_local().shape[0] for n, p in model.named_parameters()}}
        if rank == 0:
            out[kind]["ref"] = reference(kind, STEPS)
    return out


def case_fsdp2_rebuild(rank, world, rounds):
    """`rounds` models and optimizers built one after another over the same
    process group, alternating the optimizer kinds, each trained one step.
    Returns each round's full parameters and the process group's own
    collectives still agree afterwards (a rank stuck in construction would
    never get here)."""
    mesh = mesh_of(world)
    out = []
    for i in range(rounds):
        kind = KINDS_ALTERNATING[i % len(KINDS_ALTERNATING)]
        model = shard(make_model(), mesh)
        opt = make_optimizer(kind, list(model.named_parameters()))
        losses = train(model, opt, 1, rank, world, first_step=i)
        out.append({"kind": kind, "losses": losses, "params": full_params(model)})
    return out


KINDS_ALTERNATING = ("hybrid", "muon")


def case_fsdp2_average(rank, world):
    """ReduceOp.AVG on gloo after enable_fsdp2_on_cpu: reduce_scatter_tensor
    and all_reduce, synchronous and asynchronous, against the mean of every
    rank's input computed here from the same seeds."""
    from muon_cpp import distributed as mdist

    mdist.enable_fsdp2_on_cpu()
    inputs = [torch.Generator().manual_seed(10 + r) for r in range(world)]
    full = [torch.randn(world * 3, generator=g) for g in inputs]
    mean = torch.stack(full).mean(0)
    mine = full[rank]
    out = {}
    for async_op in (False, True):
        rs = torch.empty(3)
        work = dist.reduce_scatter_tensor(rs, mine.clone(), op=dist.ReduceOp.AVG, async_op=async_op)
        if async_op:
            work.wait()
        ar = mine.clone()
        work = dist.all_reduce(ar, dist.ReduceOp.AVG, None, async_op)  # positional, as torch allows
        if async_op:
            work.wait()
        summed = mine.clone()
        work = dist.all_reduce(summed, op=dist.ReduceOp.SUM, async_op=async_op)
        if async_op:
            work.wait()
        out["async" if async_op else "sync"] = {
            "reduce_scatter": (rs, mean[rank * 3:(rank + 1) * 3]),
            "all_reduce": (ar, mean),
            "sum": (summed, torch.stack(full).sum(0)),
        }
    return out


def _dcp_state(model, opt):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def case_fsdp2_save(rank, world, kind, steps, path):
    """`steps` steps at this world size, then torch.distributed.checkpoint.save."""
    import torch.distributed.checkpoint as dcp

    mesh = mesh_of(world)
    model = shard(make_model(), mesh)
    opt = make_optimizer(kind, list(model.named_parameters()))
    losses = train(model, opt, steps, rank, world)
    dcp.save(_dcp_state(model, opt), checkpoint_id=path)
    return {"losses": losses, "params": full_params(model), "state": full_state(model, opt)}


def case_fsdp2_resume(rank, world, kind, first_step, steps, path, load_optimizer=True):
    """A fresh model and optimizer at this world size, loaded from the checkpoint
    at `path` (torch.distributed.checkpoint), then `steps` more steps. Without
    `load_optimizer`, only the model is loaded (a restart that loses the state)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, set_model_state_dict,
                                                         set_optimizer_state_dict)

    mesh = mesh_of(world)
    model = shard(make_model(), mesh)
    opt = make_optimizer(kind, list(model.named_parameters()))
    state = _dcp_state(model, opt) if load_optimizer else {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    if load_optimizer:
        set_optimizer_state_dict(model, opt, state["optim"])
    loaded = full_params(model)
    loaded_state = full_state(model, opt)
    steps_after_load = {n: s.get("step") for n, s in
                        ((n, opt.state.get(p, {})) for n, p in model.named_parameters())}
    losses = train(model, opt, steps, rank, world, first_step=first_step)
    out = {"loaded": loaded, "loaded_state": loaded_state, "params": full_params(model), "losses": losses,
           "steps_after_load": steps_after_load}
    if rank == 0:
        out["ref"] = reference(kind, first_step + steps)
    return out


def case_fsdp2_errors(rank, world):
    """What muon_cpp refuses with FSDP2 parameters, with the message."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    import muon_cpp
    from muon_cpp import distributed as mdist

    mesh = mesh_of(world)
    out = {}

    def attempt(key, fn):
        try:
            fn()
            out[key] = None
        except (ValueError, TypeError) as e:
            out[key] = "%s: %s" % (type(e).__name__, e)

    model = shard(make_model(), mesh)
    named = list(model.named_parameters())
    attempt("layerwise", lambda: make_layerwise(named))
    w = torch.randn(6, 4)
    col = nn.Parameter(DTensor.from_local(w[:, 2 * rank:2 * rank + 2] if world == 2 else w, mesh,
                                          [Shard(1)], run_check=False))
    attempt("shard1", lambda: muon_cpp.Muon([("w", col)]))
    rep = nn.Parameter(DTensor.from_local(w, mesh, [Replicate()], run_check=False))
    attempt("replicate", lambda: muon_cpp.Muon([("w", rep)]))
    attempt("ok", lambda: muon_cpp.Muon([("w", nn.Parameter(DTensor.from_local(
        w[3 * rank:3 * rank + 3] if world == 2 else w, mesh, [Shard(0)], run_check=False)))],
        layout=mdist.Sharded()))
    return out


def make_layerwise(named):
    import muon_cpp
    from muon_cpp import distributed as mdist

    return muon_cpp.MuonWithAdamW(named, layout=mdist.Layerwise())


CASES = {
    "fsdp2_train": case_fsdp2_train,
    "fsdp2_save": case_fsdp2_save,
    "fsdp2_resume": case_fsdp2_resume,
    "fsdp2_errors": case_fsdp2_errors,
    "fsdp2_rebuild": case_fsdp2_rebuild,
    "fsdp2_average": case_fsdp2_average,
}
