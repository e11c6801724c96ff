"""DTensor parameters (torch >= 2.4): what FSDP2's ``fully_shard`` makes.

A parameter that ``torch.distributed.fsdp.fully_shard`` shards is a DTensor
with a ``Shard(0)`` placement over the data-parallel dimension of a device
mesh (and ``Replicate()`` over the replicate dimension under HSDP). Its
local tensor holds this rank's rows, in ``torch.chunk`` order: the ranks'
local tensors, concatenated in mesh order, are the whole parameter. That is
the engine's row-sharded layout (muon::distributed::RowShard), so a muon_cpp
optimizer over DTensor parameters is the sharded (owner-compute) layout,
with each parameter's global shape and process group read from the DTensor.

The engine steps its own alias of each local tensor (``_Local.held``): the
same memory as FSDP's local tensor, re-pointed when FSDP replaces that
tensor (it does on lazy initialization when shards are uneven). Gradients
are FSDP's reduce-scattered DTensor gradients' local tensors. Optimizer
state of a DTensor parameter is handed out as DTensors of the parameter's
mesh and placements over the engine's local state tensors (no copy), so
``torch.distributed.checkpoint`` saves it sharded and loads it at another
world size.
"""
import math

import torch

try:  # torch >= 2.4
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover - torch 2.0-2.3, or none (1.13)
    try:
        from torch.distributed._tensor import DTensor, Replicate, Shard
    except ImportError:
        DTensor = Replicate = Shard = None

__all__ = ["available", "is_dtensor", "Local", "local_of"]


def available():
    """Whether this torch has DTensor."""
    return DTensor is not None


def is_dtensor(t):
    return DTensor is not None and isinstance(t, DTensor)


def _describe(placements):
    return "(" + ", ".join(repr(p) for p in placements) + ")"


class Local:
    """One DTensor parameter as the engine sees it: the process group its rows
    are split over, and ``held``, the engine's alias of its local tensor."""

    def __init__(self, param, name):
        placements = tuple(param.placements)
        shard_dims = [i for i, pl in enumerate(placements) if isinstance(pl, Shard)]
        others_ok = all(isinstance(pl, (Shard, Replicate)) for pl in placements)
        if not others_ok or len(shard_dims) != 1 or placements[shard_dims[0]].dim != 0:
            raise ValueError(
                f"parameter '{name}': muon_cpp takes DTensor parameters sharded along dim 0 over "
                f"one mesh dimension (FSDP2's fully_shard, HSDP), got placements "
                f"{_describe(placements)}")
        if param.dim() < 1:
            raise ValueError(f"parameter '{name}': a 0-dimensional DTensor cannot be row-sharded")
        self.param = param
        self.name = name
        self.mesh = param.device_mesh
        self.placements = placements
        self.mesh_dim = shard_dims[0]
        self.group = self.mesh.get_group(self.mesh_dim)
        self.world = self.mesh.size(self.mesh_dim)
        self.coordinate = self.mesh.get_local_rank(self.mesh_dim)
        local = param._local_tensor
        self.held = torch.empty(0, dtype=local.dtype, device=local.device)
        self._point(local)
        self._wrapped = {}  # state key -> (local tensor, DTensor over it)

    # ---- rows ----------------------------------------------------------------------

    def rows(self):
        """(first row, row count) of this rank in the global parameter."""
        n = self.param.shape[0]
        chunk = math.ceil(n / self.world) if n else 0
        first = min(self.coordinate * chunk, n)
        return first, min(chunk, n - first)

    # ---- parameter and gradient ------------------------------------------------------

    def _point(self, local):
        with torch.no_grad():
            self.held.set_(local)
        self._local = local

    def sync(self):
        """Points ``held`` at FSDP's current local tensor and its gradient at
        the local part of the parameter's gradient (None when it has none)."""
        local = self.param._local_tensor
        if local is not self._local:
            self._point(local)
        g = self.param.grad
        if g is None:
            self.held.grad = None
            return
        if is_dtensor(g):
            if tuple(g.placements) != self.placements:
                raise ValueError(
                    f"parameter '{self.name}': its gradient has placements "
                    f"{_describe(g.placements)}, the parameter {_describe(self.placements)}")
            g = g._local_tensor
        elif g.shape == self.param.shape:  # a whole gradient: take this rank's rows
            first, count = self.rows()
            g = g.narrow(0, first, count)
        if g.shape != self.held.shape:
            raise ValueError(f"parameter '{self.name}': local gradient of shape {tuple(g.shape)}, "
                             f"local parameter {tuple(self.held.shape)}")
        self.held.grad = g

    # ---- state -----------------------------------------------------------------------

    def wrap_state(self, key, t):
        """The engine's local state tensor ``t`` as a DTensor like the parameter
        (same memory), when it is row-shaped like the local parameter; per-rank
        tensors of other shapes are returned as they are."""
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != self.held.shape[0]:
            return t
        cached = self._wrapped.get(key)
        if cached is not None and cached[0] is t:
            return cached[1]
        shape = (self.param.shape[0],) + tuple(t.shape[1:])
        if tuple(t.shape) == tuple(self.held.shape):
            shape = tuple(self.param.shape)
        stride = torch.empty(shape, device="meta").stride()
        d = DTensor.from_local(t, self.mesh, self.placements, run_check=False, shape=shape,
                               stride=stride)
        self._wrapped[key] = (t, d)
        return d

    def local_state(self, key, value):
        """A loaded state value as this rank's local tensor: a DTensor's local
        part (redistributed when its placements differ), this rank's rows of
        a whole tensor, or a local tensor as it is."""
        if is_dtensor(value):
            if tuple(value.placements) != self.placements or value.device_mesh != self.mesh:
                value = value.redistribute(self.mesh, self.placements)
            return value._local_tensor
        if (isinstance(value, torch.Tensor) and value.dim() > 0
                and value.shape[0] == self.param.shape[0] and value.shape[0] != self.held.shape[0]):
            first, count = self.rows()
            return value.narrow(0, first, count).clone()
        return value


def local_of(param):
    """The local tensor of a DTensor, else the tensor itself."""
    return param._local_tensor if is_dtensor(param) else param
