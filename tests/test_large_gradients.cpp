// Large finite gradients and the ranges of the second-moment optimizers:
// LaProp, Simplified AdEMAMix and SOAP's Adam on gradients of 1e20 follow
// an fp64 run of the published update over three steps (g² overflows fp32
// there; the second moment itself does not), and option values whose
// arithmetic makes NaN from finite gradients (eps 0, NorDion2's muon_beta2
// above 1, Dion2's ef_decay above 1) are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "elementwise_cases.h"
#include "expect_util.h"
#include "muon/optim/dion2.h"
#include "muon/optim/laprop.h"
#include "muon/optim/sim_ademamix.h"
#include "muon/optim/soap.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

constexpr double kHuge = 1e20;  // g² = 1e40 overflows fp32 (max ≈ 3.4e38)

std::vector<double> doubles_of(const at::Tensor& t) {
  const auto d = t.detach().to(at::kDouble).contiguous().reshape({-1});
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// The gradients of the three steps: N(0, 1)·1e20, exactly as fp32 holds them.
std::vector<at::Tensor> huge_gradients(int64_t n) {
  at::manual_seed(17);
  std::vector<at::Tensor> out;
  for (int s = 0; s < 3; ++s) out.push_back(at::randn({n}).mul_(kHuge));
  return out;
}

// The tolerance: an fp32 step rounds ~20 times (2^-24 each) on values of at
// most |p| + lr·|u|, |u| ≤ 1 + alpha (normalized updates); three steps.
void expect_follows(const at::Tensor& p, const std::vector<double>& ref, double lr, double u_max,
                    const std::string& what) {
  const auto got = doubles_of(p);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    const double bound = 3 * 20 * std::ldexp(std::abs(ref[i]) + lr * u_max, -24);
    EXPECT_NEAR(got[i], ref[i], bound) << what << " element " << i;
  }
}

// The fp64 moments and parameter of a reference run.
struct Fp64Run {
  std::vector<double> p, m, v;
};

// Three steps of `Opt` with options `o` on a 64-element parameter and
// gradients of 1e20, each against `reference` (which steps the fp64 run
// from step t's gradient) within expect_follows's bound.
template <typename Opt, typename Options>
void expect_follows_fp64(const Options& o, uint64_t seed, double u_max, const std::string& name,
                         const std::function<void(int, const std::vector<double>&, Fp64Run&)>& reference) {
  at::manual_seed(seed);
  auto p = leaf(at::randn({64}));
  Fp64Run run{doubles_of(p), std::vector<double>(64, 0), std::vector<double>(64, 0)};
  Opt opt({p}, o);
  const auto grads = huge_gradients(64);
  for (int t = 1; t <= 3; ++t) {
    p.mutable_grad() = grads[t - 1].clone();
    opt.step();
    reference(t, doubles_of(grads[t - 1]), run);
    expect_follows(p, run.p, o.lr(), u_max, name + " step " + std::to_string(t));
  }
}

TEST(LargeGradients, LaPropFollowsTheFp64UpdateOnGradientsOf1e20) {
  const LaPropOptions o = LaPropOptions(0.01).weight_decay(0);
  expect_follows_fp64<LaProp>(o, 1, 1.0, "laprop", [&](int t, const std::vector<double>& g, Fp64Run& r) {
    const double c1 = 1 - std::pow(o.beta1(), t);
    const double c2 = 1 - std::pow(o.beta2(), t);
    for (size_t i = 0; i < g.size(); ++i) {
      r.v[i] = o.beta2() * r.v[i] + (1 - o.beta2()) * g[i] * g[i];
      r.m[i] = o.beta1() * r.m[i] + (1 - o.beta1()) * g[i] / (std::sqrt(r.v[i] / c2) + o.eps());
      r.p[i] -= o.lr() * r.m[i] / c1;
    }
  });
}

TEST(LargeGradients, SimAdEMAMixFollowsTheFp64UpdateOnGradientsOf1e20) {
  const SimAdEMAMixOptions o = SimAdEMAMixOptions(0.01).weight_decay(0);
  // |u| ≤ (alpha + t)·|g| / √v̂, at most (alpha + 3)·√(1/(1 − β2)) here.
  const double u_max = (o.alpha() + 3) * std::sqrt(1 / (1 - o.beta2()));
  expect_follows_fp64<SimAdEMAMix>(o, 2, u_max, "sim_ademamix", [&](int t, const std::vector<double>& g, Fp64Run& r) {
    const double b = o.beta1();
    const double c1 = (1 - std::pow(b, t)) / (1 - b);
    const double c2 = 1 - std::pow(o.beta2(), t);
    for (size_t i = 0; i < g.size(); ++i) {
      r.m[i] = b * r.m[i] + g[i];
      r.v[i] = o.beta2() * r.v[i] + (1 - o.beta2()) * g[i] * g[i];
      r.p[i] -= o.lr() * (o.alpha() * g[i] + r.m[i] / c1) / (std::sqrt(r.v[i] / c2) + o.eps());
    }
  });
}

// SOAP on a 1-D parameter is its Adam (precondition_1d off). β2 0.999 keeps
// v = (1 − β2)·g² ≈ 1e37 within fp32 (0.95's 5e38 is not: no fp32 state holds it).
TEST(LargeGradients, SoapAdamFollowsTheFp64UpdateOnGradientsOf1e20) {
  const SoapOptions o = SoapOptions(0.01).beta2(0.999).weight_decay(0);
  // |m̂| / √v̂ ≤ √(1 − β2)/(1 − β1)·... bounded by 1/√(1 − β2) for these moments.
  const double u_max = std::sqrt(1 / (1 - o.beta2()));
  expect_follows_fp64<Soap>(o, 3, u_max, "soap", [&](int t, const std::vector<double>& g, Fp64Run& r) {
    const double c1 = 1 - std::pow(o.beta1(), t);
    const double c2 = 1 - std::pow(o.beta2(), t);
    for (size_t i = 0; i < g.size(); ++i) {
      r.m[i] = o.beta1() * r.m[i] + (1 - o.beta1()) * g[i];
      r.v[i] = o.beta2() * r.v[i] + (1 - o.beta2()) * g[i] * g[i];
      r.p[i] -= o.lr() * (r.m[i] / c1) / (std::sqrt(r.v[i] / c2) + o.eps());
    }
  });
}

// ---- ranges -------------------------------------------------------------------

TEST(OptionRanges, ValuesThatMakeNaNFromFiniteGradientsAreRefusedByName) {
  auto p = leaf(at::randn({4, 4}));
  expect_value_error([&] { LaProp opt({p}, LaPropOptions().eps(0)); }, {"[muon::LaProp]", "eps", "got 0"});
  expect_value_error([&] { SimAdEMAMix opt({p}, SimAdEMAMixOptions().eps(0)); },
                     {"[muon::SimAdEMAMix]", "eps", "got 0"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().eps(0)); }, {"[muon::Soap]", "eps", "got 0"});
  expect_value_error([&] { Dion2 opt({p}, NorDion2Options().muon_beta2(1.5)); },
                     {"[muon::NorDion2]", "muon_beta2", "got 1.5"});
  expect_value_error([&] { Dion2 opt({p}, Dion2Options().ef_decay(1e6)); },
                     {"[muon::Dion2]", "ef_decay", "[0, 1]", "got 1e+06"});
  expect_value_error([&] { Dion2 opt({p}, NorDion2Options().ef_decay(1.5)); },
                     {"[muon::NorDion2]", "mu", "got 1.5"});
  // The edges stay valid.
  Dion2 edge({p}, Dion2Options().ef_decay(1.0));
  Dion2 nor({p}, NorDion2Options().muon_beta2(0.0));
}

TEST(OptionRanges, ConfigFieldsRefuseThemByName) {
  const std::vector<std::pair<std::string, double>> bad{{"laprop_eps", 0.0},
                                                        {"sim_ademamix_eps", 0.0},
                                                        {"soap_eps", 0.0},
                                                        {"nordion2_muon_beta2", 1.5},
                                                        {"nordion2_muon_beta2", 1.0},
                                                        {"dion2_ef_decay", 1e6},
                                                        {"nordion2_mu", 1.5}};
  for (const auto& [field, value] : bad) {
    OptimizerConfig config;
    expect_value_error([&] { config.set(field, value); }, {field});
  }
}

TEST(OptionRanges, AnEditAfterConstructionIsRefusedAndChangesNothing) {
  auto p = leaf(at::randn({4, 4}));
  LaProp opt({p}, LaPropOptions(0.01));
  elementwise::expect_spoiled_step_changes_nothing<LaPropParamState>(
      opt, p, at::zeros({4, 4}), [&] { static_cast<LaPropOptions&>(opt.param_groups()[0].options()).eps(0); },
      {"eps", "got 0"});
}

}  // namespace
}  // namespace muon::test
