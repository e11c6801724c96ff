"""muon_cpp.newton_schulz, coefficients and scale_factor against plain references.

The reference (conftest.ref_newton_schulz) is the textbook iteration written
with torch ops in fp64: X₀ = X/(‖X‖_F·safety + eps), then X ← aX + (bA + cA²)X
with A = XXᵀ on the short side, the set's (a, b, c) from
muon_cpp.coefficients(name) under the schedule include/muon/newton_schulz.h
documents (conftest.SET_FACTS).
"""
import math
import os
import zlib

import pytest
import torch

import muon_cpp
from conftest import (SET_FACTS, U_BF16, U_FP32, plain_error_over_orders, plain_scale,
                      ref_newton_schulz, rel_err, safety_of, schedule_of, value_error,
                      with_spectrum)

ALL_SETS = sorted(SET_FACTS)
SHAPES = [(24, 24), (16, 40), (40, 16), (3, 12, 20), (2, 20, 12)]


def test_coefficient_set_names_and_tuples():
    assert sorted(muon_cpp.coefficient_set_names()) == ALL_SETS
    for name in ALL_SETS:
        tuples = muon_cpp.coefficients(name)
        assert len(tuples) == SET_FACTS[name][3], name
        for t in tuples:
            assert len(t) == 3 and all(math.isfinite(v) for v in t), name
    # A few literals from the sources the sets come from, independent of the
    # package's tables (Jordan's tuple, You's first quintic tuple, the cubic).
    assert tuple(muon_cpp.coefficients("simple")[0]) == (3.4445, -4.7750, 2.0315)
    assert tuple(muon_cpp.coefficients("quintic")[0]) == (4.0848, -6.8946, 2.9270)
    assert tuple(muon_cpp.coefficients("cubic")[0]) == (1.5, -0.5, 0.0)
    assert tuple(muon_cpp.coefficients("deepseekv4")[9]) == (2.0, -1.5, 0.5)


@pytest.mark.parametrize("name", ALL_SETS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp32_matches_fp64_schedule(name, shape):
    # Tolerance: the library evaluates the same polynomial schedule as the
    # textbook formula, so in fp32 its error against the fp64 evaluation is of
    # the order of the textbook formula's own fp32 error on the same input
    # (measured here) in some equally valid order of the sums. On inputs this
    # small that error moves by up to ~2× with the order alone, whichever
    # kernel sums (conftest.plain_error_over_orders): the yardstick is the
    # largest of 8 orders, and the bound 2× that (the C++ suite's bound for
    # the standard iteration fp32 'auto' uses; measured over 900 inputs on
    # the BLAS and the oneDNN kernels: at most 1.9× and 1.4×) plus a floor
    # of 8 fp32 units of roundoff. A wrong tuple, schedule, safety factor or
    # transpose gives O(1) differences.
    gen = torch.Generator().manual_seed(zlib.crc32(repr((name, shape)).encode()))
    g = torch.randn(*shape, dtype=torch.float64, generator=gen)
    sched = schedule_of(name)
    ref = ref_newton_schulz(g, sched, safety=safety_of(name))
    plain = plain_error_over_orders(g.float(), sched, ref, safety=safety_of(name))
    out = muon_cpp.newton_schulz(g.float(), name)
    assert out.shape == g.shape and out.dtype == torch.float32
    assert rel_err(out, ref) <= 2 * plain + 8 * U_FP32


@pytest.mark.parametrize("name", ["simple", "quintic", "polar_express_5"])
@pytest.mark.parametrize("shape", [(24, 24), (16, 48), (48, 16), (2, 16, 40)],
                         ids=lambda s: "x".join(map(str, s)))
def test_bf16_compute_matches_within_bf16_rounding(name, shape):
    # bf16 compute: every product rounds to bf16 (unit roundoff 2⁻⁸), so the
    # error is that of the textbook formula evaluated in bf16 (measured here
    # on the same input). Bound: 4× that error (the C++ suite's factor for
    # the Gram evaluation, which 'auto' picks for bf16 at aspect >= 3; 2× for
    # the standard one) plus 8 bf16 units. The error must also be above
    # what fp32 compute gives (~1e-6): the input alone rounds to bf16 with
    # relative error ~2⁻⁹, so a result below 2⁻¹² means compute_dtype was
    # ignored.
    gen = torch.Generator().manual_seed(len(name) * 100 + sum(shape))
    g = torch.randn(*shape, dtype=torch.float64, generator=gen)
    sched = schedule_of(name)
    ref = ref_newton_schulz(g, sched, safety=safety_of(name))
    plain = ref_newton_schulz(g.float(), sched, safety=safety_of(name), dtype=torch.bfloat16)
    out = muon_cpp.newton_schulz(g.float(), name, compute_dtype=torch.bfloat16)
    assert out.dtype == torch.float32 and out.shape == g.shape
    err = rel_err(out, ref)
    assert err <= 4 * rel_err(plain, ref) + 8 * U_BF16
    assert err > 2.0 ** -12


def test_fp64_compute_and_explicit_methods():
    # fp64 compute: the only difference from the fp64 reference is the order
    # of summation, ~1e-16 relative per operation amplified by < 10 per step
    # over 5 steps: 1e-11 leaves a wide margin.
    g = torch.randn(20, 45, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ref = ref_newton_schulz(g, schedule_of("quintic"))
    for method in ("standard", "gram", "auto"):
        out = muon_cpp.newton_schulz(g, compute_dtype=torch.float64, method=method)
        assert out.dtype == torch.float64
        assert rel_err(out, ref) <= 1e-11, method


def test_steps_argument_and_schedule():
    # steps beyond the table: quintic cycles, polar_express_5 repeats its last tuple.
    g = torch.randn(16, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for name, steps in (("quintic", 7), ("polar_express_5", 7), ("simple", 2), ("aol", 6)):
        ref = ref_newton_schulz(g, schedule_of(name, steps), safety=safety_of(name))
        out = muon_cpp.newton_schulz(g, name, steps=steps, compute_dtype=torch.float64)
        assert rel_err(out, ref) <= 1e-11, name
    # steps=None means the set's default (polar_express: 8, deepseekv4: 10).
    for name in ("polar_express", "deepseekv4"):
        ref = ref_newton_schulz(g, schedule_of(name), safety=safety_of(name))
        out = muon_cpp.newton_schulz(g, name, steps=None, compute_dtype=torch.float64)
        assert rel_err(out, ref) <= 1e-11, name


def test_custom_tuples():
    # A list of (a, b, c) tuples, cycled (the contract's custom form).
    tuples = [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)]
    g = torch.randn(12, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    ref = ref_newton_schulz(g, [tuples[k % 2] for k in range(2)])
    out = muon_cpp.newton_schulz(g, tuples, compute_dtype=torch.float64)
    assert rel_err(out, ref) <= 1e-11
    ref4 = ref_newton_schulz(g, [tuples[k % 2] for k in range(4)])
    out4 = muon_cpp.newton_schulz(g, tuples, steps=4, compute_dtype=torch.float64)
    assert rel_err(out4, ref4) <= 1e-11


@pytest.mark.parametrize("m,n", [(32, 64), (64, 32), (40, 40)])
def test_polar_express_reaches_polar_factor(m, n):
    # polar_express (the paper's 8 steps) converges to U·Vᵀ for normalized
    # singular values down to ~1e-3: the C++ suite's bound, 1e-2 in spectral
    # norm (the schedule's own residual at σ = 1e-3 is ~1e-3; fp32 rounding
    # adds ~1e-6). `simple` never converges, so a wrong set fails here.
    g = with_spectrum(m, n, 4e-3, m + n)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    polar = u @ vh
    for dtype in (torch.float32, torch.float64):
        x = muon_cpp.newton_schulz(g.to(dtype), "polar_express", compute_dtype=dtype)
        err = torch.linalg.matrix_norm(x.double() - polar, 2).item()
        assert err <= 1e-2, (dtype, err)
    far = muon_cpp.newton_schulz(g.float(), "simple")
    assert torch.linalg.matrix_norm(far.double() - polar, 2).item() > 0.1


def test_eps_mode_clamp_vs_add_on_tiny_norm():
    # ‖G‖_F = 1e-8 < eps = 1e-7: add normalizes by ‖G‖ + eps = 1.1e-7
    # (X₀ has norm 1/11), clamp by max(‖G‖, eps) = 1e-7 (norm 1/10). After
    # five quintic steps the two differ by far more than fp32 rounding, and
    # each equals the fp64 formula of its mode to fp32 accuracy (2× the
    # textbook formula's fp32 error plus 8 units, as above).
    g = torch.randn(10, 14, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    g = g / g.norm() * 1e-8
    sched = schedule_of("quintic")
    outs = {}
    for mode in ("add", "clamp"):
        ref = ref_newton_schulz(g, sched, eps=1e-7, eps_mode=mode)
        plain = ref_newton_schulz(g.float(), sched, eps=1e-7, eps_mode=mode, dtype=torch.float32)
        out = muon_cpp.newton_schulz(g.float(), eps=1e-7, eps_mode=mode)
        assert rel_err(out, ref) <= 2 * rel_err(plain, ref) + 8 * U_FP32, mode
        outs[mode] = out
    assert rel_err(outs["add"], outs["clamp"]) > 1e-2
    # For an ordinary norm the modes agree to eps/‖G‖ relative in X₀.
    h = g / g.norm()
    a = muon_cpp.newton_schulz(h.float(), eps_mode="add")
    c = muon_cpp.newton_schulz(h.float(), eps_mode="clamp")
    assert rel_err(a, c) <= 1e-5


def test_zero_matrix_and_input_untouched():
    out = muon_cpp.newton_schulz(torch.zeros(6, 9))
    assert torch.equal(out, torch.zeros(6, 9))
    x = torch.randn(8, 12)
    copy = x.clone()
    y = muon_cpp.newton_schulz(x)
    assert torch.equal(x, copy)
    assert y.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("mode", ["shape_scaling", "spectral", "unit_rms_norm", "match_rms_adamw"])
def test_scale_factor_formulas(mode):
    assert sorted(muon_cpp.scale_mode_names()) == sorted(
        ["shape_scaling", "spectral", "unit_rms_norm", "match_rms_adamw"])
    for rows, cols in ((16, 16), (12, 48), (48, 12), (1, 7), (768, 3072)):
        for extra in (1.0, 0.2, 1.5):
            got = muon_cpp.scale_factor(rows, cols, mode, extra)
            # Same double operations as the formula: exact up to one rounding.
            assert got == pytest.approx(plain_scale(rows, cols, mode, extra), rel=1e-15, abs=0)
    assert muon_cpp.scale_factor(48, 12, mode) == pytest.approx(plain_scale(48, 12, mode), rel=1e-15)


def test_scale_factor_default_mode_is_shape_scaling():
    assert muon_cpp.scale_factor(48, 12) == pytest.approx(2.0, rel=1e-15)
    assert muon_cpp.scale_factor(12, 48) == 1.0


@pytest.mark.parametrize("extra", [0.0, -1.0, float("nan"), float("inf")])
def test_scale_factor_refuses_an_extra_factor_that_is_not_positive(extra):
    # 0 would zero every update and a negative factor would ascend.
    msg = value_error(lambda: muon_cpp.scale_factor(48, 12, "spectral", extra),
                       "extra_scale_factor must be finite and > 0, got")
    assert len(msg) < 200


def test_bad_arguments_raise_value_error_naming_them():
    x = torch.randn(4, 6)
    value_error(lambda: muon_cpp.newton_schulz(x, steps=0), r"steps", r"\b0\b")
    value_error(lambda: muon_cpp.newton_schulz(x, steps=100), r"steps", r"100")
    value_error(lambda: muon_cpp.newton_schulz(x, "quintik"), r"coefficient", r"quintik")
    value_error(lambda: muon_cpp.newton_schulz(torch.randn(5)), r"\bx\b", r"5")
    value_error(lambda: muon_cpp.newton_schulz(torch.randn(2, 3, 4, 5)), r"\bx\b")
    value_error(lambda: muon_cpp.newton_schulz(x, eps=0.0), r"eps")
    value_error(lambda: muon_cpp.newton_schulz(x, eps_mode="mul"), r"eps_mode", r"mul")
    value_error(lambda: muon_cpp.newton_schulz(x, method="fast"), r"method", r"fast")
    value_error(lambda: muon_cpp.newton_schulz(x, compute_dtype=torch.int32), r"compute_dtype")
    value_error(lambda: muon_cpp.newton_schulz(x, [(1.0, 2.0)]), r"coefficients")
    value_error(lambda: muon_cpp.coefficients("quintik"), r"quintik")
    value_error(lambda: muon_cpp.scale_factor(0, 4), r"rows", r"\b0\b")
    value_error(lambda: muon_cpp.scale_factor(4, 0), r"cols", r"\b0\b")
    value_error(lambda: muon_cpp.scale_factor(4, 4, "spectrall"), r"spectrall")


def test_cpu_kernels_say_what_bf16_runs_on():
    # bf16 products run on oneDNN's bf16 matmul only where it is native;
    # elsewhere (AVX2, AVX512_CORE, e.g. under ONEDNN_MAX_CPU_ISA) they are
    # widened to fp32 and rounded once. The line names oneDNN's level, and
    # explain() ends with the same line for the config's compute dtype.
    bf16 = muon_cpp.newton_schulz_cpu_kernels(torch.bfloat16)
    assert bf16.startswith("bf16 products: ")
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    if isa in ("AVX2", "AVX512_CORE"):
        assert "widened to fp32" in bf16, bf16
    assert "ISA" in bf16 or "no oneDNN" in bf16
    assert muon_cpp.newton_schulz_cpu_kernels().startswith("fp32 products: ")
    assert muon_cpp.newton_schulz_cpu_kernels(torch.float64).startswith("fp64 products: ")
    model = torch.nn.Linear(64, 256)
    text = muon_cpp.explain(model.named_parameters(), {"muon_ns_compute_dtype": "bfloat16"})
    assert text.rstrip().splitlines()[-1].startswith("Newton–Schulz in bfloat16: " + bf16)
