"""muon_cpp.qk_clip (MuonClip) against the plain torch formula.

The reference is Kimi K2's rule with Megatron-Core's grouping, in fp64:
per query group g (num_heads / num_kv_heads consecutive query heads),
gamma_g = tau / max_{h in g} S_h when that exceeds tau, else 1; the group's
q rows times gamma_g**alpha, its k rows times gamma_g**(1 - alpha), v rows
unchanged. Tolerance: each clipped fp32 weight is fl(w * fl(c)), c the exact
factor, so |w' - w*c| <= (2u + u^2)|w*c| with u = 2**-24 on any IEEE CPU;
rows of groups not clipped are compared bit for bit.
"""
import math

import pytest
import torch

import muon_cpp
from conftest import value_error

U = 2.0 ** -24
D = 4


def randn(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(list(shape), generator=gen, dtype=torch.float32)


def ref_gamma(maxima, heads, kv_heads, tau):
    r = heads // kv_heads
    gamma = torch.ones(heads, dtype=torch.float64)
    for g in range(kv_heads):
        m = max(float(maxima[g * r + i]) for i in range(r))
        if m > tau:
            gamma[g * r:(g + 1) * r] = tau / m
    return gamma


def ref_factors(gamma, heads, kv_heads, alpha, rows, d=D):
    """The plain formula's factor of every row of the global weight (fp64)."""
    r = heads // kv_heads
    q = gamma.repeat_interleave(d) ** alpha
    k = gamma[::r].repeat_interleave(d) ** (1 - alpha)
    v = torch.ones(kv_heads * d, dtype=torch.float64)
    if rows == "query":
        return q
    if rows == "key":
        return k
    if rows == "blocked":
        return torch.cat([q, k, v])
    per_group = []
    for g in range(kv_heads):
        per_group += [q[g * r * d:(g + 1) * r * d], k[g * d:(g + 1) * d], v[g * d:(g + 1) * d]]
    return torch.cat(per_group)


def global_rows(rows, heads, kv_heads):
    return {"query": heads, "key": kv_heads}.get(rows, heads + 2 * kv_heads) * D


def check(before, after, factors):
    expected = before.double() * factors[:, None]
    unchanged = factors == 1.0
    assert torch.equal(after[unchanged], before[unchanged])
    err = (after.double() - expected).abs()
    assert bool((err <= (2 * U + U * U) * expected.abs()).all())
    assert not torch.equal(after, before)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 3), (4, 1)])
@pytest.mark.parametrize("rows", ["query", "key", "grouped", "blocked"])
@pytest.mark.parametrize("alpha", [0.5, 0.2])
def test_qk_clip_matches_the_plain_formula(heads, kv_heads, rows, alpha):
    maxima = torch.linspace(0.5, 4.0, heads, dtype=torch.float64).flip(0)
    tau = 2.0
    w = randn((global_rows(rows, heads, kv_heads), 7), heads * 10 + kv_heads)
    before = w.clone()
    gamma = muon_cpp.qk_clip(w, maxima, num_heads=heads, num_kv_heads=kv_heads, head_dim=D,
                             threshold=tau, alpha=alpha, rows=rows)
    expected_gamma = ref_gamma(maxima, heads, kv_heads, tau)
    assert torch.allclose(gamma, expected_gamma, rtol=1e-15, atol=0)
    check(before, w, ref_factors(expected_gamma, heads, kv_heads, alpha, rows))


def test_row_ranges_and_parameters_in_place():
    # Fused grouped rows split where a shard boundary cuts heads; a Parameter
    # requiring grad is scaled in place.
    heads, kv_heads = 6, 3
    maxima = torch.tensor([5.0, 1.0, 0.2, 0.3, 1.0, 9.0], dtype=torch.float64)
    whole = randn((global_rows("grouped", heads, kv_heads), 5), 3)
    parts = [torch.nn.Parameter(p.clone()) for p in whole.split([7, 22, 19])]
    gamma = muon_cpp.qk_clip(parts, maxima, num_heads=heads, num_kv_heads=kv_heads, head_dim=D,
                             threshold=2.0, row_begin=[0, 7, 29])
    factors = ref_factors(ref_gamma(maxima, heads, kv_heads, 2.0), heads, kv_heads, 0.5, "grouped")
    check(whole, torch.cat([p.detach() for p in parts]), factors)
    assert gamma[2] == gamma[3] == 1.0 and gamma[0] == gamma[1] == 2.0 / 5.0


def test_nothing_above_tau_and_gamma():
    w = randn((24, 5), 1)
    before = w.clone()
    gamma = muon_cpp.qk_clip(w, [1.0, 0.5], num_heads=2, head_dim=D, threshold=3.0)
    assert torch.equal(gamma, torch.ones(2, dtype=torch.float64))
    assert torch.equal(w, before)
    g = muon_cpp.qk_clip_gamma(torch.tensor([-1.0, 8.0]), num_heads=2, head_dim=D, threshold=2.0)
    assert g.tolist() == [1.0, 0.25]


def test_errors_name_the_argument_and_change_nothing():
    w = randn((24, 5), 1)
    before = w.clone()
    m = torch.tensor([5.0, 1.0])

    def clip(**kw):
        args = dict(num_heads=2, head_dim=D, threshold=2.0)
        args.update(kw)
        return lambda: muon_cpp.qk_clip(w, args.pop("max_logits", m), **args)

    value_error(clip(threshold=0.0), r"threshold must be finite and > 0, got 0")
    value_error(clip(threshold=math.inf), r"threshold must be finite and > 0, got inf")
    value_error(clip(alpha=1.5), r"alpha must be in \[0, 1\], got 1.5")
    value_error(clip(num_kv_heads=3), r"num_kv_heads must divide num_heads = 2")
    value_error(clip(max_logits=torch.tensor([1.0, math.nan])), r"max_logits\[1\] must be finite, got nan")
    value_error(clip(max_logits=torch.tensor([1.0, 2.0, 3.0])),
                r"max_logits must be 1-D with num_heads = 2 elements")
    value_error(clip(row_begin=10), r"weights\[0\] holds rows \[10, 34\) of a grouped weight of 24 rows")
    value_error(clip(rows="fused"), r"unknown qkv rows 'fused'")
    assert torch.equal(w, before)


def test_arguments_of_the_wrong_type_are_named_and_change_nothing():
    w = randn((24, 5), 2)
    before = w.clone()
    m = torch.tensor([5.0, 1.0])
    cases = [(dict(threshold="abc"), r"threshold must be a real number, got 'abc' of type str"),
             (dict(threshold=None), r"threshold must be a real number, got None of type NoneType"),
             (dict(alpha=[0.5]), r"alpha must be a real number, got \[0.5\] of type list"),
             (dict(num_heads="2"), r"num_heads must be an integer in int64, got '2'"),
             (dict(num_heads=2.0), r"num_heads must be an integer in int64, got 2.0 of type float"),
             (dict(head_dim=2**64), r"head_dim must be an integer in int64, got 18446744073709551616"),
             (dict(num_kv_heads=True), r"num_kv_heads must be an integer in int64, got True"),
             (dict(threshold="x" * 1000), r"threshold must be a real number, got 'xxx")]
    for kw, pattern in cases:
        args = dict(num_heads=2, head_dim=D, threshold=2.0)
        args.update(kw)
        msg = value_error(lambda: muon_cpp.qk_clip(w, m, **args), r"^qk_clip: " + pattern)
        assert len(msg) < 200, msg
        value_error(lambda: muon_cpp.qk_clip_gamma(m, **args), r"^qk_clip_gamma: " + pattern)
    value_error(lambda: muon_cpp.qk_clip(w, m, num_heads=2, head_dim=D, row_begin=[0.5]),
                r"^qk_clip: row_begin\[0\] must be an integer in int64, got 0.5")
    assert torch.equal(w, before)
    # Numbers of other types that are numbers: 0-d tensors, ints for floats.
    g = muon_cpp.qk_clip(w, m, num_heads=torch.tensor(2), head_dim=D, threshold=torch.tensor(2),
                         alpha=1)
    assert g.tolist() == [0.4, 1.0]


def test_max_over_a_process_group():
    from ranks import run_ranks
    results = run_ranks("qk_clip_max", 2)
    expected_gamma = ref_gamma([0.5, 6.0, 1.0, 2.5], 4, 2, 2.0)
    factors = ref_factors(expected_gamma, 4, 2, 0.5, "grouped", d=3)
    for r in results:
        assert torch.equal(r["gamma"], results[0]["gamma"])
        assert torch.allclose(r["gamma"], expected_gamma, rtol=1e-15, atol=0)
        assert torch.equal(r["weight"], results[0]["weight"])
        check(randn((24, 5), 7), r["weight"], factors)


def test_row_counts_past_int64_are_refused_not_a_crash():
    # (3 + 2·1)·head_dim wraps to 4 rows in int64: a 4-row weight passed the
    # row check and the row factors were written past their tensor (SIGSEGV).
    # Run in a child so that a crash fails this test, not the whole session.
    import subprocess
    import sys
    code = (
        "import torch, muon_cpp\n"
        "w = torch.ones(4, 3)\n"
        "try:\n"
        "    muon_cpp.qk_clip(w, [50.0, 50.0, 50.0], num_heads=3, num_kv_heads=1,\n"
        "                     head_dim=3689348814741910324, threshold=1.0)\n"
        "except ValueError as e:\n"
        "    print(str(e).splitlines()[0])\n"
        "assert torch.equal(w, torch.ones(4, 3))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert ("num_heads 3, num_kv_heads 1 and head_dim 3689348814741910324: a fused weight's "
            "(num_heads + 2 * num_kv_heads) * head_dim rows exceed int64") in r.stdout, r.stdout
    w = torch.ones(4, 3)
    value_error(lambda: muon_cpp.qk_clip(w, [50.0, 50.0], num_heads=2, head_dim=D, rows="query",
                                         row_begin=2**63 - 2, threshold=1.0),
                r"weights\[0\] holds rows \[9223372036854775806, 9223372036854775806 \+ 4\) "
                r"of a query weight of 8 rows")
    assert torch.equal(w, torch.ones(4, 3))
