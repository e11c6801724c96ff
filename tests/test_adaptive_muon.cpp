// Tests of muon::AdaptiveMuon: the NorMuon and AdaMuon formulas documented in
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
#include <vector>

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
void ref_step(Ref& s, const at::Tensor& g, bool normuon, double lr, double mu, double wd,
              double beta2, double eps, double extra) {
  const double rows = static_cast<double>(s.p.size(0));
  const double cols = static_cast<double>(s.p.size(1));
  if (!s.m.defined()) s.m = at::zeros_like(s.p);
  s.p = s.p * (1 - lr * wd);
  s.m = mu * s.m + (1 - mu) * g;
  const auto u = (1 - mu) * g + mu * s.m;
  const auto o = plain_ns(u);
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

void check_against_reference(AdaptiveMode mode, std::vector<int64_t> shape) {
  at::manual_seed(7);
  const double lr = 0.05;
  const double mu = 0.9;
  const double wd = 0.1;
  const double beta2 = 0.9;
  const double eps = 1e-8;
  const double extra = 1.5;
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
  for (const auto* mode : {"normuon", "adamuon"}) {
    AdaptiveMuon opt({w, conv}, MuonOptions(), AdaptiveMuonOptions().mode(mode));
    w.mutable_grad() = at::randn({6, 4});
    conv.mutable_grad() = at::randn({4, 3, 2, 2});
    opt.step();
    const auto& sw = static_cast<const AdaptiveMuonParamState&>(*opt.state().at(muon::compat::state_key(w)));
    const auto& sc = static_cast<const AdaptiveMuonParamState&>(*opt.state().at(muon::compat::state_key(conv)));
    const bool row = std::string(mode) == "normuon";
    EXPECT_EQ(sw.second_moment().sizes().vec(), (std::vector<int64_t>{6, row ? 1 : 4}));
    EXPECT_EQ(sc.second_moment().sizes().vec(), (std::vector<int64_t>{4, row ? 1 : 12}));
    const int64_t momentum = (24 + 48) * 4;
    const int64_t second = row ? (6 + 4) * 4 : (24 + 48) * 4;
    EXPECT_EQ(opt.state_bytes(), momentum + second) << mode;
  }
}

TEST(AdaptiveMuon, ResumedRunIsBitIdentical) {
  const auto data = gradient_run(4, {5, 9}, 6);
  const auto adaptive = AdaptiveMuonOptions().mode("adamuon").beta2(0.8);
  auto a = leaf(data.init);
  AdaptiveMuon straight({a}, MuonOptions(0.02), adaptive);
  data.run(a, straight, 0, 6);
  auto b = leaf(data.init);
  AdaptiveMuon first({b}, MuonOptions(0.02), adaptive);
  data.run(b, first, 0, 3);
  const auto bytes = save_to_string(first);
  auto c = leaf(b.detach());
  AdaptiveMuon second({c}, MuonOptions(0.02), AdaptiveMuonOptions().mode("adamuon"));
  load_from_string(second, bytes);
  EXPECT_DOUBLE_EQ(second.adaptive_options().beta2(), 0.8);  // restored from the archive
  data.run(c, second, 3, 6);
  EXPECT_TRUE(at::equal(a.detach(), c.detach()));

  // Another mode, or plain Muon, does not load it.
  auto d = leaf(data.init);
  AdaptiveMuon other({d}, MuonOptions(0.02), AdaptiveMuonOptions().mode("normuon"));
  EXPECT_THROW(load_from_string(other, bytes), c10::ValueError);
  muon::Muon plain({d});
  EXPECT_THROW(load_from_string(plain, bytes), c10::ValueError);
}

TEST(AdaptiveMuon, Errors) {
  auto p = leaf(at::randn({4, 6}));
  expect_value_error([] { AdaptiveMuonOptions().mode("adam"); },
                     {"[muon::AdaptiveMuon]", "mode", "'adam'", "normuon, adamuon"});
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
