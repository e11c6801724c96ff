// Tests of muon::Moso: values against an independent fp64 reference of
// Emerging-Optimizers' arithmetic, options and their errors, save/load, the
// registry entry, and the layouts (layer-wise and sharded owner-compute,
// muon::distributed::ShardedMoso, equal to one process bit for bit;
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
#include "muon/distributed/layouts/sharded_moso.h"
#include "muon/optim/composite.h"
#include "muon/optim/laprop.h"
#include "muon/optim/moso.h"
#include "muon/registry.h"
#include "beside_reference.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace ckpt = muon::test::checkpoint;

// ---- an fp64 reference of Emerging-Optimizers' arithmetic ------------------------

// One parameter's plain fp64 run of MOSO as Emerging-Optimizers writes it:
// emerging_optimizers/legacy_soap/moso.py at fd77292 (MOSO.step,
// _update_one_sided_momentum_factor, _update_eigenbasis_and_exp_avg_sq,
// the projections), soap_utils.py get_eigenbasis_eigh/get_eigenbasis_qr,
// utils/eig.py eigh_with_fallback and orthogonal_iteration (QR, then the
// columns sorted by diag(QᵀMQ)), calculate_rmsprop_update,
// _clip_update_rms_in_place and WeightDecayMixin (decoupled). It records
// the smallest gap between M's eigenvalues relative to the largest, at
// every refresh: the eigenvectors are that sensitive to rounding.
struct RefMoso {
  MosoOptions o;
  at::Tensor p, b, v, m, q;
  int64_t s = 0;
  double min_gap = 1;

  RefMoso(const MosoOptions& options, const at::Tensor& init) : o(options) {
    p = init.to(at::kDouble).reshape({init.size(0), -1}).clone();
    b = at::zeros_like(p);
    v = at::zeros_like(p);
    const auto k = std::min(p.size(0), p.size(1));
    m = at::zeros({k, k}, p.options());
    q = at::eye(k, p.options());
  }
  void step(const at::Tensor& grad) {
    const auto g = grad.to(at::kDouble).reshape(p.sizes());
    const double t = static_cast<double>(s + 1);
    p = p - o.lr() * o.weight_decay() * p;
    b = o.momentum() * b + (1 - o.momentum()) * g;
    const double bs = 1 - (1 - o.shampoo_beta()) / (1 - std::pow(o.shampoo_beta(), t));
    const bool left = p.size(0) <= p.size(1);
    const auto x = left ? b : b.t();
    m = bs * m + (1 - bs) * x.mm(x.t());
    const auto w = std::get<0>(at::linalg_eigh(m));
    min_gap = std::min(min_gap, (w.slice(0, 1) - w.slice(0, 0, -1)).min().item<double>() / w.abs().max().item<double>());
    if (s == 0) {
      q = std::get<1>(at::linalg_eigh(m)).flip({-1});
    } else {
      q = std::get<0>(at::linalg_qr(m.mm(q)));
      const auto order = at::argsort((q.t().mm(m) * q.t()).sum(1), 0, /*descending=*/true);
      q = q.index_select(1, order);
    }
    const auto proj = left ? q.t().mm(b) : b.mm(q);
    v = o.rms_beta() * v + (1 - o.rms_beta()) * proj * proj;
    const auto r = proj / (v.sqrt() + o.eps());
    auto u = left ? q.mm(r) : r.mm(q.t());
    if (o.max_update_rms() > 0) {
      const double rms = u.square().mean().sqrt().item<double>();
      u = u * std::min(1.0, o.max_update_rms() / (rms + 1e-7));
    }
    p = p - o.lr() * u;
    s += 1;
  }
};

const MosoParamState& state_of(const torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const MosoParamState&>(*opt.state().at(compat::state_key(p)));
}

// Runs 5 fp32 steps beside the fp64 reference; compares the change of the
// parameter, the momentum, M, the second moment and Q_M (up to column
// signs). Why 1e-5: every quantity is O(10–100) fp32 operations per element
// (2^-24 each) on values of order 1, except the eigenvectors, whose fp32
// error is about 2^-24·‖M‖/gap for each eigenvalue gap (first-order
// perturbation): these inputs keep every gap above 1% of ‖M‖ (asserted), so
// the basis carries < 2^-24/0.01 ≈ 6e-6 relative error, and RMSprop divides
// by √v of the order of the projected momentum, not amplifying it. v and
// the update do not see Q's column signs (v holds squares; Q·U flips back).
void expect_matches_reference(const std::vector<int64_t>& shape, const MosoOptions& o, uint64_t seed) {
  BesideReference<Moso, RefMoso> beside(gradient_run(seed, shape, 5), o, o, 5);
  auto& [data, ref, p, opt] = beside;
  const auto what = "shape " + c10::str(c10::IntArrayRef(shape)) + " max_update_rms " +
                    std::to_string(o.max_update_rms());
  ASSERT_GT(ref.min_gap, 0.01) << what;
  const auto init = data.init.to(at::kDouble).reshape(ref.p.sizes());
  EXPECT_LT(relative(p.detach().reshape(ref.p.sizes()).to(at::kDouble) - init, ref.p - init), 1e-5) << what;
  const auto& st = state_of(opt, p);
  EXPECT_EQ(st.step(), 5) << what;
  EXPECT_LT(relative(st.momentum_buffer(), ref.b), 1e-5) << what;
  EXPECT_LT(relative(st.M(), ref.m), 1e-5) << what;
  EXPECT_LT(relative(st.exp_avg_sq(), ref.v), 1e-5) << what;
  EXPECT_LT(relative(signs_aligned(st.Q_M(), ref.q), ref.q), 1e-5) << what;
}

TEST(Moso, FiveFp32StepsEqualEmergingOptimizersArithmetic) {
  const auto plain = MosoOptions(0.01).momentum(0.9).rms_beta(0.9).shampoo_beta(0.8).weight_decay(0.1);
  // max_update_rms 0.5 is below the unclipped update's RMS (about 1 to 4), so the clip acts at every step.
  const auto clipped = MosoOptions(0.02).weight_decay(0.0).max_update_rms(0.5);
  for (const auto& o : {plain, clipped}) {
    expect_matches_reference({5, 8}, o, 1);        // wide: M is 5×5 (left)
    expect_matches_reference({9, 4}, o, 2);        // tall: M is 4×4 (right)
    expect_matches_reference({6, 2, 2, 2}, o, 3);  // conv: one 6×8 matrix
  }
}

TEST(Moso, DefaultsAreEmergingOptimizers) {
  // MOSO.__init__: lr, momentum, rms_beta, shampoo_beta, eps, weight_decay, max_update_rms.
  elementwise::expect_fields(MosoOptions(), 3e-4, 0.95, 0.95, 0.95, 1e-8, 0.01, 0.0);
}

TEST(Moso, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({4, 3}));
  const auto bad = elementwise::refused_with<Moso, MosoOptions>({p});
  bad(MosoOptions(-1), {"[muon::Moso]", "lr", "-1"});
  bad(MosoOptions().momentum(1), {"momentum", "1"});
  bad(MosoOptions().rms_beta(-0.5), {"rms_beta", "-0.5"});
  bad(MosoOptions().shampoo_beta(1.5), {"shampoo_beta", "1.5"});
  bad(MosoOptions().eps(0), {"eps", "0"});
  bad(MosoOptions().weight_decay(-0.1), {"weight_decay", "-0.1"});
  bad(MosoOptions().max_update_rms(-2), {"max_update_rms", "-2"});
  auto v = leaf(at::randn({5}));
  expect_value_error([&] { Moso opt({v}); }, {"[muon::Moso]", "1 dims", "matrices"});
  // An edit between steps is checked by the step, which changes nothing.
  Moso opt({p}, MosoOptions(0.1));
  elementwise::expect_spoiled_step_changes_nothing<MosoParamState>(
      opt, p, at::ones_like(p), [&] { static_cast<MosoOptions&>(opt.param_groups()[0].options()).rms_beta(1); },
      {"rms_beta", "1"});
}

TEST(Moso, AGradientBeyondTheCovariancesRangeChangesNothing) {
  // B·Bᵀ of a momentum of 1e30 overflows fp32: the step raises, naming the
  // parameter and the covariance, and restores the momentum it had updated.
  auto p = leaf(at::randn({4, 6}));
  Moso opt({p}, MosoOptions(0.1));
  elementwise::expect_spoiled_step_changes_nothing<MosoParamState>(
      opt, p, at::randn({4, 6}), [&] { p.mutable_grad() = at::full({4, 6}, 1e30); },
      {"[muon::Moso]", "covariance M", "not finite"});
}

TEST(Moso, ResumedRunIsBitIdentical) {
  for (const auto& options : {MosoOptions(0.01), MosoOptions(0.01).max_update_rms(0.3)}) {
    expect_resumed_run_bit_identical<Moso>(gradient_run(1, {6, 4}, 7), 3, options, MosoOptions(0.5), state_of,
                                           std::to_string(options.max_update_rms()));
    expect_resumed_run_bit_identical<Moso>(gradient_run(2, {3, 7}, 7), 3, options, MosoOptions(0.5), state_of,
                                           "wide");
  }
}

TEST(Moso, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  expect_refuses_archive_of<Moso, LaProp>(MosoOptions(0.2), "[muon::Moso]", "muon::LaProp");
}

TEST(Moso, BuiltFromAConfigWithItsFieldsAndExplained) {
  ckpt::BuiltFromConfig<Moso, MosoOptions> built(
      "moso", R"({"optimizer": "moso", "lr": 0.01, "moso_momentum": 0.5, "moso_rms_beta": 0.9,
                  "moso_shampoo_beta": 0.8, "moso_eps": 1e-6, "moso_max_update_rms": 2})");
  ASSERT_NE(built.part, nullptr);
  // Every field: the config's, its weight_decay 0 (the common field's default) included.
  elementwise::expect_fields(built.options(), 0.01, 0.5, 0.9, 0.8, 1e-6, 0.0, 2.0);
  const auto text = built.step_and_explain();
  // w 8×4 (right side, 4×4): momentum_buffer and exp_avg_sq 8×4, M and Q_M 4×4; fp32.
  EXPECT_EQ(built.part->state_bytes(), 4 * (2 * 32 + 2 * 16));
  EXPECT_NE(text.find("state of moso: step [counter], momentum_buffer ["), std::string::npos) << text;
}

// ---- layouts ---------------------------------------------------------------------

TEST(Moso, LayerwiseAndShardedEqualOneProcessThroughMakeOptimizer) {
  ckpt::expect_owner_compute_layouts<distributed::ShardedMoso>("moso", 4);
}

// Why bit for bit: the owner receives the whole gradient as one process has
// it and runs muon::detail::moso_matrix_update, the function one process
// runs; each rank applies weight decay and its rows of the update with the
// same element-wise operations. Wide, tall, conv and a 2-row matrix (empty
// shards at 3 and 4 ranks).
const layouts::SeededMatrices kSharded{{{7, 12}, {13, 5}, {6, 2, 2, 3}, {2, 9}}, 90, 500};

TEST(ShardedMoso, OwnerComputeEqualsOneProcessBitForBit) {
  for (const auto& o : {MosoOptions(0.02).weight_decay(0.1), MosoOptions(0.02).max_update_rms(0.5).momentum(0.5)}) {
    layouts::owner_compute_bit_for_bit<Moso, distributed::ShardedMoso>(
        kSharded, 5, o, std::to_string(o.max_update_rms()), state_of,
        [](const MosoParamState& st, const MosoParamState& want) {
          return at::equal(st.momentum_buffer(), want.momentum_buffer()) && at::equal(st.M(), want.M()) &&
                 at::equal(st.Q_M(), want.Q_M()) && at::equal(st.exp_avg_sq(), want.exp_avg_sq());
        },
        [](const MosoParamState& st) { return !st.M().defined(); });
  }
}

TEST(ShardedMoso, CheckpointsReshardBitIdentically) { ckpt::owner_compute_reshard_chain("moso"); }

TEST(ShardedMoso, SplittingLayoutsAreRefusedNamingTheOptimizer) {
  ckpt::expect_splitting_layouts_refused<distributed::ShardedMoso>("moso", "[muon::distributed::ShardedMoso]",
                                                                   MosoOptions(), "moso");
}

}  // namespace
}  // namespace muon::test
