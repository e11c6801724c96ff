// Tests of muon::Soap: values against an independent fp64 reference of
// Emerging-Optimizers' SOAP, options and their errors, save/load, the
// registry entry (config fields, make_optimizer, explain), checkpoints
// resharded across layouts, and the distributed layouts (layer-wise and
// sharded owner-compute (muon::distributed::ShardedSoap) equal to one process bit
// for bit, tensor_parallel and 2-D refused).
#include <gtest/gtest.h>
#include <unistd.h>

#include "archive_util.h"
#include "elementwise_cases.h"
#include "expect_util.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_model.h"
#include "layout_harness.h"
#include "distributed/checkpoints/checkpoint_state.h"
#include "muon/compat.h"
#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/sharded_soap.h"
#include "muon/optim/composite.h"
#include "muon/optim/laprop.h"
#include "muon/optim/soap.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace ckpt = muon::test::checkpoint;

struct Hyper {
  double lr, beta1, beta2, shampoo_beta, eps, wd;
  SoapWeightDecay method;
  bool nesterov;
  int64_t frequency, warmup;
  bool correct_bias, correct_shampoo_bias, use_eigh;
  double max_rms;

  SoapOptions options() const {
    return SoapOptions(lr)
        .beta1(beta1)
        .beta2(beta2)
        .shampoo_beta(shampoo_beta)
        .eps(eps)
        .weight_decay(wd)
        .weight_decay_method(method)
        .use_nesterov(nesterov)
        .precondition_frequency(frequency)
        .adam_warmup_steps(warmup)
        .correct_bias(correct_bias)
        .correct_shampoo_beta_bias(correct_shampoo_bias ? 1 : 0)
        .use_eigh(use_eigh)
        .max_update_rms(max_rms);
  }
};

// Eigenvectors of the symmetric k by descending eigenvalue (fp64).
at::Tensor eigh_descending(const at::Tensor& k) { return std::get<1>(at::linalg_eigh(k)).flip({-1}); }

// The smallest gap between eigenvalues of k relative to its largest one.
double relative_gap(const at::Tensor& k) {
  const auto w = std::get<0>(at::linalg_eigh(k));
  return (w.slice(0, 1) - w.slice(0, 0, -1)).min().item<double>() / w.abs().max().item<double>();
}

// One matrix parameter's plain fp64 run of SOAP as Emerging-Optimizers
// writes it: emerging_optimizers/soap/soap.py (SOAP.step,
// update_kronecker_factors, update_eigenbasis_and_momentum, precondition,
// _is_eigenbasis_update_step, _clip_update_rms_in_place) and
// soap/soap_utils.py (get_eigenbasis_eigh, get_eigenbasis_qr) at
// 18adc0bb8914db6942e3a1d814872570244b6fad, utils/eig.py
// (eigh_with_fallback, orthogonal_iteration) at fc96b03c, calculate_adam_update
// and WeightDecayMixin; the paper is Vyas et al., arXiv:2409.11321. Written
// with fp64 matrix products, eigh and QR, step by step from those files.
struct Reference {
  at::Tensor p, m, v, L, R, QL, QR;  // p as the m×n matrix
  int64_t s = 0;
  double min_gap = 1.0;  // the smallest relative eigen-gap of any factor at a refresh

  explicit Reference(const at::Tensor& init) {
    p = init.detach().to(at::kDouble).reshape({init.size(0), -1}).clone();
    m = at::zeros_like(p);
    v = at::zeros_like(p);
    L = at::zeros({p.size(0), p.size(0)}, p.options());
    R = at::zeros({p.size(1), p.size(1)}, p.options());
  }

  static at::Tensor qr_refresh(const at::Tensor& k, const at::Tensor& q, at::Tensor& v, int64_t axis) {
    const auto d = (q.t().mm(k) * q.t()).sum(1);
    const auto order = at::argsort(d, 0, /*descending=*/true);
    v = v.index_select(axis, order);
    return std::get<0>(at::linalg_qr(k.mm(q.index_select(1, order))));
  }

  void step(const at::Tensor& grad, const Hyper& h) {
    const auto g = grad.to(at::kDouble).reshape({p.size(0), -1});
    const double t = static_cast<double>(s + 1);
    double bs = h.shampoo_beta;
    if (h.correct_shampoo_bias) bs = 1 - (1 - bs) / (1 - std::pow(bs, t));
    L = bs * L + (1 - bs) * g.mm(g.t());
    R = bs * R + (1 - bs) * g.t().mm(g);
    if (s >= h.warmup && (s == h.warmup || s % h.frequency == 0)) {
      const auto mom = QL.defined() ? QL.mm(m).mm(QR.t()) : m;
      min_gap = std::min({min_gap, relative_gap(L), relative_gap(R)});
      if (s == h.warmup || h.use_eigh) {
        QL = eigh_descending(L);
        QR = eigh_descending(R);
      } else {
        QL = qr_refresh(L, QL, v, 0);
        QR = qr_refresh(R, QR, v, 1);
      }
      m = QL.t().mm(mom).mm(QR);
    }
    auto ga = g;
    if (h.method == SoapWeightDecay::kDecoupled) p = p - h.lr * h.wd * p;
    if (h.method == SoapWeightDecay::kL2) ga = g + h.wd * p;
    const bool pre = s >= h.warmup;
    const auto gp = pre ? QL.t().mm(ga).mm(QR) : ga;
    m = h.beta1 * m + (1 - h.beta1) * gp;
    v = h.beta2 * v + (1 - h.beta2) * gp * gp;
    const double c1 = h.correct_bias ? 1 - std::pow(h.beta1, t) : 1.0;
    const double c2 = h.correct_bias ? 1 - std::pow(h.beta2, t) : 1.0;
    const double cn = h.correct_bias ? 1 - std::pow(h.beta1, t + 1) : 1.0;
    const auto mhat = h.nesterov ? h.beta1 * m / cn + (1 - h.beta1) * gp / c1 : m / c1;
    auto u = mhat / ((v / c2).sqrt() + h.eps);
    if (pre) u = QL.mm(u).mm(QR.t());
    if (h.max_rms > 0) {
      const double rms = u.square().mean().sqrt().item<double>();
      u = u * std::min(1.0, h.max_rms / (rms + 1e-7));
    }
    p = p - h.lr * u;
    s += 1;
  }
};

const SoapParamState& state_of(const torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const SoapParamState&>(*opt.state().at(compat::state_key(p)));
}

TEST(Soap, FiveFp32StepsEqualEmergingOptimizersArithmetic) {
  // Wide, tall and conv (4-D, seen as 6×8) fp32 matrices. The first
  // eigenbasis comes at step 3 (adam_warmup_steps 2), when each factor has
  // summed three gradients and has full rank: a rank-deficient factor has a
  // repeated eigenvalue (0), whose eigenvectors are any rotation of each
  // other, and Adam's element-wise step is not invariant under rotations
  // (it is under the sign flips that eigh and QR may choose, which is why
  // the parameters, L, R and exp_avg_sq compare directly and exp_avg after
  // projecting it back). With frequency 2 the fifth step refreshes by
  // orthogonal iteration (or by eigh every step in the second set).
  const std::vector<std::vector<int64_t>> shapes{{5, 8}, {8, 5}, {6, 2, 2, 2}};
  const std::vector<Hyper> sets{
      {0.01, 0.9, 0.95, 0.95, 1e-8, 0.1, SoapWeightDecay::kDecoupled, false, 2, 2, true, true, false, 0.0},
      {0.02, 0.8, 0.9, 0.9, 1e-8, 0.05, SoapWeightDecay::kL2, true, 1, 2, true, false, true, 0.5},
  };
  for (size_t hs = 0; hs < sets.size(); ++hs) {
    const auto& h = sets[hs];
    ReferenceRun<Reference> reference_run(shapes, 3);
    auto& params = reference_run.params;
    auto& refs = reference_run.refs;
    Soap opt(params, h.options());
    reference_run.run(opt, h, 5);
    // Why fp32 matches fp64 to 1e-5: every quantity is O(10–100) fp32
    // operations per element (2^-24 each) on values of order 1, except the
    // eigenvectors, whose fp32 error is about 2^-24·‖K‖/gap for each
    // eigenvalue gap (first-order perturbation): these inputs keep every gap
    // above 1% of ‖K‖ (asserted; the smallest is 1.4%), so the bases carry
    // < 2^-24/0.01 ≈ 6e-6 relative error, and the Adam step divides by √v̂
    // of order |g|, not amplifying it.
    for (size_t k = 0; k < params.size(); ++k) {
      const auto& st = state_of(opt, params[k]);
      const auto& r = refs[k];
      EXPECT_GE(r.min_gap, 0.01) << "inputs with near-repeated eigenvalues, param " << k;
      EXPECT_EQ(st.step(), 5);
      EXPECT_LE(relative(params[k], r.p), 1e-5) << "set " << hs << " param " << k;
      EXPECT_LE(relative(st.L(), r.L), 1e-5) << "L " << k;
      EXPECT_LE(relative(st.R(), r.R), 1e-5) << "R " << k;
      EXPECT_LE(relative(st.exp_avg_sq(), r.v), 1e-5) << "exp_avg_sq " << k;
      const auto back = st.Q_L().to(at::kDouble).mm(st.exp_avg().to(at::kDouble)).mm(st.Q_R().to(at::kDouble).t());
      EXPECT_LE(relative(back, r.QL.mm(r.m).mm(r.QR.t())), 1e-5) << "exp_avg " << k;
      // The bases are orthogonal and diagonalize the factors' leading part.
      const auto eye = at::eye(st.Q_L().size(0));
      EXPECT_LE((st.Q_L().t().mm(st.Q_L()) - eye).abs().max().item<double>(), 1e-5);
    }
    const int64_t bytes = 4 * (2 * (40 + 40 + 48) + 2 * (25 + 64) + 2 * (64 + 25) + 2 * (36 + 64));
    EXPECT_EQ(opt.state_bytes(), bytes);
  }
}

TEST(Soap, OneDimensionalParametersGetAdamUnlessPreconditioned) {
  // Emerging-Optimizers' precondition_1d false: a 1-D parameter has no
  // factor and steps as Adam (here checked against AdamW's formula).
  auto p = leaf(at::randn({6}));
  const auto p0 = p.detach().clone().to(at::kDouble);
  Soap opt({p}, SoapOptions(0.1).weight_decay(0));
  const auto g = at::randn({6});
  p.mutable_grad() = g.clone();
  opt.step();
  const auto gd = g.to(at::kDouble);
  // One Adam step with bias correction: m̂ = g, v̂ = g², u = g/(|g| + eps).
  const auto want = p0 - 0.1 * gd / (gd.abs() + 1e-8);
  EXPECT_LE(relative(p, want), 1e-6);
  const auto& st = state_of(opt, p);
  EXPECT_FALSE(st.L().defined());
  EXPECT_FALSE(st.Q_L().defined());
  // precondition_1d: one factor L (6×6), its basis, no R.
  auto q = leaf(at::randn({6}));
  Soap pre({q}, SoapOptions(0.1).precondition_1d(true));
  q.mutable_grad() = at::randn({6});
  pre.step();
  const auto& sq = state_of(pre, q);
  EXPECT_EQ(sq.L().sizes(), at::IntArrayRef({6, 6}));
  EXPECT_EQ(sq.Q_L().sizes(), at::IntArrayRef({6, 6}));
  EXPECT_FALSE(sq.R().defined());
}

TEST(Soap, DefaultsAreEmergingOptimizers) {
  // SOAP.__init__, in SoapOptions::kFields' order; correct_shampoo_beta_bias
  // -1 is "as correct_bias", so the Kronecker factors are bias-corrected.
  elementwise::expect_fields(SoapOptions(), 3e-3, 0.9, 0.95, 0.95, 1e-8, 0.01, SoapWeightDecay::kDecoupled, false, 1,
                             0, false, true, -1, false, false, 1e-7, 1, 0.0);
  EXPECT_TRUE(SoapOptions().shampoo_bias_corrected());
}

TEST(Soap, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({3, 2}));
  expect_value_error([&] { Soap opt({p}, SoapOptions(-1)); }, {"[muon::Soap]", "lr", "-1"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().beta1(1.0)); }, {"beta1", "[0, 1)", "1"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().beta2(-0.1)); }, {"beta2", "-0.1"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().shampoo_beta(1.5)); }, {"shampoo_beta", "1.5"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().eps(-1e-3)); }, {"eps", "-0.001"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().weight_decay(-2)); }, {"weight_decay", "-2"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().precondition_frequency(0)); },
                     {"precondition_frequency", "0"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().adam_warmup_steps(-1)); }, {"adam_warmup_steps", "-1"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().power_iter_steps(0)); }, {"power_iter_steps", "0"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().max_update_rms(-1)); }, {"max_update_rms", "-1"});
  expect_value_error([&] { Soap opt({p}, SoapOptions().adaptive_update_tolerance(1)); },
                     {"adaptive_update_tolerance", "1"});
  expect_value_error([&] { SoapOptions().weight_decay_method("palm"); }, {"weight_decay_method", "palm"});
  // A bad edit between steps is caught by the next step, which changes nothing.
  expect_negative_lr_edit_caught<Soap>(p);
  OptimizerConfig c;
  expect_value_error([&] { c.set("soap_shampoo_beta", 1.0); }, {"soap_shampoo_beta", "1"});
  expect_value_error([&] { c.set("soap_precondition_frequency", 0); }, {"soap_precondition_frequency", "0"});
  expect_value_error([&] { c.set("soap_weight_decay_method", "palm"); }, {"soap_weight_decay_method", "palm"});
}

TEST(Soap, ResumedRunIsBitIdentical) {
  // 7 steps straight against 3, saved, loaded into other options, and 4 more.
  expect_resumed_run_bit_identical<Soap>(
      gradient_run(1, {6, 4}, 7), 3,
      SoapOptions(0.01).weight_decay(0.1).precondition_frequency(2).adam_warmup_steps(1),
      SoapOptions(0.5).use_eigh(true), state_of);
}

TEST(Soap, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  expect_refuses_archive_of<Soap, LaProp>(SoapOptions(0.2), "[muon::Soap]", "muon::LaProp");
}

TEST(Soap, BuiltFromAConfigWithItsFieldsAndExplained) {
  // The matrix to SOAP, the bias to the scalar optimizer (as muon's defaults).
  ckpt::BuiltFromConfig<Soap, SoapOptions> built(
      "soap", R"({"optimizer": "soap", "lr": 0.01, "soap_shampoo_beta": 0.9,
                  "soap_precondition_frequency": 5, "soap_use_eigh": true,
                  "soap_weight_decay_method": "l2",
                  "soap_correct_shampoo_beta_bias": "false"})");
  ASSERT_NE(built.part, nullptr);
  // Every field: the config's where it set them ("false" is 0 for
  // correct_shampoo_beta_bias), the common weight_decay's 0, the rest SOAP's defaults.
  const auto& o = built.options();
  elementwise::expect_fields(o, 0.01, 0.9, 0.95, 0.9, 1e-8, 0.0, SoapWeightDecay::kL2, false, 5, 0, false, true, 0,
                             true, false, 1e-7, 1, 0.0);
  EXPECT_FALSE(o.shampoo_bias_corrected());
  const auto text = built.step_and_explain();
  // w: exp_avg, exp_avg_sq 8×4, L, Q_L 8×8, R, Q_R 4×4, fp32.
  EXPECT_EQ(built.part->state_bytes(), 4 * (2 * 32 + 2 * 64 + 2 * 16));
  EXPECT_NE(text.find("state of soap: step [counter], exp_avg [whole matrix, zeros, owner]"), std::string::npos)
      << text;
}

// Parameter values of `named`, cloned.
ckpt::Named values_of_named(const ckpt::Named& named) {
  ckpt::Named out;
  for (const auto& item : named) out.insert(item.key(), item.value().detach().clone());
  return out;
}

TEST(Soap, CheckpointsResumeAndReshardBitIdentically) {
  // One process → layer-wise at 2 ranks → one process: the whole-matrix
  // state (moments, factors, bases) travels whole with its parameter.
  ckpt::reshard_chain("soap", "soap_reshard",
                      {{"none", 1, 2, "single"},
                       {"layerwise", 2, 3, "layerwise W=2 from single"},
                       {"none", 1, 4, "single from layerwise W=2"}},
                      ckpt::one_process_after("soap", {3, 4}));
}

// SOAP in the layer-wise layout (each rank steps whole parameters it owns)
// equals one process bit for bit: the owner runs the same arithmetic on the
// same whole tensors.
TEST(Soap, LayerwiseEqualsOneProcess) {
  ckpt::expect_layouts_equal("soap", 4, ckpt::one_process_after("soap", {4}).at(4), {{"layerwise", 2}, {"layerwise", 3}},
                             "soap");
}

// ---- the sharded layout: owner-compute SOAP ---------------------------------

// Why bit for bit (not fp32 rounding): each matrix's owner receives every
// rank's rows of the gradient unchanged (an all-to-all moves bits), so it
// runs muon::detail::soap_matrix_update, the function one process runs, on
// the same whole tensor; the other ranks' state is only the step count; and
// what each rank does with its rows of the update (weight decay, p − lr·u)
// is element-wise, the same operations on the same elements as one process.

// Wide, tall, conv (4-D, seen as 6×8), and a wide matrix of 2 rows (an
// empty shard at 3 ranks). Rows that 2 and 3 ranks split unevenly.
const layouts::SeededMatrices kSharded{{{7, 12}, {12, 5}, {6, 2, 2, 2}, {2, 9}}, 70, 300};

TEST(ShardedSoap, OwnerComputeEqualsOneProcessBitForBit) {
  // Refreshes inside the 5 steps: eigh at step 2 (after 1 warm-up step),
  // orthogonal iteration at steps 3 and 5 (frequency 2); eigh every step;
  // every step by orthogonal iteration after the first (the defaults).
  const std::vector<SoapOptions> sets{
      SoapOptions(0.01).weight_decay(0.1).precondition_frequency(2).adam_warmup_steps(1),
      SoapOptions(0.02).weight_decay(0.05).weight_decay_method("l2").use_nesterov(true).use_eigh(true).max_update_rms(
          0.5),
      SoapOptions(0.01).weight_decay(0.1).weight_decay_method("independent"),
  };
  for (size_t hs = 0; hs < sets.size(); ++hs) {
    std::vector<std::atomic<int>> owners(kSharded.shapes.size());
    layouts::row_parts_against_one_process<Soap, distributed::ShardedSoap>(
        kSharded, 5, sets[hs], {2, 3}, "set " + std::to_string(hs),
        [&](distributed::ShardedSoap& opt, layouts::RowParts& parts, Soap& single, std::vector<at::Tensor>& whole,
            const std::string& what) {
          auto& params = parts.params;
          const int rank = parts.rank;
          for (size_t k = 0; k < params.size(); ++k) {
            EXPECT_TRUE(at::equal(params[k].detach(), parts.local(k, whole[k].detach()))) << what << " param " << k;
            const auto& st = state_of(opt, params[k]);
            EXPECT_EQ(st.step(), 5) << what;
            EXPECT_EQ(opt.holds_whole_state(params[k]), opt.owners()[k] == rank) << what;
            EXPECT_EQ(opt.whole_matrix_dims(params[k]), detail::soap_matrix_dims(kSharded.shapes[k])) << what;
            if (opt.holds_whole_state(params[k])) {
              ++owners[k];
              // The owner's whole-matrix state is one process's, bit for bit.
              EXPECT_TRUE(st == state_of(single, whole[k])) << what << " state of param " << k;
            } else {
              EXPECT_FALSE(st.exp_avg().defined() || st.L().defined() || st.Q_L().defined()) << what;
            }
          }
        },
        [&](int) {
          // Each matrix has one owner at each world size.
          for (size_t k = 0; k < owners.size(); ++k) {
            EXPECT_EQ(owners[k].load(), 1) << "owners of param " << k;
            owners[k] = 0;
          }
        });
  }
}

TEST(ShardedSoap, BuiltByMakeOptimizerEqualsOneProcess) {
  // The checkpoint model with optimizer soap: the block's matrices (wide,
  // tall) to SOAP, the rest to AdamW; the default precondition_frequency 1
  // refreshes at every step (eigh at the first, orthogonal iteration after).
  ckpt::expect_layouts_equal("soap", 5, ckpt::one_process_after("soap", {5}).at(5),
                             {{"sharded", 2}, {"sharded", 3}, {"padded", 3}}, "soap",
                             [](ckpt::Rank& r, const std::string& kind) {
                               auto* composite = dynamic_cast<CompositeOptimizer*>(r.opt.get());
                               ASSERT_NE(composite, nullptr);
                               auto* soap = dynamic_cast<distributed::ShardedSoap*>(composite->find_part("soap"));
                               ASSERT_NE(soap, nullptr) << kind;
                               EXPECT_EQ(soap->param_groups()[0].params().size(), 3u);
                             });
}

TEST(ShardedSoap, LayoutStepsItEqualToOneProcess) {
  // muon::distributed::Layout with layout sharded: the gradients are reduce-scattered
  // into each rank's rows (the average over ranks), then ShardedSoap steps
  // them and the rows are all-gathered. Every rank gives the same gradient,
  // multiples of 1/64 below 2^8, whose sum over 3 ranks and division by the
  // rank count are exact: the average is the gradient, bit for bit.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> model{
      {"w", {12, 8}}, {"t", {6, 10}}, {"conv", {7, 2, 3, 3}}, {"b", {6}}};
  const auto config = [](const std::string& layout) {
    OptimizerConfig c;
    c.set("optimizer", "soap").set("lr", 0.02).set("weight_decay", 0.1).set("layout", layout);
    c.set("soap_precondition_frequency", 2);
    return c;
  };
  const auto grad_of = [&](size_t k, int64_t s) {
    return (seeded_randn(model[k].second, 40 + 9 * static_cast<uint64_t>(s) + k) * 64).round_() / 64;
  };
  const auto run = [&](int world, const std::string& layout, ckpt::Named& out) {
    run_ranks(world, [&](distributed::Group& g) {
      ckpt::Named named;
      for (size_t k = 0; k < model.size(); ++k) named.insert(model[k].first, leaf(seeded_randn(model[k].second, 5 + k)));
      distributed::Layout l(named, config(layout), distributed::LayoutGroups().world(g));
      for (int64_t s = 0; s < 5; ++s) {
        l.zero_grad();
        for (size_t k = 0; k < model.size(); ++k) named[model[k].first].mutable_grad() = grad_of(k, s);
        l.step();
      }
      if (g.rank() == 0) {
        EXPECT_EQ(l.describe(), world == 1 ? "single process" : "sharded " + std::to_string(world));
        out = values_of_named(named);
      }
    });
  };
  ckpt::Named single;
  run(1, "none", single);
  for (const int world : {2, 3}) {
    ckpt::Named got;
    run(world, "sharded", got);
    for (const auto& [name, shape] : model) {
      EXPECT_TRUE(at::equal(got[name], single[name])) << name << " W=" << world;
    }
  }
}

TEST(ShardedSoap, CheckpointsReshardBitIdentically) {
  // Sharded at 2 ranks → one process → sharded at 3 ranks → layer-wise: the
  // owner writes each matrix's whole state once; a load gives it to the new
  // owner (or the one process), and training on equals never stopping, bit for bit.
  ckpt::owner_compute_reshard_chain("soap");
}

// Layouts that split matrices across ranks refuse SOAP, naming it and the
// layout: tensor_parallel, and the 2-D layout (sharded with tensor-parallel
// blocks); so do the replicated sharded mode and 1-D row shards.
TEST(ShardedSoap, SplittingLayoutsAreRefusedNamingSoap) {
  ckpt::expect_splitting_layouts_refused<distributed::ShardedSoap>("soap", "[muon::distributed::ShardedSoap]",
                                                                   SoapOptions(), "soap");
  run_ranks(2, [&](distributed::Group& g) {
    auto v = leaf(at::randn({3}));
    expect_value_error([&] { distributed::ShardedSoap opt({v}, {distributed::RowShard({6}, g)}); },
                       {"[muon::distributed::ShardedSoap]", "global shape [6]", "matrices"});
  });
}

}  // namespace
}  // namespace muon::test
