// Tests of muon::AdaptiveMuon: the NorMuon, AdaMuon and NAMO formulas documented in
// muon/optim/adaptive_muon.h against plain reference steps written with
// tensor ops, state shapes, save/load and errors.
#include <gtest/gtest.h>

#include "archive_util.h"
#include "expect_util.h"
#include "reference.h"
#include "tensor_util.h"

#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <filesystem>

#include "checkpoint_model.h"
#include "muon/compat.h"
#include "muon/optim/adaptive_muon.h"

namespace muon::test {
namespace {

// Newton–Schulz in fp64, You's quintic schedule, 5 steps (reference.h).
at::Tensor plain_ns(const at::Tensor& g) {
  return muon::test::reference_newton_schulz(g, muon::test::kQuintic, 5);
}

struct Ref {
  at::Tensor p;  // fp64, (rows, cols)
  at::Tensor m;
  at::Tensor v;
};

// One step: decoupled wd, EMA momentum, Nesterov, NS, then the second moment
// exactly as the header documents it.
// What every mode's reference step does first: decoupled wd on `p`, the EMA
// momentum `m` (zeros at the first step), the Nesterov input u and its
// Newton–Schulz o. Returns {u, o}.
std::pair<at::Tensor, at::Tensor> decay_momentum_ns(at::Tensor& p, at::Tensor& m, const at::Tensor& g, double lr,
                                                    double mu, double wd) {
  if (!m.defined()) m = at::zeros_like(p);
  p = p * (1 - lr * wd);
  m = mu * m + (1 - mu) * g;
  const auto u = (1 - mu) * g + mu * m;
  return {u, plain_ns(u)};
}

void ref_step(Ref& s, const at::Tensor& g, bool normuon, double lr, double mu, double wd,
              double beta2, double eps, double extra) {
  const double rows = static_cast<double>(s.p.size(0));
  const double cols = static_cast<double>(s.p.size(1));
  const auto o = decay_momentum_ns(s.p, s.m, g, lr, mu, wd).second;
  at::Tensor update;
  if (normuon) {
    const auto row_mean = (o * o).sum(1, true) / cols;
    s.v = s.v.defined() ? beta2 * s.v + (1 - beta2) * row_mean : (1 - beta2) * row_mean;
    auto n = o / (s.v.sqrt() + eps);
    n = n * (o.norm().item<double>() / std::max(n.norm().item<double>(), eps));
    update = n * std::sqrt(std::max(rows, cols)) * extra;  // spectral scale
  } else {
    s.v = s.v.defined() ? beta2 * s.v + (1 - beta2) * o * o : (1 - beta2) * o * o;
    const auto n = o / (s.v.sqrt() + eps);
    update = n * (0.2 * std::sqrt(rows * cols) / std::max(n.norm().item<double>(), eps)) * extra;
  }
  s.p = s.p - lr * update;
}

// lr, momentum, weight decay, beta2, eps and extra_scale_factor of the
// comparisons with the reference steps.
constexpr std::array<double, 6> kReferenceHyper{0.05, 0.9, 0.1, 0.9, 1e-8, 1.5};

void check_against_reference(AdaptiveMode mode, std::vector<int64_t> shape) {
  at::manual_seed(7);
  const auto [lr, mu, wd, beta2, eps, extra] = kReferenceHyper;
  auto p = leaf(at::randn(shape, at::kDouble));
  Ref ref{p.detach().clone(), {}, {}};
  auto options = MuonOptions(lr)
                     .momentum(mu)
                     .weight_decay(wd)
                     .scale_mode("spectral")
                     .extra_scale_factor(extra)
                     .ns_compute_dtype(at::kDouble);
  AdaptiveMuon opt({p}, options, AdaptiveMuonOptions().mode(mode).beta2(beta2).eps(eps));
  for (int step = 0; step < 4; ++step) {
    const auto g = at::randn(shape, at::kDouble);
    p.mutable_grad() = g.clone();
    opt.step();
    ref_step(ref, g, mode == AdaptiveMode::kNorMuon, lr, mu, wd, beta2, eps, extra);
    // Both sides compute in fp64; the library's Newton–Schulz groups the
    // products differently (symmetric kernels), so agreement is to fp64
    // rounding amplified by five polynomial steps: 1e-9 relative is ample
    // and still fails for any formula difference (those are O(1)).
    ASSERT_TRUE(at::allclose(p.detach(), ref.p, 1e-9, 1e-12))
        << to_string(mode) << " step " << step << " max diff "
        << (p.detach() - ref.p).abs().max().item<double>();
  }
  const auto& st = static_cast<const AdaptiveMuonParamState&>(
      *opt.state().at(muon::compat::state_key(p)));
  EXPECT_EQ(st.step(), 4);
  EXPECT_TRUE(at::allclose(st.second_moment(), ref.v, 1e-9, 1e-15));
}

TEST(AdaptiveMuon, NorMuonEqualsTheDocumentedFormula) {
  check_against_reference(AdaptiveMode::kNorMuon, {6, 10});
  check_against_reference(AdaptiveMode::kNorMuon, {12, 5});
}

TEST(AdaptiveMuon, AdaMuonEqualsTheDocumentedFormula) {
  check_against_reference(AdaptiveMode::kAdaMuon, {6, 10});
  check_against_reference(AdaptiveMode::kAdaMuon, {12, 5});
}

// NAMO, from Emerging-Optimizers' adaptive_muon.py (moment2_method "namo")
// written out in fp64: decoupled decay, EMA momentum, Nesterov u, O =
// NS(u), v ← β2·v + (1 − β2)·‖g‖², update = O·‖u‖/(√v + ε)·scale.
struct NamoRef {
  at::Tensor p;  // fp64, (rows, cols)
  at::Tensor m;
  double v = 0;
};

void namo_ref_step(NamoRef& s, const at::Tensor& g, double lr, double mu, double wd, double beta2,
                   double eps, double extra) {
  const double rows = static_cast<double>(s.p.size(0));
  const double cols = static_cast<double>(s.p.size(1));
  const auto [u, o] = decay_momentum_ns(s.p, s.m, g, lr, mu, wd);
  s.v = beta2 * s.v + (1 - beta2) * (g * g).sum().item<double>();
  const double alpha = std::sqrt((u * u).sum().item<double>()) / (std::sqrt(s.v) + eps);
  s.p = s.p - lr * o * alpha * std::sqrt(std::max(rows, cols)) * extra;  // spectral scale
}

TEST(AdaptiveMuon, NamoEqualsEmergingOptimizersArithmeticInFp32) {
  const auto [lr, mu, wd, beta2, eps, extra] = kReferenceHyper;
  // Wide, tall and a conv weight (flattened to (out, in·kh·kw) = (4, 12)).
  for (const auto& shape : std::vector<std::vector<int64_t>>{{6, 10}, {12, 5}, {4, 3, 2, 2}}) {
    at::manual_seed(11);
    auto p = leaf(at::randn(shape));
    const auto rows = shape[0];
    const auto cols = p.numel() / rows;
    NamoRef ref{p.detach().to(at::kDouble).reshape({rows, cols}), {}, 0};
    AdaptiveMuon opt({p},
                     MuonOptions(lr).momentum(mu).weight_decay(wd).scale_mode("spectral")
                         .extra_scale_factor(extra),
                     AdaptiveMuonOptions().mode("namo").beta2(beta2).eps(eps));
    for (int step = 0; step < 5; ++step) {
      const auto g = at::randn(shape);
      p.mutable_grad() = g.clone();
      opt.step();
      namo_ref_step(ref, g.to(at::kDouble).reshape({rows, cols}), lr, mu, wd, beta2, eps, extra);
      // The library steps in fp32 (Newton–Schulz included) and the reference
      // in fp64 with the same five quintic steps, so only rounding differs:
      // fp32's 6e-8 over the O(100) operations per element of a step, grown
      // at most ~3.4⁵ by the quintic's slope on small singular values, is
      // ≲1e-5 of the update, and lr·update is a tenth of the parameters:
      // 1e-5 of the parameters' scale holds on any CPU, while a formula
      // difference (a missing ‖u‖ or √v, v of O instead of g) is O(lr).
      const auto got = p.detach().to(at::kDouble).reshape({rows, cols});
      const double scale = ref.p.abs().max().item<double>();
      ASSERT_LE((got - ref.p).abs().max().item<double>(), 1e-5 * scale)
          << "shape " << c10::IntArrayRef(shape) << " step " << step;
    }
    const auto& st = static_cast<const AdaptiveMuonParamState&>(
        *opt.state().at(muon::compat::state_key(p)));
    EXPECT_EQ(st.second_moment().sizes().vec(), (std::vector<int64_t>{rows, 1}));
    // One scalar, one copy per row.
    EXPECT_TRUE(at::all(st.second_moment() == st.second_moment()[0][0]).item<bool>());
    EXPECT_NEAR(st.second_moment()[0][0].item<double>(), ref.v, 1e-5 * ref.v);
  }
}

TEST(AdaptiveMuon, NamoUpdateIgnoresTheGradientScale) {
  // Independent of the reference: ‖u‖ and √v both scale with the gradient,
  // so the same gradients times 1e-2 or 1e2 give the same parameters (up to
  // Newton–Schulz's normalization eps 1e-7 against ‖u‖ ≳ 1e-2, and fp32
  // rounding: ~1e-6 of a step), where a missing ‖u‖ or √v would scale each
  // step by 1e±2.
  std::vector<at::Tensor> results;
  for (const double scale : {1e-2, 1.0, 1e2}) {
    at::manual_seed(3);
    auto p = leaf(at::randn({8, 6}));
    AdaptiveMuon opt({p}, MuonOptions(0.05), AdaptiveMuonOptions().mode("namo"));
    for (int step = 0; step < 3; ++step) {
      p.mutable_grad() = scale * at::randn({8, 6});
      opt.step();
    }
    results.push_back(p.detach());
  }
  EXPECT_TRUE(at::allclose(results[0], results[1], 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(results[2], results[1], 1e-5, 1e-5));
}

// NAMO's second moment (one scalar per matrix, kept per row) in checkpoints:
// sharded at 2 ranks → one process → sharded at 3, each leg equal to an
// unbroken single-process run. Row shards sum the two norms over the ranks
// in another order than one process: equal to 1e-5 of the parameters, as
// the layout tests; a second moment saved or resharded wrongly (a shard's
// own norm, zeros) is off by a fraction of the update.
namespace ckpt = muon::test::checkpoint;

void namo_leg(const std::string& kind, int world, const std::string& in, const std::string& out,
              int64_t from, int64_t to, const ckpt::Named& reference, const std::string& what) {
  ckpt::reshard_leg(kind, world, in, out, from, to, "adaptive_muon/namo", what,
                    [&](ckpt::Rank& r, const distributed::Group& group) {
                      for (size_t k = 0; k < ckpt::kModel.size() && !reference.is_empty(); ++k) {
                        const auto& name = ckpt::kModel[k].first;
                        const auto expected = r.local[k](reference[name]);
                        if (expected.numel() == 0) continue;
                        const double err = (r.named[name].detach() - expected).abs().max().item<double>() /
                                           reference[name].abs().max().item<double>();
                        EXPECT_LE(err, 1e-5) << what << " " << name << " rank " << group.rank();
                      }
                    });
}

TEST(AdaptiveMuon, NamoCheckpointsReshard) {
  ckpt::Named after3;
  ckpt::Named after4;
  run_ranks(1, [&](distributed::Group& g) {
    ckpt::Rank r("none", g, "adaptive_muon/namo");
    r.train(0, 3);
    for (const auto& item : r.named) after3.insert(item.key(), item.value().detach().clone());
    r.train(3, 4);
    for (const auto& item : r.named) after4.insert(item.key(), item.value().detach().clone());
  });
  const auto dir = std::filesystem::temp_directory_path() /
                   ("muon_namo_reshard_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto d = [&](const char* leg_name) { return (dir / leg_name).string(); };
  namo_leg("sharded", 2, "", d("a"), 0, 2, ckpt::Named(), "sharded W=2");
  namo_leg("none", 1, d("a"), d("b"), 2, 3, after3, "single from sharded W=2");
  namo_leg("sharded", 3, d("b"), d("c"), 3, 4, after4, "sharded W=3 from single");
  std::filesystem::remove_all(dir);
}

TEST(AdaptiveMuon, AdaMuonUpdateHasRms02) {
  // Independent of the reference: the RMS alignment makes every step's RMS
  // exactly 0.2·lr (no weight decay), whatever the gradient's scale.
  auto p = leaf(at::zeros({8, 16}));
  AdaptiveMuon opt({p}, MuonOptions(0.1), AdaptiveMuonOptions().mode("adamuon"));
  for (const double scale : {1e-3, 1.0, 1e3}) {
    const auto before = p.detach().clone();
    p.mutable_grad() = scale * at::randn({8, 16});
    opt.step();
    const double rms = (p.detach() - before).pow(2).mean().sqrt().item<double>();
    EXPECT_NEAR(rms, 0.02, 1e-6) << "gradient scale " << scale;  // fp32 rounding
  }
}

TEST(AdaptiveMuon, NorMuonKeepsMuonsUpdateNorm) {
  // Norm preservation: with scale 1 (unit_rms_norm on a square matrix) the
  // update's Frobenius norm equals that of the Newton–Schulz output.
  at::manual_seed(2);
  auto p = leaf(at::zeros({8, 8}, at::kDouble));
  const auto g = at::randn({8, 8}, at::kDouble);
  AdaptiveMuon opt({p}, MuonOptions(1.0).nesterov(false).momentum(0.0).scale_mode("unit_rms_norm")
                            .ns_compute_dtype(at::kDouble));
  p.mutable_grad() = g.clone();
  opt.step();
  EXPECT_NEAR(p.detach().norm().item<double>(), plain_ns(g).norm().item<double>(), 1e-9);
}

TEST(AdaptiveMuon, SecondMomentShapesAndStateBytes) {
  auto w = leaf(at::randn({6, 4}));
  auto conv = leaf(at::randn({4, 3, 2, 2}));
  for (const auto* mode : {"normuon", "adamuon", "namo"}) {
    AdaptiveMuon opt({w, conv}, MuonOptions(), AdaptiveMuonOptions().mode(mode));
    w.mutable_grad() = at::randn({6, 4});
    conv.mutable_grad() = at::randn({4, 3, 2, 2});
    opt.step();
    const auto& sw = static_cast<const AdaptiveMuonParamState&>(*opt.state().at(muon::compat::state_key(w)));
    const auto& sc = static_cast<const AdaptiveMuonParamState&>(*opt.state().at(muon::compat::state_key(conv)));
    const bool row = std::string(mode) != "adamuon";
    EXPECT_EQ(sw.second_moment().sizes().vec(), (std::vector<int64_t>{6, row ? 1 : 4}));
    EXPECT_EQ(sc.second_moment().sizes().vec(), (std::vector<int64_t>{4, row ? 1 : 12}));
    const int64_t momentum = (24 + 48) * 4;
    const int64_t second = row ? (6 + 4) * 4 : (24 + 48) * 4;
    EXPECT_EQ(opt.state_bytes(), momentum + second) << mode;
  }
}

// Six steps of AdaptiveMuon in `mode` (beta2 `beta2`) straight equal three,
// save, load into one of the same mode with the default beta2 (the
// archive's is restored) and three more, bit for bit. Returns the run's
// start and the archive.
std::pair<at::Tensor, std::string> expect_resumed_run_bit_identical(uint64_t seed, const std::vector<int64_t>& shape,
                                                                   const std::string& mode, double beta2) {
  const auto data = gradient_run(seed, shape, 6);
  const auto adaptive = AdaptiveMuonOptions().mode(mode).beta2(beta2);
  auto a = leaf(data.init);
  AdaptiveMuon straight({a}, MuonOptions(0.02), adaptive);
  data.run(a, straight, 0, 6);
  auto b = leaf(data.init);
  AdaptiveMuon first({b}, MuonOptions(0.02), adaptive);
  data.run(b, first, 0, 3);
  const auto bytes = save_to_string(first);
  auto c = leaf(b.detach());
  AdaptiveMuon second({c}, MuonOptions(0.02), AdaptiveMuonOptions().mode(mode));
  load_from_string(second, bytes);
  EXPECT_DOUBLE_EQ(second.adaptive_options().beta2(), beta2);  // restored from the archive
  data.run(c, second, 3, 6);
  EXPECT_TRUE(at::equal(a.detach(), c.detach()));
  return {data.init, bytes};
}

TEST(AdaptiveMuon, ResumedRunIsBitIdentical) {
  const auto [init, bytes] = expect_resumed_run_bit_identical(4, {5, 9}, "adamuon", 0.8);

  // Another mode, or plain Muon, does not load it.
  auto d = leaf(init);
  AdaptiveMuon other({d}, MuonOptions(0.02), AdaptiveMuonOptions().mode("normuon"));
  EXPECT_THROW(load_from_string(other, bytes), c10::ValueError);
  muon::Muon plain({d});
  EXPECT_THROW(load_from_string(plain, bytes), c10::ValueError);
}

TEST(AdaptiveMuon, NamoResumedRunIsBitIdentical) {
  const auto [init, bytes] = expect_resumed_run_bit_identical(5, {6, 4}, "namo", 0.7);
  // A normuon optimizer (same state shape) does not load a namo archive.
  auto d = leaf(init);
  AdaptiveMuon other({d}, MuonOptions(0.02), AdaptiveMuonOptions().mode("normuon"));
  EXPECT_THROW(load_from_string(other, bytes), c10::ValueError);
}

TEST(AdaptiveMuon, Errors) {
  auto p = leaf(at::randn({4, 6}));
  expect_value_error([] { AdaptiveMuonOptions().mode("adam"); },
                     {"[muon::AdaptiveMuon]", "mode", "'adam'", "normuon, adamuon, namo"});
  // As in Emerging-Optimizers: namo's second moment is of the raw gradient.
  expect_value_error(
      [&] {
        AdaptiveMuon opt({p}, MuonOptions().weight_decay(0.1).weight_decay_mode("l2"),
                         AdaptiveMuonOptions().mode("namo"));
      },
      {"param group 0", "weight_decay_mode l2", "namo"});
  expect_value_error([&] { AdaptiveMuon opt({p}, MuonOptions(), AdaptiveMuonOptions().beta2(1.0)); },
                     {"beta2", "[0, 1)", "1"});
  expect_value_error([&] { AdaptiveMuon opt({p}, MuonOptions(), AdaptiveMuonOptions().eps(0)); },
                     {"eps", "0"});
  expect_value_error([&] { AdaptiveMuon opt({p}, MuonOptions().split_sizes({2, 1, 1})); },
                     {"split_sizes", "plain matrices"});
  auto e = leaf(at::randn({2, 4, 6}));
  expect_value_error([&] { AdaptiveMuon opt({e}, MuonOptions().stacked_experts(true)); },
                     {"stacked_experts"});
}

TEST(AdaptiveMuon, ErrorsNameTheGroupThatCausedThem) {
  // Checked at construction and again at each step, naming the group.
  auto a = leaf(at::randn({4, 6}));
  auto b = leaf(at::randn({6, 4}));
  std::vector<torch::optim::OptimizerParamGroup> groups{
      torch::optim::OptimizerParamGroup({a}),
      torch::optim::OptimizerParamGroup({b}, std::make_unique<MuonOptions>(
                                                 MuonOptions().split_sizes({3, 3})))};
  expect_value_error([&] { AdaptiveMuon opt(groups, MuonOptions()); },
                     {"param group 1", "split_sizes"});
  AdaptiveMuon opt({torch::optim::OptimizerParamGroup({a}), torch::optim::OptimizerParamGroup({b})},
                   MuonOptions());
  static_cast<MuonOptions&>(opt.param_groups()[1].options()).stacked_experts(true);
  a.mutable_grad() = at::randn({4, 6});
  b.mutable_grad() = at::randn({6, 4});
  const auto before = a.detach().clone();
  expect_value_error([&] { opt.step(); }, {"param group 1", "stacked_experts"});
  EXPECT_TRUE(at::equal(a.detach(), before));  // rejected before any parameter changed
}

}  // namespace
}  // namespace muon::test
