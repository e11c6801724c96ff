"""muon_cpp on CUDA tensors (a GPU and a build with the CUDA kernels).

Newton-Schulz on the GPU against torch.optim.Muon's own Newton-Schulz and
the fp64 iteration, muon_cpp.Muon on CUDA against the same optimizer on the
CPU, the drop-in torch.optim.Muon signature against torch's class on the
GPU, and the layer-wise and sharded layouts over an NCCL process group of
one rank against the plain optimizer. Every GPU test skips without a GPU
(scripts/gpu-check.sh runs them on a lent GPU machine); the file then exits
with pytest's 5.
"""
import os
import socket
import sys

import pytest
import torch

import muon_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HAS_GPU = torch.cuda.is_available() and muon_cpp.build_info().get("cuda_kernels", False)
if not HAS_GPU:
    pytest.skip("needs a CUDA device and a MUON_CUDA build", allow_module_level=True)

TORCH_NS = (3.4445, -4.775, 2.0315)  # torch.optim.Muon's default, 5 steps


def spread(rows, cols, seed):
    """Singular values from 1 down to 1e-3 (a training gradient's spread)."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, rows, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, cols, generator=g, dtype=torch.float64))
    s = min(rows, cols)
    mid = torch.zeros(rows, cols, dtype=torch.float64)
    mid[:s, :s] = torch.diag(torch.logspace(0, -3, s, dtype=torch.float64))
    return (u @ mid @ v.T).float()


def rel(got, want):
    want = want.double().cpu()
    return ((got.double().cpu() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("shape", [(1024, 1024), (2048, 512), (512, 2048), (64, 2048)])
def test_bf16_newton_schulz_no_worse_than_torch_optim_muon(shape):
    from torch.optim._muon import _zeropower_via_newtonschulz
    x = spread(*shape, seed=shape[0] + shape[1])
    kw = dict(coefficients=[TORCH_NS], steps=5)
    want = muon_cpp.newton_schulz(x.double(), compute_dtype=torch.float64, **kw)
    ours = muon_cpp.newton_schulz(x.cuda(), compute_dtype=torch.bfloat16, **kw)
    assert ours.is_cuda and ours.dtype == torch.float32
    theirs = _zeropower_via_newtonschulz(x.cuda(), TORCH_NS, 5, 1e-7)
    # Both run the same iteration with bf16 products; 10% for their
    # different roundings of the same terms.
    assert rel(ours, want) <= 1.1 * rel(theirs, want)


def test_muon_on_cuda_matches_the_cpu():
    results = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, device=device))
                  for s in [(256, 512), (256, 512), (128, 128), (64,)]]
        opt = muon_cpp.Muon(params, lr=0.02, weight_decay=0.1)
        for k in range(5):
            torch.manual_seed(100 + k)
            for p in params:
                p.grad = torch.randn(p.shape).to(device)
            opt.step()
        results.append([p.detach().cpu() for p in params])
    # Five steps of lr 0.02 move each weight by ~0.1; the runs differ by the
    # fp32 rounding of Newton-Schulz's products in another order (~1e-6).
    for a, b in zip(*results):
        assert (a - b).abs().max().item() <= 1e-5


def test_drop_in_torch_optim_muon_on_cuda():
    from test_compat import BF16_FACTOR, make_grads, make_params, torch_muon_ref
    from muon_cpp.compat.torch import Muon
    shapes = [(64, 16), (24, 96), (128, 128)]
    p0, grads = make_params(shapes, 3), make_grads(shapes, 3)
    ref = torch_muon_ref(p0, grads, torch.float64, lr=0.02)
    runs = []
    for cls in (Muon, torch.optim.Muon):
        params = [torch.nn.Parameter(p.float().cuda()) for p in p0]
        opt = cls(params, lr=0.02)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.float().cuda()
            opt.step()
        runs.append([p.detach().cpu() for p in params])
    err = [max((a.double() - r).abs().max().item() for a, r in zip(run, ref)) for run in runs]
    assert err[0] <= BF16_FACTOR * err[1], err


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_layouts_over_nccl_equal_the_plain_optimizer():
    import torch.distributed as dist
    from muon_cpp import distributed as mdist
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        def run(layout_of):
            torch.manual_seed(1)
            params = [torch.nn.Parameter(torch.randn(s, device="cuda"))
                      for s in [(96, 64), (64, 192), (64,)]]
            opt = muon_cpp.Muon(params, lr=0.02, layout=layout_of(params))
            for k in range(3):
                torch.manual_seed(10 + k)
                for p in params:
                    p.grad = torch.randn(p.shape, device="cuda")
                opt.step()
            return [p.detach().cpu() for p in params]

        plain = run(lambda ps: None)
        layerwise = run(lambda ps: mdist.Layerwise())
        sharded = run(lambda ps: mdist.Sharded({p: mdist.RowShard(tuple(p.shape)) for p in ps}))
        for a, b, c in zip(plain, layerwise, sharded):
            assert (a - b).abs().max().item() <= 1e-6
            assert (a - c).abs().max().item() <= 1e-6
    finally:
        dist.destroy_process_group()
