// Cautious weight decay (MuonOptions::weight_decay_mode "cautious"): at step 6,
// p ← p − lr·wd·p·[p·u >= 0] − u with u = lr·alpha·o the final update, as
// microsoft/dion's muon_update_post_orthogonalize. Against a plain fp64
// reference; the mask mixed and asserted exactly; the mask taken from the
// update after every UpdateStage of the Muon family; options, archives,
// the registry and Scion's refusal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "archive_util.h"
#include "dist_util.h"
#include "expect_util.h"
#include "muon/config.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/muon.h"
#include "muon/optim/orthogonalized_family.h"
#include "muon/registry.h"
#include "reference.h"

namespace muon::test {
namespace {

constexpr double kLr = 0.02;
constexpr double kWd = 0.5;
constexpr double kMu = 0.95;
constexpr int kSteps = 5;

// One step of Muon with cautious weight decay in fp64, from the formula:
// EMA momentum, Nesterov, quintic Newton–Schulz (5 steps) per matrix,
// shape_scaling, then p ← p − lr·wd·p·[p·o >= 0] − lr·o. Returns the
// scaled update o, for the test's margin check.
at::Tensor reference_step(at::Tensor& p, at::Tensor& buf, const at::Tensor& grad) {
  const auto g = grad.to(at::kDouble);
  buf = kMu * buf + (1 - kMu) * g;
  const auto u = (1 - kMu) * g + kMu * buf;
  const auto m = u.reshape({u.size(0), -1});
  const double rows = static_cast<double>(m.size(0));
  const double cols = static_cast<double>(m.size(1));
  const auto o = (reference_newton_schulz(m, kQuintic, 5) * std::sqrt(std::max(1.0, rows / cols)))
                     .reshape(p.sizes());
  const auto mask = (p * o).ge(0).to(at::kDouble);
  p = p - kLr * kWd * p * mask - kLr * o;
  return o;
}

TEST(MuonCautious, MatchesTheFp64Formula) {
  const std::vector<std::vector<int64_t>> shapes{{12, 8}, {8, 12}, {6, 2, 1, 5}, {10, 10}};
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> ref;
  std::vector<at::Tensor> bufs;
  for (size_t k = 0; k < shapes.size(); ++k) {
    params.push_back(seeded_randn(shapes[k], 10 + k).requires_grad_(true));
    ref.push_back(params.back().detach().to(at::kDouble));
    bufs.push_back(at::zeros_like(ref.back()));
  }
  Muon opt(params, MuonOptions(kLr).weight_decay(kWd).weight_decay_mode("cautious"));
  double min_margin = 1.0;
  for (int s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < shapes.size(); ++k) {
      const auto g = seeded_randn(shapes[k], 500 + 10 * s + k);
      params[k].mutable_grad() = g;
      const auto p_before = ref[k];
      const auto o = reference_step(ref[k], bufs[k], g);
      // How close the decisive signs come to flipping: |o| and |p| relative
      // to their largest entries.
      min_margin = std::min(min_margin, (o.abs().min() / o.abs().max()).item<double>());
      min_margin =
          std::min(min_margin, (p_before.abs().min() / p_before.abs().max()).item<double>());
    }
    opt.step();
  }
  // fp32 Newton–Schulz and fp32 updates differ from the fp64 formula by
  // ~1e-7 relative per operation (products of n ≤ 12 terms, five NS steps of
  // matrices with spectral norm ≤ 1, five optimizer steps): ~1e-6 of the
  // parameters, under 1e-5 on any CPU whatever its summation order. The
  // masks agree because no entry of o or p comes within 1e-5 of its
  // largest (checked below), far beyond that error, so no sign can differ.
  EXPECT_GT(min_margin, 1e-5) << "a decisive sign is within rounding of flipping: change the seeds";
  for (size_t k = 0; k < shapes.size(); ++k) {
    const double err = (params[k].detach().to(at::kDouble) - ref[k]).abs().max().item<double>() /
                       ref[k].abs().max().item<double>();
    EXPECT_LE(err, 1e-5) << "parameter " << k;
  }
}

// One fp64 step of `make`'s optimizer from p0 with gradient g, wd as given.
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(at::Tensor&, double wd)>;

at::Tensor one_step(const Factory& make, const at::Tensor& p0, const at::Tensor& g, double wd) {
  auto p = p0.clone().requires_grad_(true);
  auto opt = make(p, wd);
  p.mutable_grad() = g.clone();
  opt->step();
  return p.detach();
}

// Whatever stage rewrites the update, the mask is the final update's: with
// d = p0 − p_without_decay (= lr·alpha·o, the update subtracted), elements
// where p0·d < 0 are changed by the update alone (bit for bit the step
// without decay) and the others also lose lr·wd·p0. fp64 parameters: both
// runs take the same plain path.
void expect_mask_of_final_update(const Factory& make, const std::string& what) {
  const auto p0 = seeded_randn({12, 9}, 77).to(at::kDouble);
  const auto g = seeded_randn({12, 9}, 78).to(at::kDouble);
  const auto plain = one_step(make, p0, g, 0.0);
  const auto cautious = one_step(make, p0, g, kWd);
  const auto d = p0 - plain;
  const auto keep = (p0 * d).lt(0);
  const auto decays = keep.logical_not();
  const int64_t kept = keep.sum().item<int64_t>();
  ASSERT_GT(kept, 0) << what << ": the mask is not mixed";
  ASSERT_LT(kept, p0.numel()) << what << ": the mask is not mixed";
  // Masked out: p0 − 0·coeff = p0 exactly, then the same update.
  EXPECT_TRUE(at::equal(cautious.masked_select(keep), plain.masked_select(keep))) << what;
  // Decayed: p0 − lr·wd·p0 − d, to fp64 rounding.
  const auto expected = plain - kLr * kWd * p0;
  EXPECT_LE((cautious - expected).masked_select(decays).abs().max().item<double>(), 1e-13) << what;
  EXPECT_GT((cautious - plain).masked_select(decays).abs().min().item<double>(), 1e-6) << what;
}

MuonOptions fp64_options(double wd) {
  return MuonOptions(kLr)
      .weight_decay(wd)
      .weight_decay_mode("cautious")
      .ns_compute_dtype(at::kDouble);
}

TEST(MuonCautious, MaskIsMixedAndExact) {
  expect_mask_of_final_update(
      [](at::Tensor& p, double wd) {
        return std::make_unique<Muon>(std::vector<at::Tensor>{p}, fp64_options(wd));
      },
      "muon");
}

TEST(MuonCautious, MaskOfTheFinalUpdateInTheFamily) {
  for (const std::string mode : {"normuon", "adamuon", "namo"}) {
    expect_mask_of_final_update(
        [&](at::Tensor& p, double wd) {
          return std::make_unique<AdaptiveMuon>(std::vector<at::Tensor>{p}, fp64_options(wd),
                                                AdaptiveMuonOptions().mode(mode));
        },
        mode);
  }
  for (const auto kind : {OrthogonalizedKind::kPolarGrad, OrthogonalizedKind::kMop}) {
    expect_mask_of_final_update(
        [&](at::Tensor& p, double wd) {
          return std::make_unique<OrthogonalizedVariant>(std::vector<at::Tensor>{p},
                                                         fp64_options(wd),
                                                         OrthogonalizedVariantOptions().kind(kind));
        },
        to_string(kind));
  }
}

TEST(MuonCautious, NoDecayIsDecoupledWithoutDecay) {
  // wd 0: the fused passes take the group, as they take decoupled's.
  auto a = seeded_randn({16, 24}, 5).requires_grad_(true);
  auto b = a.detach().clone().requires_grad_(true);
  Muon oa({a}, MuonOptions(kLr).weight_decay_mode("cautious"));
  Muon ob({b}, MuonOptions(kLr));
  for (int s = 0; s < 3; ++s) {
    a.mutable_grad() = seeded_randn({16, 24}, 90 + s);
    b.mutable_grad() = a.grad().clone();
    oa.step();
    ob.step();
  }
  EXPECT_TRUE(at::equal(a.detach(), b.detach()));
}

TEST(MuonCautious, OptionsArchivesAndTheRegistry) {
  EXPECT_EQ(to_string(WeightDecayMode::kCautious), "cautious");
  EXPECT_EQ(parse_weight_decay_mode("cautious"), WeightDecayMode::kCautious);
  expect_value_error([] { MuonOptions().weight_decay_mode("cautios"); },
                     {"weight_decay_mode", "'cautios'", "cautious"});
  // Saved and loaded: the mode survives, the run resumes bit-identically.
  auto p = seeded_randn({8, 6}, 3).requires_grad_(true);
  Muon opt({p}, MuonOptions(kLr).weight_decay(kWd).weight_decay_mode("cautious"));
  p.mutable_grad() = seeded_randn({8, 6}, 4);
  opt.step();
  const auto bytes = save_to_string(opt);
  auto q = p.detach().clone().requires_grad_(true);
  Muon resumed({q}, MuonOptions(kLr));
  load_from_string(resumed, bytes);
  EXPECT_EQ(
      static_cast<const MuonOptions&>(resumed.param_groups()[0].options()).weight_decay_mode(),
      WeightDecayMode::kCautious);
  p.mutable_grad() = seeded_randn({8, 6}, 5);
  q.mutable_grad() = p.grad().clone();
  opt.step();
  resumed.step();
  EXPECT_TRUE(at::equal(p.detach(), q.detach()));

  // The config key muon_weight_decay_mode, for every Muon-family entry.
  for (const std::string name :
       {"muon", "adaptive_muon", "polargrad", "spel", "muon_hyperball", "mop"}) {
    auto named = seeded_params({{"w", {8, 6}}}, 40);
    OptimizerConfig config;
    apply_config_json(config,
                      R"({"lr": 0.02, "weight_decay": 0.1, "muon_weight_decay_mode": "cautious"})");
    config.set("optimizer", name);
    auto built = make_optimizer(named, config);
    auto* part = dynamic_cast<Muon*>(built->find_part(name));
    ASSERT_NE(part, nullptr) << name;
    EXPECT_EQ(
        static_cast<const MuonOptions&>(part->param_groups()[0].options()).weight_decay_mode(),
        WeightDecayMode::kCautious)
        << name;
  }
}

// Scion's weight decay is the Frank–Wolfe step W ← (1 − lr)·W − lr·ρ·O
// (weight_decay fixed to 1, decoupled): a mask would leave the constraint
// set, so cautious is refused, naming the mode.
TEST(MuonCautious, ScionRefusesIt) {
  auto p = seeded_randn({8, 6}, 3).requires_grad_(true);
  const auto before = p.detach().clone();
  expect_value_error(
      [&] {
        OrthogonalizedVariant(
            {p}, MuonOptions(0.02).nesterov(false).weight_decay(1.0).weight_decay_mode("cautious"),
            OrthogonalizedVariantOptions().kind(OrthogonalizedKind::kScion));
      },
      {"[muon::Scion]", "weight_decay_mode", "cautious"});
  EXPECT_TRUE(at::equal(p.detach(), before));
}

}  // namespace
}  // namespace muon::test
