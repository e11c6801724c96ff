// Tests of muon::OrthogonalizedVariant (PolarGrad, Scion, MOP): values
// against an independent fp64 reference of Emerging-Optimizers' arithmetic,
// options and their errors, save/load, the registry entries (config fields,
// make_optimizer, explain) and checkpoints resharded across layouts. Their
// distributed layouts are tests/test_dist_orthogonalized_family.cpp's.
#include <gtest/gtest.h>
#include <unistd.h>

#include "archive_util.h"
#include "expect_util.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_model.h"
#include "distributed/checkpoints/checkpoint_state.h"
#include "muon/optim/lion.h"
#include "muon/optim/orthogonalized_family.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace ckpt = muon::test::checkpoint;

// Newton–Schulz as EO's muon_utils.newton_schulz runs it, in fp64: X = M /
// (‖M‖_F + 1e-7) (MuonOptions' default eps, added), transposed when tall,
// then 5 steps X ← aX + (bA + cA²)X with A = XXᵀ and EO's "quintic"
// (a, b, c), Jiacheng You's five tuples (the default coefficient_type).
at::Tensor ns_fp64(const at::Tensor& m) {
  constexpr double kQuintic[5][3] = {{4.0848, -6.8946, 2.9270},
                                     {3.9505, -6.3029, 2.6377},
                                     {3.7418, -5.5913, 2.3037},
                                     {2.8769, -3.1427, 1.2046},
                                     {2.8366, -3.0525, 1.2012}};
  const bool tall = m.size(0) > m.size(1);
  auto x = tall ? m.t() : m;
  x = x / (x.norm().item<double>() + 1e-7);
  for (const auto& c : kQuintic) {
    const auto a = at::matmul(x, x.t());
    const auto b = c[1] * a + c[2] * at::matmul(a, a);
    x = c[0] * x + at::matmul(b, x);
  }
  return tall ? x.t() : x;
}

// U·Vᵀ of m by SVD in fp64 (EO's mop.polar_via_svd).
at::Tensor polar_fp64(const at::Tensor& m) {
  auto [u, s, vh] = at::linalg_svd(m, /*full_matrices=*/false);
  return at::matmul(u, vh);
}

struct Hyper {
  double lr, mu, wd;
  bool nesterov;
  double extra = 1.0;
  double radius = 1.0;     // Scion's spectral radius
  double hb_radius = 0.0;  // MuonHyperball's radius (0: the weight's norm)
};

// One parameter's fp64 run of EO's OrthogonalizedOptimizer.step with each
// variant's scaled_orthogonalize_fn: decoupled weight decay, EMA momentum
// (lerp), optional Nesterov, then the variant's update, p ← p − lr·update.
struct Reference {
  at::Tensor p, buf;
  OrthogonalizedKind kind;

  Reference(const at::Tensor& init, OrthogonalizedKind k, double hb_radius = 0.0)
      : p(init.detach().to(at::kDouble).clone()), buf(at::zeros_like(p)), kind(k) {
    // MuonHyperball with a radius rescales every parameter at construction.
    if (k == OrthogonalizedKind::kMuonHyperball && hb_radius > 0) p = p * (hb_radius / p.norm().item<double>());
  }

  void step(const at::Tensor& grad, const Hyper& h) {
    const auto g = grad.to(at::kDouble);
    p = p * (1 - h.lr * h.wd);
    buf = buf + (1 - h.mu) * (g - buf);
    const auto m = (h.nesterov ? g + h.mu * (buf - g) : buf).reshape({p.size(0), -1});
    const double rows = static_cast<double>(m.size(0));
    const double cols = static_cast<double>(m.size(1));
    at::Tensor update;
    double radius = 0;  // MuonHyperball's R: taken after the decay, before the update
    switch (kind) {
      case OrthogonalizedKind::kPolarGrad: {
        const auto o = ns_fp64(m);
        update = o * (o * m).sum().item<double>() * h.extra;
        break;
      }
      case OrthogonalizedKind::kScion:
        update = ns_fp64(m) * std::sqrt(rows / cols) * h.radius;
        break;
      case OrthogonalizedKind::kMop:
        update = polar_fp64(m) * std::sqrt(std::max(rows, cols)) * h.extra;  // spectral
        break;
      case OrthogonalizedKind::kSpel:
        update = ns_fp64(m);  // no scale
        break;
      case OrthogonalizedKind::kMuonHyperball: {
        radius = h.hb_radius > 0 ? h.hb_radius : p.norm().item<double>();
        const auto u = ns_fp64(m) * std::sqrt(std::max(rows, cols)) * h.extra;  // Muon's, spectral
        update = u * (radius / std::max(u.norm().item<double>(), 1e-8));
        break;
      }
    }
    p = p - h.lr * update.reshape(p.sizes());
    if (kind == OrthogonalizedKind::kSpel) p = ns_fp64(p.reshape({p.size(0), -1})).reshape(p.sizes());
    if (kind == OrthogonalizedKind::kMuonHyperball) p = p * (radius / std::max(p.norm().item<double>(), 1e-8));
  }
};

MuonOptions muon_options_of(const Hyper& h) {
  return MuonOptions(h.lr)
      .momentum(h.mu)
      .weight_decay(h.wd)
      .nesterov(h.nesterov)
      .extra_scale_factor(h.extra)
      .scale_mode("spectral");
}

Hyper hyper_of(OrthogonalizedKind kind) {
  switch (kind) {
    case OrthogonalizedKind::kPolarGrad:
      return {0.004, 0.9, 0.05, false, 0.7};
    case OrthogonalizedKind::kScion:
      return {0.03, 0.9, 1.0, false, 1.0, 2.5};
    case OrthogonalizedKind::kMop:
      return {0.02, 0.9, 0.05, true, 1.3};
    case OrthogonalizedKind::kSpel:
      return {0.05, 0.9, 0.1, false};
    case OrthogonalizedKind::kMuonHyperball:
      return {0.05, 0.9, 0.05, true, 1.3};
  }
  return {};
}

class Variants : public ::testing::TestWithParam<OrthogonalizedKind> {};

// 5 fp32 steps of a wide, a tall and a conv (flattened to (8, 12)) weight
// against the fp64 reference. The fp32 run differs from it by fp32 rounding
// of the O(10–100) operations per element of a step (the momentum, the
// Newton–Schulz products over ≤ 12-long dots, ⟨O, M⟩, the SVD), ~1e-7 of the
// update, so 1e-5 of the parameters holds on any CPU; a wrong scale or a
// missing Nesterov term moves them by ~lr (≥ 4e-3).
TEST_P(Variants, FiveFp32StepsEqualEmergingOptimizersArithmetic) {
  const auto kind = GetParam();
  const auto h = hyper_of(kind);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{6, 10}, {12, 5}, {8, 3, 2, 2}}) {
    const auto data = gradient_run(7, shape, 5);
    auto p = leaf(data.init);
    OrthogonalizedVariant opt({p}, muon_options_of(h),
                              OrthogonalizedVariantOptions().kind(kind).spectral_radius(h.radius));
    Reference ref(data.init, kind, h.hb_radius);
    data.run(p, opt, 0, 5);
    for (const auto& g : data.grads) ref.step(g, h);
    const double err = (p.detach().to(at::kDouble) - ref.p).abs().max().item<double>() /
                       ref.p.abs().max().item<double>();
    EXPECT_LE(err, 1e-5) << to_string(kind) << " shape " << c10::IntArrayRef(shape);
    const double moved = (ref.p - data.init.to(at::kDouble)).abs().max().item<double>();
    EXPECT_GT(moved, 1e-3) << "the steps must move the parameters";
  }
}

TEST_P(Variants, StackedExpertsAndSplitsAreRejectedByName) {
  const auto kind = GetParam();
  auto base = MuonOptions(0.01).nesterov(false);
  if (kind == OrthogonalizedKind::kScion) base.weight_decay(1.0);
  const auto variant = OrthogonalizedVariantOptions().kind(kind);
  auto p = leaf(at::randn({2, 4, 6}));
  expect_value_error([&] { OrthogonalizedVariant({p}, MuonOptions(base).stacked_experts(true), variant); },
                     {"stacked_experts", "param group 0"});
  auto q = leaf(at::randn({6, 4}));
  expect_value_error([&] { OrthogonalizedVariant({q}, MuonOptions(base).split_sizes({2, 2, 2}), variant); },
                     {"split_sizes", "[2, 2, 2]"});
}

TEST_P(Variants, ResumedRunIsBitIdentical) {
  const auto kind = GetParam();
  const auto h = hyper_of(kind);
  const auto variant = OrthogonalizedVariantOptions().kind(kind).spectral_radius(h.radius);
  const auto data = gradient_run(3, {6, 4}, 6);
  auto a = leaf(data.init);
  OrthogonalizedVariant straight({a}, muon_options_of(h), variant);
  data.run(a, straight, 0, 6);

  auto b = leaf(data.init);
  OrthogonalizedVariant first({b}, muon_options_of(h), variant);
  data.run(b, first, 0, 3);
  const auto bytes = save_to_string(first);
  auto c = leaf(b.detach());
  auto other = muon_options_of(h).lr(0.5);
  OrthogonalizedVariant second({c}, other, OrthogonalizedVariantOptions(variant).spectral_radius(9.0));
  load_from_string(second, bytes);  // options and the radius come from the archive
  EXPECT_TRUE(second.variant_options() == variant);
  EXPECT_EQ(second.param_groups()[0].options().get_lr(), h.lr);
  data.run(c, second, 3, 6);
  EXPECT_TRUE(at::equal(a.detach(), c.detach()));
}

TEST_P(Variants, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  const auto kind = GetParam();
  auto p = leaf(at::randn({4, 3}));
  Muon muon({p});
  p.mutable_grad() = at::ones({4, 3});
  muon.step();
  const auto bytes = save_to_string(muon);
  auto opts = muon_options_of(hyper_of(kind)).lr(0.2);
  OrthogonalizedVariant opt({p}, opts, OrthogonalizedVariantOptions().kind(kind));
  expect_value_error([&] { load_from_string(opt, bytes); }, {"muon::Muon"});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_TRUE(opt.state().empty());
  // Another member of the family is another kind.
  const auto other = kind == OrthogonalizedKind::kPolarGrad ? OrthogonalizedKind::kMop
                                                            : OrthogonalizedKind::kPolarGrad;
  auto q = leaf(at::randn({4, 3}));
  OrthogonalizedVariant donor({q}, muon_options_of(hyper_of(other)),
                              OrthogonalizedVariantOptions().kind(other));
  q.mutable_grad() = at::ones({4, 3});
  donor.step();
  expect_value_error([&] { load_from_string(opt, save_to_string(donor)); },
                     {"muon::" + std::string(other == OrthogonalizedKind::kMop ? "MOP" : "PolarGrad")});
  EXPECT_TRUE(opt.state().empty());
}

INSTANTIATE_TEST_SUITE_P(Kinds, Variants,
                         ::testing::Values(OrthogonalizedKind::kPolarGrad, OrthogonalizedKind::kScion,
                                           OrthogonalizedKind::kMop, OrthogonalizedKind::kSpel,
                                           OrthogonalizedKind::kMuonHyperball),
                         [](const auto& info) { return to_string(info.param); });

// With a radius, construction puts every weight on the sphere of that
// radius and every step keeps it there; the values follow EO's arithmetic
// (the same 1e-5 bound as above).
TEST(OrthogonalizedFamily, HyperballRadiusRescalesAtConstructionAndStaysOnTheSphere) {
  auto h = hyper_of(OrthogonalizedKind::kMuonHyperball);
  h.hb_radius = 3.0;
  const auto data = gradient_run(11, {6, 10}, 5);
  auto p = leaf(data.init);
  OrthogonalizedVariant opt({p}, muon_options_of(h),
                            OrthogonalizedVariantOptions().kind(OrthogonalizedKind::kMuonHyperball).hyperball_radius(3.0));
  EXPECT_NEAR(p.detach().norm().item<double>(), 3.0, 1e-5);
  Reference ref(data.init, OrthogonalizedKind::kMuonHyperball, 3.0);
  data.run(p, opt, 0, 5);
  for (const auto& g : data.grads) ref.step(g, h);
  EXPECT_NEAR(p.detach().norm().item<double>(), 3.0, 1e-5);
  const double err = (p.detach().to(at::kDouble) - ref.p).abs().max().item<double>() / ref.p.abs().max().item<double>();
  EXPECT_LE(err, 1e-5);
  // A zero weight has no sphere.
  auto z = leaf(at::zeros({4, 3}));
  expect_value_error(
      [&] { OrthogonalizedVariant({z}, MuonOptions(0.01), OrthogonalizedVariantOptions().kind(OrthogonalizedKind::kMuonHyperball)); },
      {"[muon::MuonHyperball]", "parameter 0 of group 0", "zero norm"});
}

TEST(OrthogonalizedFamily, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({4, 3}));
  expect_value_error([] { OrthogonalizedVariantOptions().kind(OrthogonalizedKind::kScion).spectral_radius(-2.0).validate(); },
                     {"[muon::Scion]", "spectral_radius", "-2"});
  expect_value_error([] { parse_orthogonalized_kind("polar"); },
                     {"kind", "'polar'", "polargrad, scion, mop, spel, muon_hyperball"});
  const auto hb = OrthogonalizedVariantOptions().kind(OrthogonalizedKind::kMuonHyperball);
  expect_value_error([&] { OrthogonalizedVariantOptions(hb).hyperball_radius(-1.0).validate(); },
                     {"[muon::MuonHyperball]", "hyperball_radius", "-1"});
  expect_value_error([&] { OrthogonalizedVariantOptions(hb).hyperball_eps(0.0).validate(); },
                     {"[muon::MuonHyperball]", "hyperball_eps", "0"});
  expect_value_error([&] { OptimizerConfig().set("muon_hyperball_eps", -1.0); },
                     {"muon_hyperball_eps", "-1"});
  const auto scion = OrthogonalizedVariantOptions().kind(OrthogonalizedKind::kScion);
  expect_value_error([&] { OrthogonalizedVariant({p}, MuonOptions(0.01).nesterov(false).weight_decay(0.1), scion); },
                     {"[muon::Scion]", "weight_decay", "0.1"});
  expect_value_error([&] { OrthogonalizedVariant({p}, MuonOptions(0.01).weight_decay(1.0), scion); },
                     {"[muon::Scion]", "nesterov"});
  expect_value_error(
      [&] {
        OrthogonalizedVariant({p}, MuonOptions(0.01).nesterov(false).weight_decay(1.0).weight_decay_mode("l2"),
                              scion);
      },
      {"[muon::Scion]", "weight_decay_mode", "l2"});
  OptimizerConfig c;
  expect_value_error([&] { c.set("scion_spectral_radius", 0.0); }, {"scion_spectral_radius", "0"});
  // A failed step check changes nothing.
  OrthogonalizedVariant opt({p}, MuonOptions(0.01).nesterov(false), OrthogonalizedVariantOptions());
  static_cast<MuonOptions&>(opt.param_groups()[0].options()).stacked_experts(true);
  const auto before = p.detach().clone();
  p.mutable_grad() = at::ones({4, 3});
  expect_value_error([&] { opt.step(); }, {"[muon::PolarGrad]", "stacked_experts"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_TRUE(opt.state().empty());
}

// Scion fixes weight decay 1, decoupled, and no Nesterov (EO; its step is
// Frank–Wolfe's p ← (1 − lr)·p − lr·update). From a config its matrices take
// those values by its default rule, which explain shows; the config's
// weight_decay stays the scalar optimizer's. A value Scion does not run
// (a rule's weight_decay, muon_weight_decay_mode cautious, muon_nesterov
// true) is refused by name; it used to be replaced by 1/decoupled/false
// silently, so that explain and the groups showed a value that did not run.
TEST(OrthogonalizedFamily, ScionRefusesWhatItFixesAndShowsWhatRuns) {
  auto named = ckpt::matrix_and_bias();
  OptimizerConfig config;
  config.set("optimizer", "scion").set("lr", 0.01).set("weight_decay", 0.1);
  auto opt = muon::make_optimizer(named, config);
  auto* v = dynamic_cast<OrthogonalizedVariant*>(opt->find_part("scion"));
  ASSERT_NE(v, nullptr);
  const auto& o = static_cast<const MuonOptions&>(v->param_groups()[0].options());
  EXPECT_EQ(o.weight_decay(), 1.0);
  EXPECT_FALSE(o.nesterov());
  const auto* adamw = opt->find_part("adamw");
  ASSERT_NE(adamw, nullptr);
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(adamw->param_groups()[0].options())
                .weight_decay(),
            0.1);
  const auto text = muon::explain(named, config);
  std::string w_row;  // explain's line of parameter w
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("w ", line.find_first_not_of(' ')) == line.find_first_not_of(' ')) w_row = line;
  }
  EXPECT_NE(w_row.find("weight_decay=1 "), std::string::npos) << text;
  EXPECT_NE(w_row.find("scion default: weight_decay 1"), std::string::npos) << text;
  EXPECT_EQ(w_row.find("weight_decay=0.1"), std::string::npos) << text;

  auto refused = [&](const OptimizerConfig& c, const std::vector<std::string>& needles) {
    const auto before = named["w"].detach().clone();
    expect_value_error([&] { muon::make_optimizer(named, c); }, needles);
    EXPECT_TRUE(at::equal(named["w"].detach(), before));
  };
  refused(OptimizerConfig(config).set("muon_weight_decay_mode", std::string("cautious")),
          {"[muon::Scion]", "weight_decay_mode", "cautious"});
  refused(OptimizerConfig(config).set("muon_weight_decay_mode", std::string("l2")),
          {"[muon::Scion]", "weight_decay_mode", "l2"});
  OptimizerConfig half(config);
  half.add_override(OverrideRule().match_name("w").set("weight_decay", 0.5).named("half decay"));
  refused(half, {"[muon::Scion]", "weight_decay must be 1", "0.5"});
  OptimizerConfig nesterov(config);
  nesterov.add_override(OverrideRule().match_name("w").set("muon_nesterov", true).named("look ahead"));
  refused(nesterov, {"[muon::Scion]", "nesterov must be false"});

  // A later edit of the group's options is refused at the step; nothing changes.
  named["w"].mutable_grad() = at::ones({8, 4});
  named["b"].mutable_grad() = at::ones({8});
  // The composite's mirrored groups are the options in force.
  bool edited = false;
  for (auto& group : opt->param_groups()) {
    if (auto* mo = dynamic_cast<MuonOptions*>(&group.options())) {
      mo->weight_decay(0.5);
      edited = true;
    }
  }
  ASSERT_TRUE(edited);
  const auto w_before = named["w"].detach().clone();
  const auto b_before = named["b"].detach().clone();
  expect_value_error([&] { opt->step(); }, {"[muon::Scion]", "weight_decay must be 1", "0.5"});
  EXPECT_TRUE(at::equal(named["w"].detach(), w_before));
  EXPECT_TRUE(at::equal(named["b"].detach(), b_before));
}

TEST(OrthogonalizedFamily, MopNeedsWholeMatrices) {
  auto p = leaf(at::randn({4, 3}));
  // A strategy of a layout that splits matrices (any name but "local").
  class Split final : public Orthogonalizer {
   public:
    std::string name() const override { return "tensor_parallel"; }
    void orthogonalize(std::vector<OrthogonalizeItem>&) override {}
  };
  expect_value_error(
      [&] {
        OrthogonalizedVariant({torch::optim::OptimizerParamGroup({p})}, MuonOptions(0.01),
                              OrthogonalizedVariantOptions().kind(OrthogonalizedKind::kMop),
                              std::make_shared<Split>());
      },
      {"[muon::MOP]", "'tensor_parallel'", "whole matrices"});
}

// Each entry: its fields (own and muon_*), EO's defaults where they differ
// from Muon's, 1-D parameters routed to the scalar optimizer, state bytes
// and explain from the schema.
TEST(OrthogonalizedFamily, BuiltFromAConfigWithItsFieldsAndExplained) {
  for (const std::string name : {"polargrad", "scion", "mop", "spel", "muon_hyperball"}) {
    auto named = ckpt::matrix_and_bias();
    OptimizerConfig config;
    config.set("optimizer", name).set("lr", 0.01).set("muon_coefficient_type", std::string("polar_express"));
    if (name == "scion") config.set("scion_spectral_radius", 3.0);
    if (name == "polargrad") config.set("polargrad_nesterov", true);
    if (name == "muon_hyperball") config.set("muon_hyperball_radius", 2.0).set("muon_hyperball_eps", 1e-6);
    auto opt = muon::make_optimizer(named, config);
    ASSERT_EQ(opt->num_parts(), 2u) << name;
    auto* v = dynamic_cast<OrthogonalizedVariant*>(opt->find_part(name));
    ASSERT_NE(v, nullptr) << name;
    EXPECT_EQ(to_string(v->variant_options().kind()), name);
    const auto& o = static_cast<const MuonOptions&>(v->param_groups()[0].options());
    EXPECT_EQ(o.lr(), 0.01);
    EXPECT_EQ(o.ns().coefficients().name, "polar_express");
    EXPECT_EQ(o.nesterov(), name == "polargrad");  // EO's default off; polargrad set it
    if (name == "scion") {
      EXPECT_EQ(v->variant_options().spectral_radius(), 3.0);
      EXPECT_EQ(o.weight_decay(), 1.0);
    }
    if (name == "muon_hyperball") {
      EXPECT_EQ(v->variant_options().hyperball_radius(), 2.0);
      EXPECT_EQ(v->variant_options().hyperball_eps(), 1e-6);
      EXPECT_NEAR(named["w"].detach().norm().item<double>(), 2.0, 1e-5);  // rescaled when built
    }
    EXPECT_EQ(v->param_groups()[0].params().size(), 1u);  // the bias went to the scalar optimizer
    for (auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
    opt->step();
    const auto text = muon::explain(named, config);
    EXPECT_NE(text.find("state of " + name + ": step [counter], momentum_buffer [param, zeros, rows]"),
              std::string::npos)
        << text;
  }
}

// PolarGrad's ⟨O, M⟩ and Newton–Schulz sum in another order in a sharded
// layout, so resharded runs are compared within 1e-5 (as every layout is
// with one process); a single process loaded from a single process's
// checkpoint is bit-identical.
constexpr double kReshardTolerance = 1e-5;

class Checkpoints : public ::testing::TestWithParam<std::string> {};

TEST_P(Checkpoints, ResumeAndReshardBitIdentically) {
  const auto name = GetParam();
  const auto after = ckpt::one_process_after(name, {3, 4}, [&](ckpt::Rank& r) {
    const auto slots = distributed::detail::state_slots(*r.opt);
    EXPECT_TRUE(std::any_of(slots.begin(), slots.end(), [&](const auto& s) { return s.kind == name; }));
  });
  // One process → one process: bit-identical resume. Then split at 2 ranks
  // from it (row shards; layerwise for MOP, whose SVD needs whole matrices):
  // the momentum is split by rows or moved to its owner.
  const std::string split = name == "mop" ? "layerwise" : "sharded";
  const double split_tolerance = split == "layerwise" ? 0 : kReshardTolerance;
  ckpt::reshard_chain(name, name + "_reshard",
                      {{"none", 1, 2, "single"},
                       {"none", 1, 3, "single from single"},
                       {split, 2, 4, split + " W=2 from single", split_tolerance},
                       {"none", 1, 4, "single from " + split + " W=2", split_tolerance}},
                      after);
}

INSTANTIATE_TEST_SUITE_P(Kinds, Checkpoints,
                         ::testing::Values("polargrad", "scion", "mop", "spel", "muon_hyperball"));

}  // namespace
}  // namespace muon::test
