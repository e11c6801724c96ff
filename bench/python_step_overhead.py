# Python overhead of a muon_cpp step, measured inside each step: wall time of
# opt.step() from Python against the time the same call spent in the C++
# optimizer (Engine.last_step_seconds), so machine noise cancels.
import time, statistics, torch, muon_cpp
torch.set_num_threads(1)
torch.manual_seed(0)
# The 25M-parameter set of bench_optimizer_step --model 25m: 8 layers of
# (1536, 512), (512, 512), (2048, 512), (512, 2048).
shapes = [(1536, 512), (512, 512), (2048, 512), (512, 2048)] * 8
for dtype in ("float32", "bfloat16"):
    params = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    opt = muon_cpp.Muon(params, ns_compute_dtype=dtype)
    for p in params: p.grad = torch.randn_like(p)
    opt.step()
    ratios = []; walls = []
    for _ in range(5):
        t = time.perf_counter(); opt.step(); wall = time.perf_counter() - t
        walls.append(wall); ratios.append(wall / opt._engine.last_step_seconds())
    print(f"{dtype}: step {statistics.median(walls)*1e3:.1f} ms, python wall / C++ step: median {statistics.median(ratios):.4f}, max {max(ratios):.4f}")
