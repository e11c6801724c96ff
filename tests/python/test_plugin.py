"""A user optimizer from a C++ plugin (tests/plugins/sign_descent.cpp) in Python:
muon_cpp.load_plugin registers it, make_optimizer builds it from a config,
and its state (state[p], state_dict, load_state_dict's checks) comes from
the state schema its registry entry declares; no library file names it.

Reference: the plain formula in fp64 (m <- b*m + (1-b)*g; p <- p*(1-lr*wd)
- lr*sign(m)). Tolerance 1e-5 of max|p|: fp32 rounds p once per step
(2^-24 relative) and the sign is exact unless m is within rounding of 0;
a wrong sign or a missed decay moves an element by lr = 2e-2.
"""
import os

import pytest
import torch

import muon_cpp

PLUGIN = os.environ.get("MUON_SIGN_DESCENT_PLUGIN", "")
pytestmark = pytest.mark.skipif(not PLUGIN, reason="MUON_SIGN_DESCENT_PLUGIN is not set (ctest sets it)")

CONFIG = {"optimizer": "sign_descent", "lr": 0.02, "weight_decay": 0.1, "sign_descent_beta": 0.8}


@pytest.fixture(scope="module", autouse=True)
def loaded():
    added = muon_cpp.load_plugin(PLUGIN)
    assert added in (["sign_descent"], [])  # [] when another test in this process loaded it
    assert "sign_descent" in muon_cpp._C.optimizer_names()
    assert muon_cpp.load_plugin(PLUGIN) == []


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def grads(step, params):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g) for p in params]


def test_built_from_a_config_it_steps_as_its_formula():
    m = model()
    params = list(m.parameters())
    ref = [p.detach().double().clone() for p in params]
    mom = [torch.zeros_like(r) for r in ref]
    opt = muon_cpp.make_optimizer(m.named_parameters(), CONFIG)
    assert isinstance(opt, torch.optim.Optimizer)
    for s in range(4):
        for p, g in zip(params, grads(s, params)):
            p.grad = g
        opt.step()
        for i, g in enumerate(grads(s, params)):
            mom[i] = 0.8 * mom[i] + 0.2 * g.double()
            ref[i] = ref[i] * (1 - 0.02 * 0.1) - 0.02 * mom[i].sign()
    for p, r in zip(params, ref):
        assert (p.detach().double() - r).abs().max().item() <= 1e-5 * r.abs().max().item()
    st = opt.state[params[0]]
    assert sorted(st) == ["momentum", "step"] and st["step"] == 4
    assert torch.allclose(st["momentum"].double(), mom[0], rtol=0, atol=1e-6)
    assert opt.state_bytes() == sum(p.numel() * 4 for p in params)


def test_state_dict_round_trips_and_bad_state_is_refused_by_name():
    m = model()
    params = list(m.parameters())
    opt = muon_cpp.make_optimizer(m.named_parameters(), CONFIG)
    for s in range(2):
        for p, g in zip(params, grads(s, params)):
            p.grad = g
        opt.step()
    saved = opt.state_dict()
    m2 = model()
    with torch.no_grad():
        for a, b in zip(m2.parameters(), params):
            a.copy_(b)
    opt2 = muon_cpp.make_optimizer(m2.named_parameters(), CONFIG)
    # `saved` holds opt's live state tensors (torch 2.x's state_dict does not
    # copy, nor does its load_state_dict): the engine keeps copies, or the
    # two optimizers would step one momentum twice.
    opt2.load_state_dict(saved)
    for s in range(2, 4):
        for o, mm in ((opt, m), (opt2, m2)):
            for p, g in zip(mm.parameters(), grads(s, list(mm.parameters()))):
                p.grad = g
            o.step()
    for a, b in zip(params, m2.parameters()):
        assert torch.equal(a, b)  # same state, same steps: bit-identical
    bad = opt.state_dict()
    bad["state"][0]["momentum"] = torch.zeros(2, 2)
    before = [opt2.state[p]["momentum"].clone() for p in m2.parameters()]
    with pytest.raises(ValueError) as e:
        opt2.load_state_dict(bad)
    msg = str(e.value)
    assert "'momentum'" in msg and "[2, 2]" in msg and len(msg) < 400, msg
    for p, b in zip(m2.parameters(), before):
        assert torch.equal(opt2.state[p]["momentum"], b)  # nothing changed


def test_schema_and_explain_describe_its_state():
    fields = muon_cpp.state_schema("sign_descent")
    assert [(f["name"], f["shape"], f["init"], f["split"]) for f in fields] == [
        ("step", "counter", "zeros", "replicated"), ("momentum", "param", "zeros", "rows")]
    text = muon_cpp.explain(model().named_parameters(), CONFIG)
    assert "state of sign_descent: step [counter], momentum [param, zeros, rows]" in text, text


DUPLICATE = os.environ.get("MUON_DUPLICATE_PLUGIN", "")


@pytest.mark.skipif(not DUPLICATE, reason="MUON_DUPLICATE_PLUGIN is not set (ctest sets it)")
def test_a_plugin_that_registers_a_taken_name_is_a_value_error_and_adds_nothing(tmp_path):
    # The plugin registers plugin_first, then muon; a copy of sign_descent at
    # another path registers sign_descent again. Both used to throw inside
    # dlopen's initializers (std::terminate): a child process, so that an
    # abort fails this test rather than ending the session.
    import shutil
    import subprocess
    import sys
    copy = tmp_path / "libsign_descent_copy.so"
    shutil.copyfile(PLUGIN, copy)
    code = (
        "import sys, muon_cpp\n"
        "from muon_cpp import _C\n"
        "assert muon_cpp.load_plugin(sys.argv[1]) == ['sign_descent']\n"
        "before = _C.optimizer_names()\n"
        "for path in sys.argv[2:] + sys.argv[2:]:\n"
        "    try:\n"
        "        muon_cpp.load_plugin(path)\n"
        "        print('loaded', path)\n"
        "    except ValueError as e:\n"
        "        print('ValueError', str(e))\n"
        "    assert _C.optimizer_names() == before, _C.optimizer_names()\n"
        "assert 'plugin_first' not in _C.optimizer_names()\n"
        "print('names', len(before))\n"
    )
    r = subprocess.run([sys.executable, "-c", code, PLUGIN, DUPLICATE, str(copy)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    lines = r.stdout.splitlines()
    assert len(lines) == 5, lines
    for line, path, name in zip(lines, [DUPLICATE, str(copy)] * 2,
                                ["muon", "sign_descent"] * 2):
        assert line.startswith(f"ValueError [muon::load_plugin] '{path}' is refused and nothing it "
                               "registers is added"), line
        assert f"optimizer '{name}' is already registered" in line, line
        assert len(line) < 800, line
