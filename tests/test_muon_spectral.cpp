// Muon's spectral options (muon/spectral.h as Muon options): weight_decay_mode
// spectral_clipped (W ← spectral_clipped_weight_decay(W, β, lr·wd) before the
// step) and spectral_update clip / hardcap (step 4 is spectral_clip(M, σmin,
// σmax) or spectral_hardcap(M, β) instead of Newton–Schulz, then Muon's
// scale). Five fp32 steps against a plain fp64 reference written here, whose
// clip, cap and decay are exact (fp64 SVD: U·f(Σ)·Vᵀ); options, config
// fields and explain; invalid values named; bit-identical resume; layerwise
// equal to one process; tensor_parallel and sharded refuse the options.
//
// Tolerance: the spectral functions compute U·f(Σ)·Vᵀ with Newton–Schulz
// matrix signs (polar_express, 8 steps, fp32 here), so their error is the
// polar factor's, not fp32 rounding. As tests/test_spectral.cpp does, the
// test measures, on the very matrices of each step (from the fp64
// reference), δ = ‖msign_NS(M) − polar(M)‖_F of X and of the inner matrices
// whose msign each formula takes, with polar(M) exact from the SVD. Each
// formula is a sum of at most three products in which one msign factor
// multiplies matrices of spectral norm at most ‖X‖₂ + max|bound|, so its
// error is at most 3·(‖X‖₂ + max|bound|)·Σδ; 1e-5·‖X‖_F is added for the
// fp32 rounding of the input and of the products (O(10–100) roundings of
// 2⁻²⁴ per element). The weight error after 5 steps is at most the sum of
// lr·α·(update error) and of the decay's error over the steps (the clipped
// decay is non-expansive: singular-value clipping is the projection onto a
// spectral-norm ball), plus 2e-6·‖W‖_F for the fp32 rounding of the weight's
// own ten updates. The singular values of the inputs are chosen so that
// every σᵢ and every |σᵢ − bound| is at least ~2% of the Frobenius norm of
// its matrix, well inside where 8 polar_express steps converge (≥ 1e-3): the
// bound is then small, and each test asserts it is under a tenth of what
// the option changes (the distance to the reference without it), so a wrong
// formula cannot pass.
#include <gtest/gtest.h>

#include "tensor_util.h"
#include "archive_util.h"
#include "dist_util.h"
#include "expect_util.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "muon/config.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/distributed/layouts/make.h"
#include "muon/newton_schulz.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/muon.h"
#include "muon/optim/orthogonalized_family.h"
#include "muon/registry.h"
#include "optim/muon_internal.h"

namespace muon::test {
namespace {

using Named = torch::OrderedDict<std::string, at::Tensor>;

constexpr int64_t kSteps = 5;
constexpr double kMu = 0.5;  // momentum (EMA, Nesterov)

// A parameter shape and how Muon sees it: `batch` matrices of rows × cols.
struct Shape {
  std::vector<int64_t> sizes;
  bool experts;
  int64_t batch;
  int64_t rows;
  int64_t cols;
  std::string name;
};

const std::vector<Shape> kShapes{
    {{6, 10}, false, 1, 6, 10, "2-D wide"},
    {{10, 6}, false, 1, 10, 6, "tall"},
    {{6, 2, 1, 5}, false, 1, 6, 10, "conv (6, 2·1·5)"},
    {{2, 6, 10}, true, 2, 6, 10, "stacked experts"},
};

// The update's singular values (k = 6 of every matrix here), times
// (1 + 0.02·t) at step t.
const std::vector<double> kUpdateSingular{3.0, 2.2, 1.6, 0.8, 0.35, 0.2};
// The weights' singular values at the start.
const std::vector<double> kWeightSingular{3.0, 2.6, 2.0, 0.7, 0.5, 0.35};

struct Basis {
  at::Tensor u;  // (rows, k)
  at::Tensor v;  // (cols, k)
};

Basis basis(int64_t rows, int64_t cols, uint64_t seed) {
  at::manual_seed(seed);
  const int64_t k = std::min(rows, cols);
  return {std::get<0>(at::linalg_qr(at::randn({rows, k}, at::kDouble))),
          std::get<0>(at::linalg_qr(at::randn({cols, k}, at::kDouble)))};
}

at::Tensor compose(const Basis& b, const at::Tensor& s) {
  return at::matmul(b.u * s, b.v.transpose(0, 1));
}

// The problem for one shape: the weights and gradients of every step (fp32,
// as Muon gets them), built so that each matrix's Nesterov update u_t has
// singular values kUpdateSingular·(1 + 0.02·t) and the weights start at
// kWeightSingular, in one basis per matrix.
struct Problem {
  Shape shape;
  at::Tensor w0;                  // fp32, shape.sizes
  std::vector<at::Tensor> grads;  // fp32, shape.sizes
};

Problem make_problem(const Shape& shape, uint64_t seed) {
  Problem pr{shape, {}, {}};
  std::vector<at::Tensor> w;
  std::vector<std::vector<at::Tensor>> g(kSteps);
  const auto target = at::tensor(kUpdateSingular, at::kDouble);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const auto basis_b = basis(shape.rows, shape.cols, seed + 31 * static_cast<uint64_t>(b));
    w.push_back(compose(basis_b, at::tensor(kWeightSingular, at::kDouble)));
    // u_t = (1 − μ²)·g_t + μ²·buf_{t−1} (EMA and Nesterov), so
    // g_t = (σ_t − μ²·buf_{t−1}) / (1 − μ²) in the common basis.
    auto buf = at::zeros_like(target);
    for (int64_t t = 0; t < kSteps; ++t) {
      const auto sigma = target * (1 + 0.02 * static_cast<double>(t));
      const auto gt = (sigma - kMu * kMu * buf) / (1 - kMu * kMu);
      buf = kMu * buf + (1 - kMu) * gt;
      g[static_cast<size_t>(t)].push_back(compose(basis_b, gt));
    }
  }
  pr.w0 = at::stack(w).reshape(shape.sizes).to(at::kFloat).contiguous();
  for (auto& gt : g) pr.grads.push_back(at::stack(gt).reshape(shape.sizes).to(at::kFloat).contiguous());
  return pr;
}

enum class Update { kPolar, kClip, kHardcap };

struct RefOptions {
  double lr = 0.05;
  double wd = 0.0;  // spectral_clipped decay when > 0
  double wd_beta = 1.0;
  Update update = Update::kPolar;
  double lo = -1.0;
  double hi = 1.0;
  double cap = 1.0;
};

Svd svd_of(const at::Tensor& m) {
  auto [u, s, vh] = at::linalg_svd(m, /*full_matrices=*/false);
  return {u, s, vh.transpose(0, 1)};
}

// ---- the measured Newton–Schulz error (tests/test_spectral.cpp's approach) --

double fro(const at::Tensor& t) { return t.norm().item<double>(); }

at::Tensor ns_msign(const at::Tensor& m) {
  NewtonSchulzOptions ns;
  ns.coefficients("polar_express").steps(8).compute_dtype(at::kFloat);
  return newton_schulz(m.to(at::kFloat), ns).to(at::kDouble);
}

double delta_x(const Svd& a) { return fro(ns_msign(a.x()) - a.with(at::ones_like(a.s))); }

double delta_inner_clip(const Svd& a, double sigma) {
  const bool tall = a.u.size(0) > a.v.size(0);
  const auto& basis = tall ? a.v : a.u;
  const auto inner = sigma * at::eye(basis.size(0), at::kDouble) - at::matmul(basis * a.s, basis.transpose(0, 1));
  const auto exact = at::matmul(basis * at::sign(sigma - a.s), basis.transpose(0, 1));
  return fro(ns_msign(inner) - exact);
}

double delta_inner_cap(const Svd& a, double beta) {
  return fro(ns_msign(a.with(beta - a.s)) - a.with(at::sign(beta - a.s)));
}

double smax(const Svd& a) { return a.s.max().item<double>(); }

// ---- the reference ----------------------------------------------------------

struct Reference {
  at::Tensor w;      // fp64, shape.sizes
  double tol = 0;    // bound on ‖Muon's fp32 result − w‖_F (see the top)
};

// Five steps of Muon in fp64 with every matrix function exact by SVD:
//   1. W ← U·f(Σ)·Vᵀ, f(σ) = σ > β ? (1 − c)·σ + c·β : σ, c = lr·wd
//   2–3. buf ← buf + (1 − μ)(g − buf); u = g + μ(buf − g)
//   4. O = U·Vᵀ | U·clamp(Σ, lo, hi)·Vᵀ | U·min(Σ, cap)·Vᵀ of u
//   5–6. W ← W − lr·√max(1, rows/cols)·O
Reference reference(const Problem& pr, const RefOptions& o, bool with_tol) {
  const auto& sh = pr.shape;
  const double alpha = std::sqrt(std::max(1.0, static_cast<double>(sh.rows) / static_cast<double>(sh.cols)));
  const double c = o.lr * o.wd;
  auto w = pr.w0.to(at::kDouble).reshape({sh.batch, sh.rows, sh.cols}).clone();
  auto buf = at::zeros_like(w);
  double tol = 0;
  for (int64_t t = 0; t < kSteps; ++t) {
    const auto g = pr.grads[static_cast<size_t>(t)].to(at::kDouble).reshape({sh.batch, sh.rows, sh.cols});
    buf = buf + (1 - kMu) * (g - buf);
    const auto u = g + kMu * (buf - g);
    for (int64_t b = 0; b < sh.batch; ++b) {
      if (c > 0) {
        const auto a = svd_of(w[b]);
        const auto f = at::where(a.s > o.wd_beta, (1 - c) * a.s + c * o.wd_beta, a.s);
        if (with_tol) {
          tol += c * 3 * (smax(a) + o.wd_beta) * (2 * delta_x(a) + delta_inner_cap(a, o.wd_beta)) +
                 1e-5 * fro(w[b]);
        }
        w[b] = a.with(f);
      }
      const auto a = svd_of(u[b]);
      at::Tensor orth;
      double err = 0;
      switch (o.update) {
        case Update::kPolar:
          orth = a.with(at::ones_like(a.s));
          if (with_tol) err = delta_x(a) + 1e-5 * fro(orth);
          break;
        case Update::kClip:
          orth = a.with(at::clamp(a.s, o.lo, o.hi));
          if (with_tol) {
            err = 3 * (smax(a) + std::max(std::abs(o.lo), std::abs(o.hi))) *
                      (2 * delta_x(a) + delta_inner_clip(a, o.lo) + delta_inner_clip(a, o.hi)) +
                  1e-5 * fro(u[b]);
          }
          break;
        case Update::kHardcap:
          orth = a.with(at::clamp_max(a.s, o.cap));
          if (with_tol) {
            err = 3 * (smax(a) + o.cap) * (2 * delta_x(a) + delta_inner_cap(a, o.cap)) + 1e-5 * fro(u[b]);
          }
          break;
      }
      tol += o.lr * alpha * err;
      w[b] = w[b] - o.lr * alpha * orth;
    }
  }
  tol += 2e-6 * fro(w);
  return {w.reshape(sh.sizes), tol};
}

MuonOptions muon_options(const RefOptions& o, const Shape& sh) {
  auto m = MuonOptions(o.lr).momentum(kMu).stacked_experts(sh.experts).ns_coefficients("polar_express").ns_steps(8);
  if (o.wd > 0) m.weight_decay(o.wd).weight_decay_mode("spectral_clipped").spectral_wd_beta(o.wd_beta);
  if (o.update == Update::kClip) m.spectral_update("clip").spectral_sigma_min(o.lo).spectral_sigma_max(o.hi);
  if (o.update == Update::kHardcap) m.spectral_update("hardcap").spectral_hardcap_beta(o.cap);
  return m;
}

at::Tensor run_muon(const Problem& pr, const MuonOptions& o) {
  auto p = pr.w0.clone().requires_grad_(true);
  Muon opt({p}, o);
  for (int64_t t = 0; t < kSteps; ++t) {
    p.mutable_grad() = pr.grads[static_cast<size_t>(t)].clone();
    opt.step();
  }
  return p.detach();
}

// Muon's fp32 result within the measured bound of the exact reference, the
// bound under a tenth of what the option changes.
void expect_matches_reference(const RefOptions& o, const RefOptions& without) {
  uint64_t seed = 11;
  for (const auto& sh : kShapes) {
    const auto pr = make_problem(sh, seed += 100);
    const auto ref = reference(pr, o, /*with_tol=*/true);
    const auto plain = reference(pr, without, /*with_tol=*/false);
    const double effect = fro(ref.w - plain.w);
    EXPECT_LT(ref.tol, 0.1 * effect) << sh.name;
    const auto got = run_muon(pr, muon_options(o, sh));
    ASSERT_EQ(got.sizes(), pr.w0.sizes());
    ASSERT_EQ(got.scalar_type(), at::kFloat);
    const double err = fro(got.to(at::kDouble) - ref.w);
    EXPECT_LE(err, ref.tol) << sh.name << ": error " << err << ", bound " << ref.tol << ", effect "
                            << effect;
  }
}

TEST(MuonSpectral, ClipUpdateEqualsFp64Reference) {
  RefOptions o;
  o.update = Update::kClip;
  o.lo = 0.5;
  o.hi = 1.2;
  expect_matches_reference(o, RefOptions{});
}

TEST(MuonSpectral, HardcapUpdateEqualsFp64Reference) {
  RefOptions o;
  o.update = Update::kHardcap;
  o.cap = 1.0;
  expect_matches_reference(o, RefOptions{});
}

TEST(MuonSpectral, ClipWithEqualBoundsIsMuonTimesTheBound) {
  // σmin = σmax = s: the clip is s·msign, so the step is s times Muon's
  // (the blog's sanity check; Muon's scale applies to both).
  const auto pr = make_problem(kShapes[0], 5);
  RefOptions o;
  o.update = Update::kClip;
  o.lo = 0.7;
  o.hi = 0.7;
  const auto ref = reference(pr, o, /*with_tol=*/true);
  RefOptions polar;
  polar.lr = 0.7 * o.lr;
  const auto scaled = reference(pr, polar, /*with_tol=*/false);
  EXPECT_LE(fro(ref.w - scaled.w), 1e-12);  // the reference itself
  const auto got = run_muon(pr, muon_options(o, kShapes[0]));
  EXPECT_LE(fro(got.to(at::kDouble) - scaled.w), ref.tol);
}

TEST(MuonSpectral, SpectralClippedWeightDecayEqualsFp64Reference) {
  RefOptions o;
  o.wd = 4.0;  // c = lr·wd = 0.2
  o.wd_beta = 1.0;
  expect_matches_reference(o, RefOptions{});
}

TEST(MuonSpectral, BothOptionsTogetherEqualFp64Reference) {
  RefOptions o;
  o.wd = 4.0;
  o.wd_beta = 1.0;
  o.update = Update::kHardcap;
  o.cap = 1.0;
  RefOptions without;
  without.update = Update::kHardcap;
  without.cap = 1.0;
  expect_matches_reference(o, without);
}

TEST(MuonSpectral, DefaultsAreEmergingOptimizersAndPlainMuon) {
  const MuonOptions d;
  EXPECT_EQ(d.spectral_update(), SpectralUpdate::kNone);
  EXPECT_EQ(d.spectral_sigma_min(), -1.0);
  EXPECT_EQ(d.spectral_sigma_max(), 1.0);
  EXPECT_EQ(d.spectral_hardcap_beta(), 1.0);
  EXPECT_EQ(d.spectral_wd_beta(), 1.0);
  EXPECT_EQ(d.weight_decay_mode(), WeightDecayMode::kDecoupled);
  EXPECT_FALSE(d.needs_spectral());
  EXPECT_EQ(to_string(WeightDecayMode::kSpectralClipped), "spectral_clipped");
  EXPECT_EQ(parse_spectral_update("hardcap"), SpectralUpdate::kHardcap);
}

TEST(MuonSpectral, InvalidValuesAreNamedAndChangeNothing) {
  auto p = at::randn({6, 10}).requires_grad_(true);
  expect_value_error([] { MuonOptions().spectral_update("soft"); },
                     {"spectral_update", "'soft'", "none, clip, hardcap"});
  expect_value_error([] { MuonOptions().weight_decay_mode("spectral"); },
                     {"weight_decay_mode", "'spectral'", "spectral_clipped"});
  // c = lr·weight_decay out of [0, 1].
  expect_value_error([] { MuonOptions(0.5).weight_decay(4.0).weight_decay_mode("spectral_clipped").validate(); },
                     {"lr·weight_decay", "[0, 1]", "2"});
  expect_value_error([&] { Muon({p}, MuonOptions(0.5).weight_decay(4.0).weight_decay_mode("spectral_clipped")); },
                     {"lr·weight_decay", "2"});
  expect_value_error([] { MuonOptions().spectral_sigma_min(1.0).spectral_sigma_max(0.5).validate(); },
                     {"spectral_sigma_min", "spectral_sigma_max", "1", "0.5"});
  expect_value_error([] { MuonOptions().spectral_hardcap_beta(0.0).validate(); },
                     {"spectral_hardcap_beta", "> 0", "0"});
  expect_value_error([] { MuonOptions().spectral_hardcap_beta(-2.0).validate(); },
                     {"spectral_hardcap_beta", "-2"});
  expect_value_error([] { MuonOptions().spectral_wd_beta(0.0).validate(); }, {"spectral_wd_beta", "> 0", "0"});

  // A step whose options became invalid (an lr schedule raising c past 1)
  // raises before anything changes.
  Muon opt({p}, MuonOptions(0.1).weight_decay(2.0).weight_decay_mode("spectral_clipped"));
  p.mutable_grad() = at::randn({6, 10});
  opt.step();
  const auto before = p.detach().clone();
  ASSERT_EQ(opt.state().size(), 1u);
  const auto& st = static_cast<const MuonParamState&>(*opt.state().begin()->second);
  const auto buffer = st.momentum_buffer().clone();
  opt.param_groups()[0].options().set_lr(0.6);
  expect_value_error([&] { opt.step(); }, {"lr·weight_decay", "1.2"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_TRUE(at::equal(st.momentum_buffer(), buffer));
  EXPECT_EQ(st.step(), 1);
}

TEST(MuonSpectral, ResumeIsBitIdenticalAndOptionsRoundTrip) {
  const auto o = MuonOptions(0.05)
                     .weight_decay(2.0)
                     .weight_decay_mode("spectral_clipped")
                     .spectral_wd_beta(0.8)
                     .spectral_update("clip")
                     .spectral_sigma_min(0.3)
                     .spectral_sigma_max(1.1)
                     .spectral_hardcap_beta(0.9);
  std::vector<at::Tensor> grads;
  for (int64_t t = 0; t < kSteps; ++t) grads.push_back(seeded_randn({6, 10}, 700 + static_cast<uint64_t>(t)));
  auto straight = seeded_randn({6, 10}, 3).requires_grad_(true);
  Muon a({straight}, o);
  for (int64_t t = 0; t < kSteps; ++t) {
    straight.mutable_grad() = grads[static_cast<size_t>(t)];
    a.step();
  }
  auto resumed = seeded_randn({6, 10}, 3).requires_grad_(true);
  std::string bytes;
  {
    Muon b({resumed}, o);
    for (int64_t t = 0; t < 2; ++t) {
      resumed.mutable_grad() = grads[static_cast<size_t>(t)];
      b.step();
    }
    bytes = save_to_string(b);
  }
  Muon c({resumed}, MuonOptions(0.01));  // other options: the archive's win
  load_from_string(c, bytes);
  const auto& loaded = static_cast<const MuonOptions&>(c.param_groups()[0].options());
  EXPECT_EQ(loaded, o);
  EXPECT_EQ(loaded.spectral_update(), SpectralUpdate::kClip);
  EXPECT_EQ(loaded.spectral_sigma_min(), 0.3);
  EXPECT_EQ(loaded.spectral_hardcap_beta(), 0.9);
  EXPECT_EQ(loaded.spectral_wd_beta(), 0.8);
  EXPECT_EQ(loaded.weight_decay_mode(), WeightDecayMode::kSpectralClipped);
  for (int64_t t = 2; t < kSteps; ++t) {
    resumed.mutable_grad() = grads[static_cast<size_t>(t)];
    c.step();
  }
  EXPECT_TRUE(at::equal(resumed.detach(), straight.detach()));
  // Options differing in one spectral field are not equal, and the settings
  // digest (the ranks' step agreement) tells them apart.
  auto other = o;
  other.spectral_sigma_max(1.2);
  EXPECT_FALSE(other == o);
  SettingsDigest x;
  SettingsDigest y;
  o.mix_settings(x);
  other.mix_settings(y);
  EXPECT_NE(x.value(), y.value());
}

TEST(MuonSpectral, ArchiveWithoutTheFieldsReadsAsTheDefaults) {
  // An archive written before the spectral options: every field but those.
  torch::serialize::OutputArchive full;
  MuonOptions(0.03).spectral_update("hardcap").spectral_wd_beta(2.0).serialize(full);
  // Copy it without the spectral_* keys.
  torch::serialize::InputArchive in_full;
  read_back(full, in_full);
  torch::serialize::OutputArchive old;
  for (const auto& key : in_full.keys()) {
    if (key.rfind("spectral_", 0) == 0) continue;
    c10::IValue v;
    in_full.read(key, v);
    old.write(key, v);
  }
  torch::serialize::InputArchive in;
  read_back(old, in);
  MuonOptions back(0);
  back.serialize(in);
  EXPECT_EQ(back, MuonOptions(0.03));
}

TEST(MuonSpectral, FusedPassesSkipTheSpectralOptions) {
  // Contiguous fp32 CPU parameters take the fused passes (one batch per
  // step) unless a spectral option needs the plain path.
  const auto run = [](const MuonOptions& o) {
    auto p = seeded_randn({16, 16}, 4).requires_grad_(true);
    Muon opt({p}, o);
    p.mutable_grad() = seeded_randn({16, 16}, 5);
    const auto before = detail::fused_batches_run();
    opt.step();
    return detail::fused_batches_run() - before;
  };
  EXPECT_EQ(run(MuonOptions()), 1);
  EXPECT_EQ(run(MuonOptions().spectral_update("clip")), 0);
  EXPECT_EQ(run(MuonOptions().spectral_update("hardcap")), 0);
  EXPECT_EQ(run(MuonOptions(0.1).weight_decay(0.5).weight_decay_mode("spectral_clipped")), 0);
}

TEST(MuonSpectral, PolarGradTakesThemAndMopRefusesTheUpdate) {
  // PolarGrad's stage runs after step 4, whatever step 4 is: with a hardcap
  // at 0.1 (below the update's largest singular values) the step differs
  // from PolarGrad's own.
  const auto polargrad_step = [](const MuonOptions& o) {
    auto p = seeded_randn({6, 10}, 6).requires_grad_(true);
    OrthogonalizedVariant opt({p}, o, OrthogonalizedVariantOptions().kind(OrthogonalizedKind::kPolarGrad));
    p.mutable_grad() = seeded_randn({6, 10}, 7);
    opt.step();
    return p.detach();
  };
  const auto capped = polargrad_step(MuonOptions(0.01).spectral_update("hardcap").spectral_hardcap_beta(0.1));
  const auto plain = polargrad_step(MuonOptions(0.01));
  EXPECT_TRUE(at::isfinite(capped).all().item<bool>());
  EXPECT_GT((capped - plain).abs().max().item<double>(), 1e-4);
  // MOP's step 4 is the SVD polar factor: a spectral update is refused.
  auto q = seeded_randn({6, 10}, 8).requires_grad_(true);
  expect_value_error(
      [&] {
        OrthogonalizedVariant({q}, MuonOptions(0.01).spectral_update("clip"),
                              OrthogonalizedVariantOptions().kind(OrthogonalizedKind::kMop));
      },
      {"[muon::MOP]", "muon_spectral_update", "'clip'"});
}

// ---- the registry --------------------------------------------------------------

OptimizerConfig spectral_config() {
  OptimizerConfig config;
  apply_config_json(config, R"({"optimizer": "muon", "lr": 0.02, "weight_decay": 0.5,
                                "muon_weight_decay_mode": "spectral_clipped", "muon_spectral_wd_beta": 0.5,
                                "muon_spectral_update": "clip", "muon_spectral_sigma_min": 0.2,
                                "muon_spectral_sigma_max": 0.9,
                                "overrides": [{"match": {"name": "b.weight"},
                                               "set": {"muon_spectral_update": "hardcap",
                                                       "muon_spectral_hardcap_beta": 0.75}}]})");
  return config;
}

const std::vector<ParamSpec> kModel{{"a.weight", {12, 8}}, {"b.weight", {8, 12}},
                                    {"c.weight", {6, 2, 1, 5}}, {"d.weight", {10, 10}}};

TEST(MuonSpectral, BuiltFromAConfigAndExplained) {
  auto named = seeded_params(kModel, 50);
  const auto config = spectral_config();
  auto opt = make_optimizer(named, config);
  auto* muon = dynamic_cast<Muon*>(opt->find_part("muon"));
  ASSERT_NE(muon, nullptr);
  bool saw_clip = false;
  bool saw_hardcap = false;
  for (const auto& group : muon->param_groups()) {
    const auto& o = static_cast<const MuonOptions&>(group.options());
    EXPECT_EQ(o.weight_decay_mode(), WeightDecayMode::kSpectralClipped);
    EXPECT_EQ(o.spectral_wd_beta(), 0.5);
    EXPECT_EQ(o.spectral_sigma_min(), 0.2);
    EXPECT_EQ(o.spectral_sigma_max(), 0.9);
    saw_clip |= o.spectral_update() == SpectralUpdate::kClip;
    if (o.spectral_update() == SpectralUpdate::kHardcap) {
      saw_hardcap = true;
      EXPECT_EQ(o.spectral_hardcap_beta(), 0.75);
    }
  }
  EXPECT_TRUE(saw_clip);
  EXPECT_TRUE(saw_hardcap);
  const auto text = explain(named, config);
  EXPECT_NE(text.find("spectral_update=\"hardcap\""), std::string::npos) << text;
  EXPECT_NE(text.find("spectral_hardcap_beta=0.75"), std::string::npos) << text;

  // Another Muon-family entry reads the same muon_* fields.
  auto adaptive_config = spectral_config();
  adaptive_config.set("optimizer", "adaptive_muon");
  auto adaptive = make_optimizer(named, adaptive_config);
  auto* am = dynamic_cast<AdaptiveMuon*>(adaptive->find_part("adaptive_muon"));
  ASSERT_NE(am, nullptr);
  EXPECT_EQ(static_cast<const MuonOptions&>(am->param_groups()[0].options()).weight_decay_mode(),
            WeightDecayMode::kSpectralClipped);

  // Config values out of range are named.
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"muon_spectral_update", "\"soft\""},
           {"muon_spectral_hardcap_beta", "0"},
           {"muon_spectral_wd_beta", "-1"}}) {
    OptimizerConfig bad;
    expect_value_error([&] { apply_config_json(bad, "{\"" + field + "\": " + value + "}"); }, {field});
  }
  OptimizerConfig bad_bounds = spectral_config();
  bad_bounds.set("muon_spectral_sigma_min", 2.0);
  expect_value_error([&] { make_optimizer(named, bad_bounds); }, {"spectral_sigma_min", "2", "0.9"});
  OptimizerConfig bad_c = spectral_config();
  bad_c.set("weight_decay", 100.0);
  expect_value_error([&] { make_optimizer(named, bad_c); }, {"lr·weight_decay", "2"});
}

void set_grads(Named& named, int64_t step) {
  size_t i = 0;
  for (auto& item : named) {
    item.value().mutable_grad() = seeded_randn(item.value().sizes().vec(), 3001 * (step + 1) + i++);
  }
}

TEST(MuonSpectral, LayerwiseEqualsOneProcess) {
  const auto config = spectral_config();
  auto reference = seeded_params(kModel, 60);
  {
    auto opt = make_optimizer(reference, config);
    for (int64_t s = 0; s < 3; ++s) {
      set_grads(reference, s);
      opt->step();
    }
  }
  auto untouched = seeded_params(kModel, 60);
  for (const int world : {2, 3}) {
    run_ranks(world, [&](distributed::Group& group) {
      auto named = seeded_params(kModel, 60);
      distributed::DistributedLayout layout;
      layout.group = group;
      auto layered = config;
      layered.set("layout", "layerwise");
      auto opt = distributed::make_optimizer(named, layered, layout);
      EXPECT_NE(dynamic_cast<distributed::LayerwiseOptimizer*>(opt.get()), nullptr);
      for (int64_t s = 0; s < 3; ++s) {
        set_grads(named, s);
        opt->step();
      }
      // One owner runs the single-process code on the same data; 1e-5
      // leaves room only for BLAS summation order.
      for (const auto& item : reference) {
        const auto& whole = item.value().detach();
        const double diff = (named[item.key()].detach() - whole).abs().max().item<double>();
        EXPECT_LE(diff / whole.abs().max().item<double>(), 1e-5) << item.key() << " rank " << group.rank();
        // The options did something: the result is not the start.
        EXPECT_GT((whole - untouched[item.key()].detach()).abs().max().item<double>(), 1e-3);
      }
    });
  }
}

// tensor_parallel and sharded give each process a part of every matrix:
// both options are refused, naming the option, its value and the layout.
void expect_layout_refuses(const std::string& layout_kind) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {R"({"optimizer": "muon", "muon_spectral_update": "hardcap"})",
       {"muon_spectral_update", "'hardcap'", "'" + layout_kind + "'"}},
      {R"({"optimizer": "muon", "muon_weight_decay_mode": "spectral_clipped", "weight_decay": 0.1})",
       {"muon_weight_decay_mode", "'spectral_clipped'", "'" + layout_kind + "'"}},
  };
  for (const auto& [json, parts] : cases) {
    run_ranks(2, [&](distributed::Group& group) {
      Named named;
      distributed::DistributedLayout layout;
      const std::vector<int64_t> shape{8, 6};
      const auto rows = distributed::balanced_split_sizes(shape[0], 2);
      named.insert("w", distributed::local_rows(seeded_randn(shape, 9), rows, group.rank()).requires_grad_(true));
      if (layout_kind == "sharded") {
        layout.row_shards.emplace("w", distributed::RowShard(shape, group));
      } else {
        layout.tensor_parallel.emplace("w", distributed::TensorParallelShard(shape, 0, group));
      }
      OptimizerConfig config;
      apply_config_json(config, json);
      config.set("layout", layout_kind);
      expect_value_error([&] { distributed::make_optimizer(named, config, layout); }, parts);
    });
  }
}

TEST(MuonSpectral, TensorParallelRefusesNamingOptionAndLayout) { expect_layout_refuses("tensor_parallel"); }

TEST(MuonSpectral, ShardedRefusesNamingOptionAndLayout) { expect_layout_refuses("sharded"); }

}  // namespace
}  // namespace muon::test
