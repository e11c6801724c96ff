// Tests of muon::Iso: values against an independent fp64 reference of
// Emerging-Optimizers' arithmetic, options and their errors, save/load, the
// registry entry, and the layouts (layer-wise and sharded owner-compute,
// muon::distributed::ShardedIso, equal to one process bit for bit;
// checkpoints resharded across them; tensor_parallel and 2-D refused).
#include <gtest/gtest.h>

#include "archive_util.h"
#include "elementwise_cases.h"
#include "expect_util.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_model.h"
#include "layout_harness.h"
#include "muon/compat.h"
#include "muon/distributed/layouts/sharded_iso.h"
#include "muon/optim/composite.h"
#include "muon/optim/iso.h"
#include "muon/optim/laprop.h"
#include "muon/registry.h"
#include "beside_reference.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace ckpt = muon::test::checkpoint;

// ---- an fp64 reference of Emerging-Optimizers' arithmetic ------------------------

// One parameter's plain fp64 run of Iso as Emerging-Optimizers writes it
// (emerging_optimizers/riemannian_optimizers/isospectral.py at fd77292:
// Iso._init_state, Iso.step, _qr_retraction, _polar_retraction,
// _cayley_retraction). It records the smallest gap between consecutive
// singular values of the start, relative to the largest: the SVD's
// factors are that sensitive to rounding.
struct RefIso {
  double lr, momentum;
  std::string retraction;
  at::Tensor u, sigma, v, mu, mv, x;
  double min_gap = 1;

  RefIso(const IsoOptions& o, const at::Tensor& init)
      : lr(o.lr()), momentum(o.momentum()), retraction(o.retraction()) {
    const auto w = init.to(at::kDouble).reshape({init.size(0), -1});
    auto [uu, s, vh] = at::linalg_svd(w, false);
    u = uu;
    sigma = s;
    v = vh.t();
    mu = at::zeros_like(u);
    mv = at::zeros_like(v);
    for (int64_t j = 0; j + 1 < s.size(0); ++j) {
      min_gap = std::min(min_gap, (s[j] - s[j + 1]).item<double>() / s[0].item<double>());
    }
    x = w;
  }
  at::Tensor retract(const at::Tensor& y, const at::Tensor& m) const {
    if (retraction == "cayley") {
      const auto d = -m;
      const auto skew = d.mm(y.t()) - y.mm(d.t());
      const auto eye = at::eye(y.size(0), y.options());
      return at::linalg_solve(eye - 0.5 * lr * skew, (eye + 0.5 * lr * skew).mm(y));
    }
    const auto z = y - lr * m;
    if (retraction == "polar") {
      auto [a, s, bh] = at::linalg_svd(z, false);
      return a.mm(bh);
    }
    auto [q, r] = at::linalg_qr(z);
    auto signs = r.diagonal().sign();
    signs.masked_fill_(signs.eq(0), 1);
    return q * signs;
  }
  void step(const at::Tensor& grad) {
    const auto g = grad.to(at::kDouble).reshape(x.sizes());
    mu = momentum * mu + g.mm(v) * sigma.unsqueeze(0);
    mv = momentum * mv + g.t().mm(u) * sigma.unsqueeze(0);
    u = retract(u, mu);
    v = retract(v, mv);
    x = (u * sigma.unsqueeze(0)).mm(v.t());
  }
};

const IsoParamState& state_of(const torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const IsoParamState&>(*opt.state().at(compat::state_key(p)));
}

// Runs 5 fp32 steps beside the fp64 reference and compares X, U and V (up
// to column signs), the momenta and σ. Tolerance: 5·d·u/gap, u = 2^-24,
// d the longest side, gap the smallest relative gap between singular
// values: the fp32 SVD's singular vectors move by about d·u/gap (Wedin's
// bound: the perturbation d·u·σ₁ over the gap), and each step's products
// and retraction of the near-orthonormal Y − lr·M (condition ≈ 1) add d·u;
// 5 steps. The gaps must stay above 1e-3 for the bound to mean something.
void expect_matches_reference(const std::vector<int64_t>& shape, const IsoOptions& o, uint64_t seed) {
  BesideReference<Iso, RefIso> beside(gradient_run(seed, shape, 5), o, o, 5);
  auto& [data, ref, p, opt] = beside;
  const auto what = "shape " + c10::str(c10::IntArrayRef(shape)) + " retraction " + o.retraction();
  ASSERT_GT(ref.min_gap, 1e-3) << what;
  const double d = static_cast<double>(std::max(ref.x.size(0), ref.x.size(1)));
  const double tol = 5 * d * std::ldexp(1.0, -24) / ref.min_gap;
  EXPECT_LT(relative(p.detach(), ref.x), tol) << what;
  const auto& st = state_of(opt, p);
  EXPECT_EQ(st.step(), 5) << what;
  EXPECT_LT(relative(st.sigma(), ref.sigma), tol) << what;
  EXPECT_LT(relative(signs_aligned(st.u(), ref.u), ref.u), tol) << what;
  EXPECT_LT(relative(signs_aligned(st.v(), ref.v), ref.v), tol) << what;
  // The momenta flip with their factor's columns.
  const auto su = (st.u().to(at::kDouble) * ref.u).sum(0, true).sign();
  EXPECT_LT(relative(st.momentum_u().to(at::kDouble) * su, ref.mu), tol) << what;
  const auto sv = (st.v().to(at::kDouble) * ref.v).sum(0, true).sign();
  EXPECT_LT(relative(st.momentum_v().to(at::kDouble) * sv, ref.mv), tol) << what;
}

TEST(Iso, FiveFp32StepsEqualEmergingOptimizersArithmetic) {
  for (const std::string retraction : {"qr", "polar", "cayley"}) {
    const auto o = IsoOptions(0.01).momentum(0.8).retraction(retraction);
    expect_matches_reference({12, 5}, o, 1);       // tall
    expect_matches_reference({6, 10}, o, 2);       // wide
    expect_matches_reference({4, 3, 3, 3}, o, 3);  // conv: one 4×27 matrix
  }
}

TEST(Iso, KeepsTheSingularValuesAndOverwritesEdits) {
  const auto init = at::randn({8, 5});
  auto p = leaf(init);
  auto q = leaf(init);
  const auto s0 = at::linalg_svdvals(init);
  Iso a({p}, IsoOptions(0.05));
  Iso b({q}, IsoOptions(0.05));
  for (int s = 0; s < 4; ++s) {
    const auto g = at::randn({8, 5});
    p.mutable_grad() = g.clone();
    q.mutable_grad() = g.clone();
    // An edit between steps is lost: X is rebuilt from the factors.
    if (s == 3) p.detach().mul_(3);
    a.step();
    b.step();
  }
  EXPECT_TRUE(at::equal(p.detach(), q.detach()));
  // σ fixed: the parameter's singular values are the start's (to fp32 rounding of U·diag(σ)·Vᵀ).
  EXPECT_TRUE(at::allclose(at::linalg_svdvals(p.detach()), s0, 1e-5, 1e-5));
}

TEST(Iso, DefaultsAreEmergingOptimizers) {
  const IsoOptions o;  // Iso.__init__: lr 1e-3, momentum 0.9, retraction "qr"
  EXPECT_EQ(o.lr(), 1e-3);
  EXPECT_EQ(o.momentum(), 0.9);
  EXPECT_EQ(o.retraction(), "qr");
  EXPECT_EQ(o.weight_decay(), 0.0);
}

TEST(Iso, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({4, 3}));
  const auto bad = elementwise::refused_with<Iso, IsoOptions>({p});
  bad(IsoOptions(-1), {"[muon::Iso]", "lr", "-1"});
  bad(IsoOptions().momentum(1), {"momentum", "1"});
  bad(IsoOptions().retraction("svd"), {"retraction", "'svd'", "cayley"});
  bad(IsoOptions().weight_decay(0.1), {"weight_decay", "0.1"});
  auto v = leaf(at::randn({5}));
  expect_value_error([&] { Iso opt({v}); }, {"[muon::Iso]", "1 dims", "matrices"});
  Iso opt({p}, IsoOptions(0.1));
  static_cast<IsoOptions&>(opt.param_groups()[0].options()).retraction("exp");
  p.mutable_grad() = at::ones_like(p);
  const auto before = p.detach().clone();
  expect_value_error([&] { opt.step(); }, {"retraction", "exp"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_TRUE(opt.state().empty());
}

TEST(Iso, ResumedRunIsBitIdentical) {
  for (const auto& options : {IsoOptions(0.01), IsoOptions(0.01).retraction("cayley")}) {
    expect_resumed_run_bit_identical<Iso>(gradient_run(1, {6, 4}, 7), 3, options, IsoOptions(0.5), state_of,
                                          options.retraction());
  }
}

TEST(Iso, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  expect_refuses_archive_of<Iso, LaProp>(IsoOptions(0.2), "[muon::Iso]", "muon::LaProp");
}

TEST(Iso, BuiltFromAConfigWithItsFieldsAndExplained) {
  ckpt::BuiltFromConfig<Iso, IsoOptions> built(
      "iso", R"({"optimizer": "iso", "lr": 0.01, "iso_momentum": 0.5, "iso_retraction": "polar"})");
  ASSERT_NE(built.part, nullptr);
  // Every field: lr, momentum, retraction as the config set them; weight_decay the common field's 0.
  elementwise::expect_fields(built.options(), 0.01, 0.5, "polar", 0.0);
  const auto text = built.step_and_explain();
  // w 8×4, k = 4: u and momentum_u 8×4, v and momentum_v 4×4, sigma 4; fp32.
  EXPECT_EQ(built.part->state_bytes(), 4 * (2 * 32 + 2 * 16 + 4));
  EXPECT_NE(text.find("state of iso: step [counter], u ["), std::string::npos) << text;
  apply_config_json(built.config, R"({"weight_decay": 0.1})");
  expect_value_error([&] { muon::make_optimizer(built.named, built.config); }, {"weight_decay", "0.1"});
}

// ---- layouts ---------------------------------------------------------------------

TEST(Iso, LayerwiseAndShardedEqualOneProcessThroughMakeOptimizer) {
  ckpt::expect_owner_compute_layouts<distributed::ShardedIso>("iso", 4);
}

// Why bit for bit: the owner receives the whole gradient (and at the first
// step the whole parameter) as one process has them and runs
// muon::detail::iso_matrix_update, the function one process runs; each rank
// copies its rows of the result. Wide, tall, conv and a 2-row matrix (empty
// shards at 3 and 4 ranks).
const layouts::SeededMatrices kSharded{{{7, 12}, {13, 5}, {6, 2, 2, 3}, {2, 9}}, 70, 300};

TEST(ShardedIso, OwnerComputeEqualsOneProcessBitForBit) {
  for (const auto& o : {IsoOptions(0.02), IsoOptions(0.02).retraction("cayley").momentum(0.5)}) {
    layouts::owner_compute_bit_for_bit<Iso, distributed::ShardedIso>(
        kSharded, 5, o, o.retraction(), state_of,
        [](const IsoParamState& st, const IsoParamState& want) {
          return at::equal(st.u(), want.u()) && at::equal(st.v(), want.v()) &&
                 at::equal(st.momentum_u(), want.momentum_u());
        },
        [](const IsoParamState& st) { return !st.u().defined(); });
  }
}

TEST(ShardedIso, CheckpointsReshardBitIdentically) { ckpt::owner_compute_reshard_chain("iso"); }

TEST(ShardedIso, SplittingLayoutsAreRefusedNamingTheOptimizer) {
  ckpt::expect_splitting_layouts_refused<distributed::ShardedIso>("iso", "[muon::distributed::ShardedIso]", IsoOptions(),
                                                                  "iso");
}

}  // namespace
}  // namespace muon::test
