// Tests of muon::ObliqueSGD and muon::ObliqueAdam: values against an
// independent fp64 reference of the published update, unit norms after a
// step, options and their errors (dim checked against every parameter),
// save/load, the registry entries, checkpoints resharded across the layouts
// they run in, and the layouts that refuse them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "elementwise_cases.h"
#include "expect_util.h"
#include "muon/optim/lion.h"
#include "muon/optim/oblique.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace ckpt = muon::test::checkpoint;
using muon::distributed::Group;

struct SgdHyper {
  double lr, momentum, wd;
  std::string method;
  int64_t dim;
  double eps;

  /// The fields in ObliqueSGDOptions::fields' order.
  auto fields() const { return std::tie(lr, momentum, wd, method, dim, eps); }
};

struct AdamHyper {
  double lr, beta1, beta2, wd;
  std::string method;
  int64_t dim;
  double eps;
  bool correct_bias;

  /// The fields in ObliqueAdamOptions::fields' order.
  auto fields() const { return std::tie(lr, beta1, beta2, wd, method, dim, eps, correct_bias); }
};

// The slices of a tensor of `sizes` along `dim`: element (o, j, i) of slice
// (o, i) is at (o·n + j)·inner + i, n the size of `dim`.
struct Slices {
  int64_t outer = 1, n = 1, inner = 1;
  Slices(const std::vector<int64_t>& sizes, int64_t dim) {
    const auto d = dim < 0 ? dim + static_cast<int64_t>(sizes.size()) : dim;
    for (int64_t k = 0; k < static_cast<int64_t>(sizes.size()); ++k) {
      if (k < d) outer *= sizes[k];
      if (k == d) n = sizes[k];
      if (k > d) inner *= sizes[k];
    }
  }
  size_t at(int64_t o, int64_t j, int64_t i) const { return static_cast<size_t>((o * n + j) * inner + i); }
};

// The projection, weight decay, step and retraction both optimizers share, as
// published: NVIDIA-NeMo/Emerging-Optimizers at commit fd77292,
// emerging_optimizers/riemannian_optimizers/normalized_optimizer.py
// (_compute_riemannian_grad, then WeightDecayMixin._apply_weight_decay_inplace
// of emerging_optimizers/mixin.py, add_, torch.nn.functional.normalize).
// Written slice by slice on doubles, sharing no tensor op with the library.
void project_step_retract(std::vector<double>& p, const std::vector<double>& u, const Slices& s,
                          double lr, double wd, const std::string& method, double eps) {
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      double inner = 0;
      for (int64_t j = 0; j < s.n; ++j) inner += p[s.at(o, j, i)] * u[s.at(o, j, i)];
      double norm2 = 0;
      for (int64_t j = 0; j < s.n; ++j) {
        double& x = p[s.at(o, j, i)];
        double r = u[s.at(o, j, i)] - x * inner;
        if (wd != 0 && method == "decoupled") x -= lr * wd * x;
        if (wd != 0 && method == "independent") x -= wd * x;
        if (wd != 0 && method == "l2") r += wd * x;
        x -= lr * r;
        norm2 += x * x;
      }
      const double norm = std::max(std::sqrt(norm2), eps);
      for (int64_t j = 0; j < s.n; ++j) p[s.at(o, j, i)] /= norm;
    }
  }
}

struct SgdReference {
  std::vector<double> p, u;
  std::vector<int64_t> sizes;
  int64_t t = 0;
  explicit SgdReference(const at::Tensor& init)
      : p(doubles(init)), u(p.size(), 0.0), sizes(init.sizes().vec()) {}
  std::vector<const std::vector<double>*> moments() const { return {&u}; }

  void step(const at::Tensor& grad, const SgdHyper& h) {
    const auto g = doubles(grad);
    t += 1;
    for (size_t k = 0; k < p.size(); ++k) u[k] = g[k] + h.momentum * u[k];
    project_step_retract(p, u, Slices(sizes, h.dim), h.lr, h.wd, h.method, h.eps);
  }
};

// ObliqueAdam divides √v by c2 (not √c2), as the published code does.
struct AdamReference : elementwise::TwoMoments {
  std::vector<int64_t> sizes;
  explicit AdamReference(const at::Tensor& init) : TwoMoments(init), sizes(init.sizes().vec()) {}

  void step(const at::Tensor& grad, const AdamHyper& h) {
    const auto g = doubles(grad);
    t += 1;
    const double c1 = h.correct_bias ? 1 - std::pow(h.beta1, static_cast<double>(t)) : 1.0;
    const double c2 = h.correct_bias ? 1 - std::pow(h.beta2, static_cast<double>(t)) : 1.0;
    std::vector<double> u(p.size());
    for (size_t k = 0; k < p.size(); ++k) {
      m[k] = h.beta1 * m[k] + (1 - h.beta1) * g[k];
      v[k] = h.beta2 * v[k] + (1 - h.beta2) * g[k] * g[k];
      u[k] = (m[k] / c1) / (std::sqrt(v[k]) / c2 + h.eps);
    }
    project_step_retract(p, u, Slices(sizes, h.dim), h.lr, h.wd, h.method, h.eps);
  }
};

struct SgdCase : elementwise::CaseOf<ObliqueSGD, Lion> {
  static constexpr const char* kName = "oblique_sgd";
  static Options resumed() { return ObliqueSGDOptions(0.01).weight_decay(0.1).dim(1); }
  static Options replaced() { return ObliqueSGDOptions(0.5).momentum(0.5); }
  static void bad_edit(Options& o) { o.eps(-1e-3); }
  static std::vector<std::string> bad_edit_words() { return {"[muon::ObliqueSGD]", "eps", "-0.001"}; }
  // The bias too (the entry sends 1-D parameters to scalar_optimizer).
  static constexpr const char* kConfig =
      R"({"optimizer": "oblique_sgd", "scalar_optimizer": "oblique_sgd", )"
      R"("lr": 0.01, "oblique_sgd_momentum": 0.5, "oblique_sgd_dim": -1})";
  static void check_config(const Options& o) {
    EXPECT_EQ(o.lr(), 0.01);
    EXPECT_EQ(o.momentum(), 0.5);
    EXPECT_EQ(o.dim(), -1);
    EXPECT_EQ(o.eps(), 1e-8);
    EXPECT_EQ(o.weight_decay_method(), "decoupled");
  }
};

struct AdamCase : elementwise::CaseOf<ObliqueAdam, Lion> {
  static constexpr const char* kName = "oblique_adam";
  static Options resumed() { return ObliqueAdamOptions(0.01).weight_decay(0.1).beta2(0.9); }
  static Options replaced() { return ObliqueAdamOptions(0.5).correct_bias(false).dim(1); }
  static void bad_edit(Options& o) { o.eps(-1e-3); }
  static std::vector<std::string> bad_edit_words() { return {"[muon::ObliqueAdam]", "eps", "-0.001"}; }
  // The bias too (the entry sends 1-D parameters to scalar_optimizer).
  static constexpr const char* kConfig =
      R"({"optimizer": "oblique_adam", "scalar_optimizer": "oblique_adam", )"
      R"("lr": 0.01, "oblique_adam_beta2": 0.98, "oblique_adam_correct_bias": false})";
  static void check_config(const Options& o) {
    EXPECT_EQ(o.lr(), 0.01);
    EXPECT_EQ(o.beta1(), 0.9);
    EXPECT_EQ(o.beta2(), 0.98);
    EXPECT_EQ(o.dim(), 0);
    EXPECT_FALSE(o.correct_bias());
  }
};

const std::vector<std::vector<int64_t>> kShapes{{5, 7}, {24, 3}, {4, 3, 3, 3}};
const std::vector<std::string> kMethods{"decoupled", "independent", "l2"};

// fp32 against fp64: a few fp32 roundings (2^-24 relative) per step on values
// of order 1, plus the sums of at most 24 products along dim, over 5 steps:
// far below 1e-5 of the largest. A missing projection, decay term or
// retraction moves p by > 1e-3 (as LaProp's and Lion's tests bound theirs).
constexpr double kTol = 1e-5;

TEST(ObliqueSGD, FiveFp32StepsEqualThePublishedUpdate) {
  for (const int64_t dim : {0, 1}) {
    for (const auto& method : kMethods) {
      const SgdHyper h{0.05, 0.8, 0.1, method, dim, 1e-8};
      ReferenceRun<SgdReference> run(kShapes, 1);
      const auto what = method + " dim " + std::to_string(dim);
      const auto bytes = elementwise::expect_steps_equal_reference<SgdCase>(run, h, 5, kTol, what);
      EXPECT_EQ(bytes, (35 + 72 + 108) * 4);
    }
  }
}

TEST(ObliqueAdam, FiveFp32StepsEqualThePublishedUpdate) {
  for (const int64_t dim : {0, 1}) {
    for (const auto& method : kMethods) {
      for (const bool correct_bias : {true, false}) {
        const AdamHyper h{0.05, 0.8, 0.95, 0.1, method, dim, 1e-8, correct_bias};
        ReferenceRun<AdamReference> run(kShapes, 2);
        const auto what = method + " dim " + std::to_string(dim) + (correct_bias ? " cb" : " no cb");
        const auto bytes = elementwise::expect_steps_equal_reference<AdamCase>(run, h, 5, kTol, what);
        EXPECT_EQ(bytes, 2 * (35 + 72 + 108) * 4);
      }
    }
  }
}

// After one step every slice along dim has unit norm (to fp32 rounding).
template <typename Optimizer, typename Options>
void expect_unit_norms() {
  for (const int64_t dim : {0, 1, -1}) {
    for (const auto& shape : kShapes) {
      auto p = leaf(at::randn(shape) * 3);
      Optimizer opt({p}, Options(0.1).dim(dim));
      p.mutable_grad() = at::randn(shape);
      opt.step();
      const auto norms = p.detach().norm(2, dim);
      EXPECT_TRUE(at::allclose(norms, at::ones_like(norms), 0, 1e-5)) << "dim " << dim << " " << norms;
    }
  }
}

TEST(ObliqueSGD, SlicesHaveUnitNormAfterAStep) { expect_unit_norms<ObliqueSGD, ObliqueSGDOptions>(); }
TEST(ObliqueAdam, SlicesHaveUnitNormAfterAStep) { expect_unit_norms<ObliqueAdam, ObliqueAdamOptions>(); }

TEST(ObliqueSGD, DefaultsAreEmergingOptimizers) {
  // lr, momentum, weight_decay, weight_decay_method, dim, eps
  elementwise::expect_fields(ObliqueSGDOptions(), 1e-3, 0.9, 0.0, std::string("decoupled"), int64_t{0}, 1e-8);
}

TEST(ObliqueAdam, DefaultsAreEmergingOptimizers) {
  // lr, beta1, beta2, weight_decay, weight_decay_method, dim, eps, correct_bias
  elementwise::expect_fields(ObliqueAdamOptions(), 1e-3, 0.9, 0.99, 0.0, std::string("decoupled"), int64_t{0},
                             1e-8, true);
}

TEST(ObliqueSGD, InvalidOptionsNameArgumentAndValue) {
  using O = ObliqueSGDOptions;
  elementwise::expect_invalid_options<SgdCase>({{O().momentum(1.0), {"momentum", "[0, 1)", "1"}},
                                                {O().eps(0.0), {"eps", "> 0", "0"}},
                                                {O().eps(-1e-3), {"eps", "-0.001"}},
                                                {O().weight_decay(-2), {"weight_decay", "-2"}},
                                                {O().weight_decay_method("palm"), {"weight_decay_method", "palm"}}});
  OptimizerConfig c;
  expect_value_error([&] { c.set("oblique_sgd_eps", 0.0); }, {"oblique_sgd_eps", "0"});
  expect_value_error([&] { c.set("oblique_sgd_momentum", 1.0); }, {"oblique_sgd_momentum", "1"});
}

TEST(ObliqueAdam, InvalidOptionsNameArgumentAndValue) {
  using O = ObliqueAdamOptions;
  elementwise::expect_invalid_options<AdamCase>({{O().beta1(1.0), {"beta1", "[0, 1)", "1"}},
                                                 {O().beta2(-0.1), {"beta2", "-0.1"}},
                                                 {O().eps(0.0), {"eps", "> 0", "0"}},
                                                 {O().weight_decay(-2), {"weight_decay", "-2"}}});
  OptimizerConfig c;
  expect_value_error([&] { c.set("oblique_adam_eps", -1.0); }, {"oblique_adam_eps", "-1"});
}

// A dim out of a parameter's range, or a 0-d parameter, is refused at the
// step, naming the optimizer, dim and the shape; nothing changes.
template <typename Optimizer, typename Options>
void expect_dim_checked(const std::string& kind) {
  auto a = leaf(at::randn({4, 3}));
  auto b = leaf(at::randn({5}));
  Optimizer opt({a, b}, Options(0.1).dim(1));
  a.mutable_grad() = at::randn({4, 3});
  b.mutable_grad() = at::randn({5});
  const auto a0 = a.detach().clone();
  const auto b0 = b.detach().clone();
  expect_value_error([&] { opt.step(); }, {"[muon::" + kind + "]", "dim", "[-1, 1)", "[5]", "got 1"});
  EXPECT_TRUE(at::equal(a, a0));
  EXPECT_TRUE(at::equal(b, b0));
  EXPECT_TRUE(opt.state().empty());
  auto s = leaf(at::randn({}));
  Optimizer scalar({s}, Options(0.1));
  s.mutable_grad() = at::randn({});
  expect_value_error([&] { scalar.step(); }, {"[muon::" + kind + "]", "at least one dimension"});
  Optimizer low({a}, Options(0.1).dim(-3));
  expect_value_error([&] { low.step(); }, {"dim", "[-2, 2)", "got -3"});
  EXPECT_TRUE(at::equal(a, a0));
}

TEST(ObliqueSGD, DimOutOfRangeIsRefusedAndChangesNothing) {
  expect_dim_checked<ObliqueSGD, ObliqueSGDOptions>("ObliqueSGD");
}
TEST(ObliqueAdam, DimOutOfRangeIsRefusedAndChangesNothing) {
  expect_dim_checked<ObliqueAdam, ObliqueAdamOptions>("ObliqueAdam");
}

// The layouts that keep whole parameters (none, layerwise) equal one process
// bit for bit and reshard checkpoints between them.
template <typename C>
void layerwise_reshards() {
  const auto after = ckpt::one_process_after(C::kName, {1, 2, 3, 4});
  ckpt::reshard_chain(C::kName, std::string(C::kName) + "_reshard",
                      {{"layerwise", 3, 1, "layer-wise W=3"},
                       {"none", 1, 2, "single from layer-wise W=3"},
                       {"layerwise", 2, 3, "layer-wise W=2 from single"},
                       {"none", 1, 4, "single from layer-wise W=2"}},
                      after);
}

TEST(ObliqueSGD, LayerwiseEqualsOneProcessAndCheckpointsReshard) { layerwise_reshards<SgdCase>(); }
TEST(ObliqueAdam, LayerwiseEqualsOneProcessAndCheckpointsReshard) { layerwise_reshards<AdamCase>(); }

// The layouts that split parameters refuse both, naming the optimizer and the layout.
TEST(Oblique, LayoutsThatSplitParametersRefuseByName) {
  for (const std::string name : {"oblique_sgd", "oblique_adam"}) {
    for (const auto& [kind, layout] : {std::make_pair("sharded", "sharded"), std::make_pair("tp", "tensor_parallel")}) {
      muon::test::run_ranks(2, [&, kind = std::string(kind), layout = std::string(layout)](Group& group) {
        expect_value_error([&] { ckpt::Rank r(kind, group, name); },
                           {"'" + name + "'", "layout '" + layout + "'", "layerwise"});
      });
    }
  }
}

MUON_ELEMENTWISE_CASE(ObliqueSGD, SgdCase, ResumedRunIsBitIdentical)
MUON_ELEMENTWISE_CASE(ObliqueSGD, SgdCase, LoadRejectsAnotherOptimizersArchiveAndChangesNothing)
MUON_ELEMENTWISE_CASE(ObliqueSGD, SgdCase, ParametersWithoutGradientAreSkipped)
MUON_ELEMENTWISE_CASE(ObliqueSGD, SgdCase, BadEditBetweenStepsChangesNothing)
MUON_ELEMENTWISE_CASE(ObliqueSGD, SgdCase, BuiltFromAConfigWithItsFieldsAndExplained)
MUON_ELEMENTWISE_CASE(ObliqueSGD, SgdCase, L2DecayLeavesTheCallersGradientUnchanged)
MUON_ELEMENTWISE_CASE(ObliqueAdam, AdamCase, ResumedRunIsBitIdentical)
MUON_ELEMENTWISE_CASE(ObliqueAdam, AdamCase, LoadRejectsAnotherOptimizersArchiveAndChangesNothing)
MUON_ELEMENTWISE_CASE(ObliqueAdam, AdamCase, ParametersWithoutGradientAreSkipped)
MUON_ELEMENTWISE_CASE(ObliqueAdam, AdamCase, BadEditBetweenStepsChangesNothing)
MUON_ELEMENTWISE_CASE(ObliqueAdam, AdamCase, BuiltFromAConfigWithItsFieldsAndExplained)
MUON_ELEMENTWISE_CASE(ObliqueAdam, AdamCase, L2DecayLeavesTheCallersGradientUnchanged)

}  // namespace
}  // namespace muon::test
