"""Distributed layouts over ``torch.distributed`` process groups.

A layout is given to an optimizer (``layout=...``); each equals
single-process Muon on the whole matrices (docs/distributed.md):

* ``Layerwise(group)``: replicated (DDP) parameters; each rank owns a
  subset, steps it (optimizer state ≈ 1/W per rank) and all-gathers the
  updated parameters. Gradients must be averaged first (DDP, or
  ``all_reduce_gradients``).
* ``TensorParallel({param: TensorParallelShard(...)})``: tensor-parallel
  blocks, orthogonalized as whole matrices (Muon option ``tp_mode``:
  duplicated | distributed | blockwise).
* ``Sharded({param: RowShard(...)})``: ZeRO/FSDP row shards, each matrix
  orthogonalized by one owner rank (``mode="owner_compute"``) or by every
  rank (``"replicated"``); expert groups and 2-D (TP × sharded) layouts are
  row shards over the expert group, or with ``tensor_parallel=``.

Groups are ``torch.distributed`` process groups (``None``: the default
group); any backend torch has, gloo on CPU.
"""
import inspect
import os
import threading

import torch
import torch.distributed as dist

from . import _C

__all__ = ["Layerwise", "TensorParallel", "TensorParallelShard", "Sharded", "RowShard", "wrap",
           "broadcast_parameters", "all_reduce_gradients", "enable_fsdp2_on_cpu"]

_wrapped = {}  # id(process group) -> (process group, Group), for the current default group
_wrapped_world = None


def _timeout_s():
    try:
        return float(os.environ.get("MUON_TIMEOUT", "300"))
    except ValueError:
        raise ValueError(f"MUON_TIMEOUT must be a number of seconds, got "
                         f"{os.environ['MUON_TIMEOUT']!r}") from None


def _group_ranks(pg):
    if hasattr(dist, "get_process_group_ranks"):
        return list(dist.get_process_group_ranks(pg))
    ranks = dist.distributed_c10d._pg_group_ranks.get(pg)  # torch 1.13
    if ranks is None:
        return []
    return [g for g, _ in sorted(ranks.items(), key=lambda kv: kv[1])]


def wrap(process_group=None):
    """The engine's Group over a torch.distributed process group (None: the
    default group). One Group per process group, reused."""
    if isinstance(process_group, _C.Group):
        return process_group
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("torch.distributed is not initialized: call "
                         "dist.init_process_group(...) before building a distributed layout")
    pg = dist.group.WORLD if process_group is None else process_group
    # A new default group (destroy_process_group, then init again) retires
    # the Groups over the old ones.
    global _wrapped_world
    if _wrapped_world is not dist.group.WORLD:
        _wrapped.clear()
        _wrapped_world = dist.group.WORLD
    key = id(pg)
    if key not in _wrapped:
        name = "world" if pg is dist.group.WORLD else f"process_group{len(_wrapped)}"
        _wrapped[key] = (pg, _C.Group.wrap(pg, timeout_s=_timeout_s(), world_ranks=_group_ranks(pg),
                                           name=name))
    return _wrapped[key][1]


def TensorParallelShard(global_shape, partition_dim, group=None):
    """This rank's block of a tensor-parallel parameter of ``global_shape``,
    split along ``partition_dim`` over ``group``."""
    return _C.TensorParallelShard(list(global_shape), int(partition_dim), wrap(group))


def RowShard(global_shape, group=None, tensor_parallel=None, tp_mode="duplicated"):
    """This rank's rows of a ``global_shape`` parameter split over ``group``
    (the data-parallel or expert group); with ``tensor_parallel`` (a
    TensorParallelShard) the sharded matrix is itself a TP block of a larger
    one (2-D layout), orthogonalized in ``tp_mode``."""
    shard = _C.RowShard(list(global_shape), wrap(group))
    if tensor_parallel is not None:
        shard = shard.with_tensor_parallel(tensor_parallel, tp_mode)
    return shard


class _Layout:
    kind = "none"

    def apply_to(self, config):
        config.set("layout", self.kind)

    def build(self, names):
        return _C.DistributedLayout()


class _NoLayout(_Layout):
    def apply_to(self, config):
        pass


class Layerwise(_Layout):
    """Layer-wise ownership of replicated parameters over ``group`` (the
    data-parallel group; None: the default group)."""

    kind = "layerwise"

    def __init__(self, group=None, bucket_mb=8.0, max_in_flight=2):
        self.group = group
        self.bucket_mb = bucket_mb
        self.max_in_flight = max_in_flight

    def apply_to(self, config):
        super().apply_to(config)
        config.set("layout_bucket_mb", float(self.bucket_mb))
        config.set("layout_max_in_flight", int(self.max_in_flight))

    def build(self, names):
        layout = _C.DistributedLayout()
        layout.group = wrap(self.group)
        return layout


def _by_name(shards, names, what):
    out = {}
    for p, shard in shards.items():
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{what}: keys must be the parameter tensors, got {type(p).__name__}")
        if id(p) not in names:
            raise ValueError(f"{what}: a tensor of shape {tuple(p.shape)} is not among the "
                             f"optimizer's parameters")
        out[names[id(p)]] = shard
    return out


class TensorParallel(_Layout):
    """Tensor-parallel blocks: ``shards`` maps parameter tensors to
    ``TensorParallelShard``s (parameters without one are whole)."""

    kind = "tensor_parallel"

    def __init__(self, shards):
        self.shards = dict(shards)

    def build(self, names):
        layout = _C.DistributedLayout()
        layout.tensor_parallel = _by_name(self.shards, names, "TensorParallel shards")
        return layout


class Sharded(_Layout):
    """Row shards: ``shards`` maps every Muon parameter tensor to its
    ``RowShard``; ``mode`` "owner_compute" (default) or "replicated".

    DTensor parameters (FSDP2's ``fully_shard``) describe their own shards:
    leave ``shards`` out (an optimizer over DTensor parameters uses this
    layout without being asked)."""

    kind = "sharded"

    def __init__(self, shards=None, mode="owner_compute", max_in_flight=2):
        self.shards = None if shards is None else dict(shards)
        self.mode = mode
        self.max_in_flight = max_in_flight

    def _with_dtensor_shards(self, shards):
        if not shards:
            return self if self.shards is not None else Sharded({}, self.mode, self.max_in_flight)
        given = self.shards or {}
        both = [p for p in given if any(p is q for q in shards)]
        if both:
            raise ValueError("Sharded shards: a DTensor parameter describes its own RowShard; "
                             f"leave the {len(both)} DTensor parameter(s) out of shards")
        out = Sharded(dict(given), self.mode, self.max_in_flight)
        out.shards.update(shards)
        return out

    def apply_to(self, config):
        super().apply_to(config)
        config.set("layout_sharded_mode", self.mode)
        config.set("layout_max_in_flight", int(self.max_in_flight))

    def build(self, names):
        if self.shards is None:
            raise ValueError("Sharded(): no shards given and no DTensor parameters to take them "
                             "from; pass {param: RowShard(...)} for every Muon parameter")
        layout = _C.DistributedLayout()
        layout.row_shards = _by_name(self.shards, names, "Sharded shards")
        return layout


def _layout_of(layout, config, dtensor_shards=None):
    """The layout an optimizer is built with. ``dtensor_shards`` (None without
    DTensor parameters): the RowShards DTensor parameters describe, which
    make the layout sharded."""
    if dtensor_shards is not None:
        if layout is None:
            kind = config.get("layout")
            if kind not in ("none", "sharded"):
                raise ValueError(f"config layout '{kind}' cannot step DTensor (FSDP2) parameters: "
                                 f"they are row-sharded; use layout 'sharded' or none")
            return Sharded(None, config.get("layout_sharded_mode"),
                           config.get("layout_max_in_flight"))._with_dtensor_shards(dtensor_shards)
        if not isinstance(layout, Sharded):
            raise ValueError(f"{type(layout).__name__} cannot step DTensor (FSDP2) parameters: "
                             f"they are row-sharded; use muon_cpp.distributed.Sharded() or no layout")
        return layout._with_dtensor_shards(dtensor_shards)
    if layout is None:
        kind = config.get("layout")
        if kind == "layerwise":
            return Layerwise(None, config.get("layout_bucket_mb"), config.get("layout_max_in_flight"))
        if kind != "none":
            raise ValueError(f"config layout '{kind}' needs its shards: pass "
                             f"layout=muon_cpp.distributed.{'TensorParallel' if kind == 'tensor_parallel' else 'Sharded'}(...)")
        return _NoLayout()
    if not isinstance(layout, _Layout):
        raise TypeError(f"layout must be a muon_cpp.distributed layout (Layerwise, TensorParallel, "
                        f"Sharded), got {type(layout).__name__}")
    return layout


def broadcast_parameters(named_parameters, group=None, root=0):
    """Copies rank ``root``'s parameters into every rank's (checks names and shapes first)."""
    items = list(named_parameters)
    _C.broadcast_parameters([n for n, _ in items], [p.data for _, p in items], wrap(group), root)


def all_reduce_gradients(params, group=None, bucket_mb=32.0):
    """Averages the gradients of ``params`` over ``group`` in place (training
    without DDP)."""
    _C.all_reduce_gradients([p for p in params], wrap(group), int(bucket_mb * (1 << 20)))


class _CpuEvent:
    """What FSDP2 needs of an event on the CPU, where work is synchronous."""

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True


class _AveragedWork(dist.Work if dist.is_available() else object):
    """An asynchronous SUM that is an average once waited for: wait() (or
    is_completed() once true, result(), the future) divides its output by the
    group's size, exactly once."""

    def __init__(self, work, out, size):
        super().__init__()
        self._work, self._out, self._size = work, out, size
        self._lock = threading.Lock()
        self._divided = False

    def _divide(self):
        with self._lock:
            if not self._divided:
                self._out.div_(self._size)
                self._divided = True

    def wait(self, timeout=None):
        ok = self._work.wait() if timeout is None else self._work.wait(timeout)
        self._divide()
        return ok

    def is_completed(self):
        if not self._work.is_completed():
            return False
        self._divide()
        return True

    def is_success(self):
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def result(self):
        self.wait()
        return self._work.result()

    def get_future(self):
        def divided(fut):
            self._divide()
            return fut.value()

        return self._work.get_future().then(divided)


def _gloo_average(collective):
    """`collective` (dist.reduce_scatter_tensor or dist.all_reduce) with
    ReduceOp.AVG on a gloo group done as SUM, then a division by the group's
    size: gloo before torch 2.8 has no AVG (reduce_scatter_tensor silently
    sums, all_reduce raises). An asynchronous call returns a Work whose
    wait() divides (_AveragedWork)."""

    signature = inspect.signature(collective)
    first = next(iter(signature.parameters))  # the output: `output` or `tensor`

    def averaged(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        given = call.arguments
        group = given.get("group")
        if given.get("op") != dist.ReduceOp.AVG or dist.get_backend(group) != dist.Backend.GLOO:
            return collective(*args, **kwargs)
        given["op"] = dist.ReduceOp.SUM
        out = given[first]
        size = dist.get_world_size(group)
        work = collective(*call.args, **call.kwargs)
        if not given.get("async_op"):
            out.div_(size)
            return work
        if work is None:  # this rank is not in the group: nothing was reduced
            return None
        return _AveragedWork(work, out, size)

    averaged._muon_gloo_average = True
    averaged.__wrapped__ = collective
    return averaged


def enable_fsdp2_on_cpu():
    """Lets torch 2.6's FSDP2 (``fully_shard``) run on CPU over gloo, with the
    gradients it promises; a no-op where there is nothing to change.

    torch 2.6 on CPU lacks three things FSDP2 relies on (torch 2.7 and 2.8
    added them):

    * ``torch.cpu.Stream.record_event``/``wait_event``, which FSDP2 calls
      around its collectives (no-ops here, as in torch 2.7: CPU collectives
      are synchronous);
    * ``ReduceOp.AVG`` on gloo: FSDP2 averages gradients with
      ``reduce_scatter_tensor(op=AVG)``, which gloo silently turns into a sum
      (every gradient W times too large: Muon and AdamW updates hide it,
      their optimizer state does not), and HSDP's ``all_reduce(op=AVG)``
      raises. AVG calls on gloo groups become SUM and a division by the
      group size (asynchronous ones divide before their Work completes);
    * re-gathering parameters in backward trips autograd's version check on
      CPU: shard with ``reshard_after_forward=False`` there (not something
      this function can change).

    Call it once per process before the first forward. Returns whether it
    changed anything."""
    changed = False
    stream = getattr(getattr(torch, "cpu", None), "Stream", None)
    if stream is not None and not hasattr(stream, "record_event"):
        stream.record_event = lambda self, event=None: _CpuEvent()
        stream.wait_event = lambda self, event: None
        changed = True
    if dist.is_available():
        for name in ("reduce_scatter_tensor", "all_reduce"):
            fn = getattr(dist, name, None)
            if fn is not None and not getattr(fn, "_muon_gloo_average", False):
                setattr(dist, name, _gloo_average(fn))
                changed = True
    return changed
