"""torch.compile with muon_cpp's optimizers, on CPU (inductor, which compiles
C++ with the machine's compiler).

Two uses: ``torch.compile(model)`` with our optimizer stepping the compiled
model's parameters, and ``torch.compile`` of a whole training step that
calls ``opt.step()`` (the step runs eagerly: a graph break around the call
into C++). Each trains beside the same model in eager mode, from the same
initial values on the same data; the loss falls and the two runs stay within
the bound below.

Tolerance. The compiled forward and backward compute the same values as
eager in another order: each gradient element differs by at most about
K·2^-24 relative, K = 64 the longest reduction here (GRAD_REL). The step
orthogonalizes the gradient's momentum by Newton–Schulz in fp32
(ns_compute_dtype="float32"): 5 iterations of the quintic whose slope is at
most a = 3.4445, so a relative perturbation grows at most a^5 ≈ 490-fold
through it (NS_GAIN). Each step moves a parameter by lr·scale·|O| with |O|
<= 1 (scale = sqrt(max(1, rows/cols)) <= 2 here), so after STEPS steps the
runs differ by at most STEPS·lr·2·NS_GAIN·GRAD_REL ≈ 7.4e-4 (measured: 1.2e-7,
one fp32 ulp); the AdamW part
moves by at most its lr per step, and its ratio m/sqrt(v) of slightly
different gradients by the same relative amount.
"""
import pytest
import torch

if not hasattr(torch, "compile"):
    pytest.skip("torch.compile needs torch >= 2.0", allow_module_level=True)

import muon_cpp  # noqa: E402

STEPS, LR, ADAMW_LR = 10, 0.02, 3e-3
GRAD_REL = 64 * 2.0 ** -24
NS_GAIN = 3.4445 ** 5
TOL = STEPS * LR * 2 * NS_GAIN * GRAD_REL


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    return x, torch.sin(x @ w)


def optimizer(model):
    return muon_cpp.MuonWithAdamW(model.named_parameters(), lr=LR, adamw_lr=ADAMW_LR,
                                  ns_compute_dtype="float32")


def train_step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def close(eager, other):
    """The largest difference between the two runs' parameters (<= TOL)."""
    worst = 0.0
    for (n, a), (_, b) in zip(eager.named_parameters(), other.named_parameters()):
        diff = (a - b).abs().max().item()
        assert diff <= TOL, (n, diff, TOL)
        worst = max(worst, diff)
    return worst


def eager_run():
    model = net()
    opt = optimizer(model)
    x, y = data()
    return model, [train_step(model, opt, x, y).item() for _ in range(STEPS)]


def test_optimizer_steps_a_compiled_model():
    eager, eager_losses = eager_run()
    model = net()
    compiled = torch.compile(model)
    opt = optimizer(compiled)  # the compiled module's parameters are the model's
    assert [p for g in opt.param_groups for p in g["params"]]
    x, y = data()
    losses = [train_step(compiled, opt, x, y).item() for _ in range(STEPS)]
    assert losses[-1] < 0.5 * losses[0], losses
    for a, b in zip(losses, eager_losses):
        assert abs(a - b) <= 1e-3 * eager_losses[0], (losses, eager_losses)
    print("largest_difference:", close(eager, model))  # pytest -rP shows it
    # The parameters moved (by far more than the bound): the steps happened.
    start = net()
    moved = max((a - b).abs().max().item() for a, b in zip(model.parameters(), start.parameters()))
    assert moved > 100 * TOL


def test_a_compiled_training_step_that_calls_the_optimizer():
    eager, eager_losses = eager_run()
    model = net()
    opt = optimizer(model)
    x, y = data()
    step = torch.compile(train_step)
    losses = [step(model, opt, x, y).item() for _ in range(STEPS)]
    assert losses[-1] < 0.5 * losses[0], losses
    print("largest_difference:", close(eager, model))  # pytest -rP shows it
    assert opt.state and all(s["step"] == STEPS for s in opt.state.values() if "step" in s)
