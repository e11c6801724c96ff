// muon::PsgdPro against an fp64 reference written from Emerging-Optimizers'
// emerging_optimizers/psgd/{psgd.py, procrustes_step.py,
// psgd_kron_contractions.py, psgd_utils.py} at fd77292 (its random draws
// taken from the same seeded generator, in the same order); its defaults,
// errors, save/load; the layouts and the checkpoints.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "archive_util.h"
#include "elementwise_cases.h"
#include "expect_util.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "checkpoint_model.h"
#include "layout_harness.h"
#include "muon/compat.h"
#include "muon/distributed/layouts/sharded_psgd_pro.h"
#include "muon/optim/composite.h"
#include "muon/optim/laprop.h"
#include "muon/optim/psgd_pro.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace ckpt = muon::test::checkpoint;

const PsgdProParamState& state_of(const PsgdPro& opt, const at::Tensor& p) {
  return static_cast<const PsgdProParamState&>(*opt.state().at(compat::state_key(p)));
}

// The reference: PSGDPro.step on one matrix in fp64, the tensordot
// contractions of psgd_kron_contractions.py and the bounds of psgd_utils.py
// written out.
struct RefPsgd {
  PsgdProOptions o;
  at::Tensor p, m;
  std::vector<at::Tensor> q;
  std::vector<double> lip{1.0, 1.0};
  int64_t s = 0;

  RefPsgd(const PsgdProOptions& options, const at::Tensor& init) : o(options) {
    p = init.to(at::kDouble).reshape({init.size(0), -1}).clone();
    m = at::zeros_like(p);
    for (const auto d : p.sizes()) q.push_back(at::eye(d, p.options()) * o.precond_init_scale());
  }

  // apply_kronecker_factors: each factor contracted with its axis.
  static at::Tensor kron(const std::vector<at::Tensor>& factors, const at::Tensor& x) {
    auto y = at::tensordot(factors[0], x, {1}, {0});
    return at::tensordot(factors[1], y, {1}, {1}).permute({1, 0});
  }
  at::Tensor precondition(const at::Tensor& x) const { return kron({q[0].t(), q[1].t()}, kron(q, x)); }

  static double subspace_bound(const at::Tensor& a, at::Generator& gen) {
    auto v = at::randn({32, a.size(1)}, gen, at::TensorOptions().dtype(at::kDouble));
    const auto row = a[at::argmax(at::linalg_vector_norm(a, 2, {1}))];
    v = row + at::sign((row * v).sum(1, true)) * v;
    for (int i = 0; i < 2; ++i) {
      v = v.mm(a);
      v = v / (at::linalg_vector_norm(v, 2, {1}, true) + 1e-8);
      v = v.mm(a);
    }
    return at::linalg_vector_norm(v, 2, {1}).max().item<double>();
  }
  static at::Tensor procrustes(const at::Tensor& qm, at::Generator& gen) {
    auto r = qm.t() - qm;
    const double scale = std::max(r.abs().max().item<double>(), 1e-8);
    r = r / std::max(scale * subspace_bound(r / scale, gen), 1e-8);
    const auto rq = r.mm(qm);
    const auto rrq = r.mm(rq);
    const double tr_rq = rq.trace().item<double>(), tr_rrq = rrq.trace().item<double>();
    const double a = tr_rrq < 0 ? std::min(std::max(-tr_rq / tr_rrq, 0.0), 0.125) : 0.125;
    return qm + a * (rq + 0.5 * a * rrq);
  }

  void step(const at::Tensor& grad) {
    auto g = grad.to(at::kDouble).reshape(p.sizes());
    const double wd = o.weight_decay();
    if (o.weight_decay_method() == "decoupled") p = p * (1 - o.lr() * wd);
    if (o.weight_decay_method() == "independent") p = p * (1 - wd);
    if (o.weight_decay_method() == "l2") g = g + wd * p;
    m = m + (1 - o.momentum()) * (g - m);
    const double eta = std::max(o.precond_lr() / std::sqrt(1.0 + static_cast<double>(s) / o.warmup_steps()),
                                o.min_precond_lr());
    auto gen = at::make_generator<at::CPUGeneratorImpl>(detail::psgd_pro_seed(o, p.size(0), p.size(1), s));
    const auto noise = at::randn(p.sizes(), gen, at::TensorOptions().dtype(at::kDouble));
    const auto pg = precondition(m + (o.damping_noise_scale() + 1e-7 * m.abs()) * noise);
    const double numel = static_cast<double>(pg.numel());
    std::vector<at::Tensor> fitted;
    for (int64_t dim = 0; dim < 2; ++dim) {
      const auto cov = at::tensordot(pg, pg, {1 - dim}, {1 - dim});  // partial_contraction
      const double c = numel / static_cast<double>(q[dim].size(0));
      const double scale = std::max(cov.diagonal().max().item<double>(), 1e-8);
      const double ell = scale * subspace_bound(cov / scale, gen) + c;
      lip[dim] = std::max(o.beta_lip() * lip[dim] + (1 - o.beta_lip()) * ell, ell);
      fitted.push_back(procrustes(q[dim] - eta / lip[dim] * (cov.mm(q[dim]) - c * q[dim]), gen));
    }
    const double n0 = fitted[0].abs().max().item<double>(), n1 = fitted[1].abs().max().item<double>();
    const double mean = std::sqrt(n0 * n1);
    q = {fitted[0] * (mean / n0), fitted[1] * (mean / n1)};
    auto u = precondition(m);
    if (o.max_update_rms() > 0) u = u * std::min(1.0, o.max_update_rms() / (u.square().mean().sqrt().item<double>() + 1e-7));
    p = p - o.lr() * u;
    ++s;
  }
};

// fp64 on both sides, the same draws: the differences are rounding in the
// order of the contractions (1e-16 per operation), amplified by the
// preconditioner's conditioning over 5 steps (its factors stay within a few
// units of I here: growth below 1e3), so 1e-10 of the change holds with a
// wide margin and catches any wrong term (each moves the weight by ~lr).
void expect_matches_reference(const std::vector<int64_t>& shape, const PsgdProOptions& o, uint64_t seed) {
  const auto data = gradient_run(seed, shape, 5);
  RefPsgd ref(o, data.init);
  auto p = leaf(data.init.to(at::kDouble));
  PsgdPro opt({p}, o);
  for (int s = 0; s < 5; ++s) {
    ref.step(data.grads[static_cast<size_t>(s)]);
    p.mutable_grad() = data.grads[static_cast<size_t>(s)].to(at::kDouble);
    opt.step();
  }
  const auto what = "shape " + c10::str(c10::IntArrayRef(shape)) + " " + o.weight_decay_method();
  const auto init = data.init.to(at::kDouble).reshape(ref.p.sizes());
  EXPECT_LT(relative(p.detach().reshape(ref.p.sizes()) - init, ref.p - init), 1e-10) << what;
  const auto& st = state_of(opt, p);
  EXPECT_EQ(st.step(), 5) << what;
  EXPECT_LT(relative(st.Q_L(), ref.q[0]), 1e-10) << what;
  EXPECT_LT(relative(st.Q_R(), ref.q[1]), 1e-10) << what;
  EXPECT_NEAR(st.lip_L().item<double>(), ref.lip[0], 1e-10 * ref.lip[0]) << what;
}

TEST(PsgdPro, FiveFp64StepsEqualEmergingOptimizersArithmetic) {
  // warmup_steps 2 and precond_lr 0.5 move the schedule through its floor
  // (0.2) within the 5 steps; max_update_rms 0.05 clips every step.
  const auto base = PsgdProOptions(0.01).weight_decay(0.1).precond_lr(0.5).min_precond_lr(0.2).warmup_steps(2);
  for (const auto& method : {"decoupled", "independent", "l2"}) {
    const auto o = PsgdProOptions(base).weight_decay_method(method);
    expect_matches_reference({6, 6}, o, 1);     // 2-D
    expect_matches_reference({9, 4}, o, 2);     // tall
    expect_matches_reference({4, 9}, o, 3);     // wide
    expect_matches_reference({6, 3, 2}, o, 4);  // conv: one 6×6 matrix
  }
  expect_matches_reference({7, 5}, PsgdProOptions(0.02).max_update_rms(0.05).damping_noise_scale(0.5).seed(9), 5);
}

TEST(PsgdPro, DefaultsAreEmergingOptimizers) {
  // PSGDPro.__init__: lr, weight_decay, weight_decay_method, momentum,
  // beta_lip, precond_lr, precond_init_scale, damping_noise_scale,
  // min_precond_lr, warmup_steps, max_update_rms; the draws' seed 0.
  elementwise::expect_fields(PsgdProOptions(), 3e-3, 0.01, "decoupled", 0.9, 0.9, 0.1, 1.0, 0.1, 0.01, 10000,
                             0.0, 0);
}

TEST(PsgdPro, InvalidOptionsNameArgumentAndValue) {
  auto bad = [](const PsgdProOptions& o, const std::vector<std::string>& parts) {
    auto all = parts;
    all.insert(all.begin(), "[muon::PsgdPro]");
    expect_value_error([&] { o.validate(); }, all);
  };
  bad(PsgdProOptions(-1), {"lr", "-1"});
  bad(PsgdProOptions().momentum(1.0), {"momentum", "1"});
  bad(PsgdProOptions().beta_lip(-0.1), {"beta_lip", "-0.1"});
  bad(PsgdProOptions().precond_lr(0), {"precond_lr", "0"});
  bad(PsgdProOptions().min_precond_lr(0.5), {"min_precond_lr", "0.5"});
  bad(PsgdProOptions().warmup_steps(0), {"warmup_steps", "0"});
  bad(PsgdProOptions().weight_decay_method("palm"), {"weight_decay_method", "'palm'"});
  bad(PsgdProOptions().precond_init_scale(0), {"precond_init_scale", "0"});
}

TEST(PsgdPro, ResumedRunIsBitIdentical) {
  expect_resumed_run_bit_identical<PsgdPro>(gradient_run(1, {6, 4}, 7), 3, PsgdProOptions(0.01), PsgdProOptions(0.5),
                                            state_of, "tall");
  expect_resumed_run_bit_identical<PsgdPro>(gradient_run(2, {3, 7}, 7), 3, PsgdProOptions(0.01).weight_decay_method("l2"),
                                            PsgdProOptions(0.5), state_of, "wide, l2");
}

TEST(PsgdPro, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  expect_refuses_archive_of<PsgdPro, LaProp>(PsgdProOptions(0.2), "[muon::PsgdPro]", "muon::LaProp");
}

TEST(PsgdPro, BuiltFromAConfigWithItsFieldsAndExplained) {
  ckpt::BuiltFromConfig<PsgdPro, PsgdProOptions> built(
      "psgd_pro", R"({"optimizer": "psgd_pro", "lr": 0.01, "psgd_pro_momentum": 0.5,
                      "psgd_pro_precond_lr": 0.2, "psgd_pro_warmup_steps": 50, "psgd_pro_seed": 3,
                      "psgd_pro_weight_decay_method": "l2"})");
  ASSERT_NE(built.part, nullptr);
  // Every field: the config's where it set them, the common weight_decay's 0, the rest PSGD-Pro's defaults.
  elementwise::expect_fields(built.options(), 0.01, 0.0, "l2", 0.5, 0.9, 0.2, 1.0, 0.1, 0.01, 50, 0.0, 3);
  const auto text = built.step_and_explain();
  // w 8×4: exp_avg 8×4, Q_L 8×8, Q_R 4×4, two scalars; fp32.
  EXPECT_EQ(built.part->state_bytes(), 4 * (32 + 64 + 16 + 2));
  EXPECT_NE(text.find("state of psgd_pro: step [counter], exp_avg ["), std::string::npos) << text;
}

// ---- layouts ---------------------------------------------------------------------

// Why bit for bit: the owner receives the whole gradient as one process has
// it and runs muon::detail::psgd_pro_update, its draws seeded by the shape
// and the step as one process seeds them; each rank applies weight decay
// and its rows of the update with the same element-wise operations.
TEST(PsgdPro, LayerwiseAndShardedEqualOneProcessThroughMakeOptimizer) {
  ckpt::expect_owner_compute_layouts<distributed::ShardedPsgdPro>(
      "psgd_pro", 4, {{"layerwise", 2}, {"layerwise", 3}, {"sharded", 2}, {"sharded", 3}, {"padded", 3}});
}

TEST(ShardedPsgdPro, CheckpointsReshardBitIdentically) { ckpt::owner_compute_reshard_chain("psgd_pro"); }

TEST(ShardedPsgdPro, SplittingLayoutsAreRefusedNamingTheOptimizer) {
  ckpt::expect_splitting_layouts_refused<distributed::ShardedPsgdPro>(
      "psgd_pro", "[muon::distributed::ShardedPsgdPro]", PsgdProOptions(), "psgd_pro");
}

}  // namespace
}  // namespace muon::test
