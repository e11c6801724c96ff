// Tests of muon::Dion2 (Dion2 and NorDion2): values against an independent
// fp64 reference of microsoft/dion's arithmetic, options and their errors,
// save/load, the registry entries (config fields, make_optimizer, explain),
// checkpoints resharded across layouts, the distributed layouts (layer-wise
// and sharded owner-compute (muon::distributed::ShardedDion2) equal to one process
// bit for bit, tensor_parallel, 2-D and the replicated mode refused), and the
// bytes each step sends beside Muon's.
#include <gtest/gtest.h>
#include <unistd.h>

#include "archive_util.h"
#include "expect_util.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_model.h"
#include "layout_harness.h"
#include "muon/compat.h"
#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/sharded_dion2.h"
#include "muon/optim/composite.h"
#include "muon/optim/dion2.h"
#include "muon/optim/laprop.h"
#include "muon/registry.h"
#include "beside_reference.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace ckpt = muon::test::checkpoint;

// ---- an fp64 reference of Dion's arithmetic -----------------------------------

// modded-nanogpt's Polar Express coefficients (5 steps), which Dion's
// polar_express uses, with its normalization X / (‖X‖_F·1.02 + epsilon).
const double kPolarExpress[5][3] = {{8.156554524902461, -22.48329292557795, 15.878769915207462},
                                    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
                                    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
                                    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
                                    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}};

// Newton–Schulz of one fp64 matrix, on its short side.
at::Tensor ref_ns(const at::Tensor& g, double eps) {
  auto x = g.size(0) > g.size(1) ? g.t().clone() : g.clone();
  x = x / (x.norm().item<double>() * 1.02 + eps);
  for (const auto& c : kPolarExpress) {
    const auto a = at::mm(x, x.t());
    const auto b = a * c[1] + at::mm(a, a) * c[2];
    x = x * c[0] + at::mm(b, x);
  }
  return g.size(0) > g.size(1) ? x.t().contiguous() : x;
}

struct RefOptions {
  double lr = 0.01, fraction = 0.25, ef_decay = 0.95, wd = 0.01, eps = 1e-8, beta2 = 0.95;
  std::string adjust = "spectral_norm";
  bool flatten = false, nordion2 = false;

  Dion2Options options() const {
    return Dion2Options(lr)
        .fraction(fraction)
        .ef_decay(ef_decay)
        .weight_decay(wd)
        .epsilon(eps)
        .adjust_lr(adjust)
        .flatten(flatten)
        .nordion2(nordion2)
        .muon_beta2(beta2);
  }
};

// One parameter's plain fp64 run of Dion2 / NorDion2 as dion/dion2.py
// (dion2_pre_orthogonalize, dion2_post_orthogonalize), dion/nordion2.py and
// dion/normuon.py (_normuon_normalization_core) and megabatch_base.py
// (adjust_lr_*, the flatten rule) write it, one matrix at a time. It also
// records the smallest relative gap between the k-th and (k+1)-th norm of
// any selection, which must be large for the fp32 run to select the same
// slices.
struct RefDion2 {
  RefOptions o;
  std::vector<int64_t> shape;
  at::Tensor x, m, v;  // fp64
  double min_gap = 1e300;

  RefDion2(RefOptions opts, const at::Tensor& init)
      : o(std::move(opts)), shape(init.sizes().vec()) {
    x = init.to(at::kDouble).clone();
    m = at::zeros_like(x);
    v = at::zeros(dims()[0] * dims()[1], at::kDouble);
  }
  std::array<int64_t, 3> dims() const {
    if (o.flatten) {
      return {1, shape[0],
              std::accumulate(shape.begin() + 1, shape.end(), int64_t{1}, std::multiplies<>())};
    }
    const auto batch =
        std::accumulate(shape.begin(), shape.end() - 2, int64_t{1}, std::multiplies<>());
    return {batch, shape[shape.size() - 2], shape.back()};
  }
  void step(const at::Tensor& grad) {
    const auto [batch, rows, cols] = dims();
    m += grad.to(at::kDouble);
    const auto mv = m.view({batch, rows, cols});
    const auto xv = x.view({batch, rows, cols});
    x *= 1 - o.lr * o.wd;
    double fan_out = static_cast<double>(rows), fan_in = static_cast<double>(cols);
    const double alr = o.adjust == "spectral_norm" ? o.lr * std::sqrt(fan_out / fan_in)
                       : o.adjust == "rms_norm" ? o.lr * 0.2 * std::sqrt(std::max(fan_out, fan_in))
                                                : o.lr;
    const bool by_rows = o.nordion2 || rows <= cols;
    for (int64_t b = 0; b < batch; ++b) {
      auto mb = by_rows ? mv[b] : mv[b].t();  // selection along dim 0 of mb
      auto xb = by_rows ? xv[b] : xv[b].t();
      const int64_t n = mb.size(0);
      const auto k = std::max<int64_t>(
          1, static_cast<int64_t>(std::ceil(o.fraction * static_cast<double>(n))));
      std::vector<double> norms(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        norms[static_cast<size_t>(i)] = mb[i].abs().sum().item<double>();
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) {
        return norms[static_cast<size_t>(a)] > norms[static_cast<size_t>(c)];
      });
      if (k < n) {
        const double hi = norms[static_cast<size_t>(order[static_cast<size_t>(k - 1)])];
        const double lo = norms[static_cast<size_t>(order[static_cast<size_t>(k)])];
        min_gap = std::min(min_gap, (hi - lo) / hi);
      }
      std::vector<int64_t> sel(order.begin(), order.begin() + k);
      std::sort(sel.begin(), sel.end());
      const auto idx = at::tensor(sel, at::kLong);
      const auto s = mb.index_select(0, idx).clone();  // k × (cols or rows)
      for (int64_t j = 0; j < k; ++j) mb[sel[static_cast<size_t>(j)]].mul_(o.ef_decay);
      // O of the selected submatrix in the parameter's orientation.
      auto orth = by_rows ? ref_ns(s, o.eps) : ref_ns(s.t().contiguous(), o.eps).t().contiguous();
      if (o.nordion2) {
        const auto norm_u = orth.norm().item<double>();
        for (int64_t j = 0; j < k; ++j) {
          const auto row = b * rows + sel[static_cast<size_t>(j)];
          const double mean_sq = (orth[j] * orth[j]).mean().item<double>();
          const double vi =
              v[row].item<double>() + (mean_sq - v[row].item<double>()) * (1 - o.beta2);
          v[row] = vi;
          orth[j] /= std::sqrt(vi) + 1e-8;
        }
        orth = orth * (norm_u / std::max(orth.norm().item<double>(), 1e-8));
      }
      for (int64_t j = 0; j < k; ++j) xb[sel[static_cast<size_t>(j)]] -= alr * orth[j];
    }
  }
};

const Dion2ParamState& state_of(const torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const Dion2ParamState&>(*opt.state().at(compat::state_key(p)));
}

// Runs 5 fp32 steps of `o` on a parameter of `shape` beside the fp64
// reference and compares parameters and momentum (and NorDion2's variance).
// Tolerance 1e-5 relative: the fp32 run differs from the fp64 one by the
// rounding of the accumulation M + G (1 ulp, 6e-8 relative per step), of the
// fp32 Newton–Schulz (5 steps of products over at most 27 terms, whose
// accumulated error stays below 1e-6 relative of O's entries of size 1 for
// these well-conditioned random submatrices; the first step's coefficient
// 8.16 amplifies the input's 6e-8 to 5e-7) and of the update; the selection
// is the same discrete choice when the norms' gaps are far above those
// errors, which the reference checks (min_gap > 1e-4).
void expect_matches_reference(const std::vector<int64_t>& shape, const RefOptions& ro,
                              uint64_t seed) {
  BesideReference<Dion2, RefDion2> beside(gradient_run(seed, shape, 5), ro.options(), ro, 5);
  auto& [data, ref, p, opt] = beside;
  const auto what = "shape " + c10::str(c10::IntArrayRef(shape)) +
                    (ro.nordion2 ? " nordion2" : " dion2") + (ro.flatten ? " flatten" : "") +
                    " adjust " + ro.adjust;
  ASSERT_GT(ref.min_gap, 1e-4) << what << ": a near tie in the reference's selection";
  EXPECT_LT(relative(p.detach(), ref.x), 1e-5) << what;
  const auto& st = state_of(opt, p);
  EXPECT_EQ(st.step(), 5) << what;
  EXPECT_LT(relative(st.momentum(), ref.m), 1e-5) << what;
  EXPECT_EQ(st.momentum().sizes(), p.sizes()) << what;
  if (ro.nordion2) {
    EXPECT_EQ(st.variance().sizes(),
              c10::IntArrayRef(detail::dion2_variance_shape(shape, ro.flatten)))
        << what;
    // √V, the per-row RMS of O the update divides by: V squares O's
    // entries and so doubles their relative rounding error.
    EXPECT_LT(relative(st.variance().sqrt(), ref.v.sqrt()), 1e-5) << what;
  } else {
    EXPECT_FALSE(st.variance().defined()) << what;
  }
}

TEST(Dion2, FiveFp32StepsEqualDionArithmetic) {
  RefOptions o;
  o.lr = 0.02;
  o.wd = 0.1;
  expect_matches_reference({6, 10}, o, 1);       // wide: rows selected, k = 2
  expect_matches_reference({12, 5}, o, 2);       // tall: columns selected, k = 2
  expect_matches_reference({3, 5, 8}, o, 3);     // stacked experts: one selection per expert
  expect_matches_reference({4, 3, 3, 3}, o, 4);  // conv as 12 matrices of 3×3
  o.flatten = true;
  expect_matches_reference({4, 3, 3, 3}, o, 5);  // conv as one 4×27 matrix
  o.flatten = false;
  o.adjust = "rms_norm";
  o.fraction = 0.5;
  o.ef_decay = 0.8;
  expect_matches_reference({9, 7}, o, 6);
  o.adjust = "none";
  o.fraction = 1.0;
  expect_matches_reference({5, 8}, o, 7);  // every row: full Muon-like step
}

TEST(Dion2, NorDion2FiveFp32StepsEqualDionArithmetic) {
  RefOptions o;
  o.nordion2 = true;
  o.lr = 0.02;
  o.wd = 0.1;
  expect_matches_reference({6, 10}, o, 11);
  expect_matches_reference({12, 5}, o,
                           12);  // tall: rows all the same (NorDion2 always selects rows)
  expect_matches_reference({3, 5, 8}, o, 13);
  o.beta2 = 0.5;
  o.fraction = 0.5;
  expect_matches_reference({4, 3, 3, 3}, o, 14);
  o.flatten = true;
  expect_matches_reference({4, 3, 3, 3}, o, 15);
}

TEST(Dion2, TiesGoToTheLowerIndexAndTheSelectionIsDeterministic) {
  // Every row of M has the same L1 norm: the first k rows are selected.
  auto p = leaf(at::zeros({8, 8}));
  Dion2 opt({p}, Dion2Options(0.1).weight_decay(0).fraction(0.25).adjust_lr("none"));
  p.mutable_grad() = at::ones({8, 8});
  opt.step();
  const auto changed = (p.detach() != 0).any(1);
  EXPECT_TRUE(at::equal(changed, at::tensor({1, 1, 0, 0, 0, 0, 0, 0}).to(at::kBool)));
  // The selected rows' momentum decayed by ef_decay, the others kept.
  const auto& m = state_of(opt, p).momentum();
  EXPECT_TRUE(at::equal(m.narrow(0, 0, 2), at::full({2, 8}, 0.95f)));
  EXPECT_TRUE(at::equal(m.narrow(0, 2, 6), at::ones({6, 8})));
}

TEST(Dion2, DefaultsAreDions) {
  const Dion2Options o;
  EXPECT_EQ(o.lr(), 0.01);
  EXPECT_EQ(o.fraction(), 0.25);
  EXPECT_EQ(o.ef_decay(), 0.95);
  EXPECT_EQ(o.weight_decay(), 0.01);
  EXPECT_EQ(o.epsilon(), 1e-8);
  EXPECT_EQ(o.adjust_lr(), Dion2AdjustLr::kSpectralNorm);
  EXPECT_FALSE(o.flatten());
  EXPECT_FALSE(o.nordion2());
  EXPECT_EQ(o.ns_coefficients(), "polar_express_5");
  EXPECT_EQ(o.ns().steps(), 5);
  EXPECT_EQ(o.ns().eps(), 1e-8);
  EXPECT_EQ(o.ns_compute_dtype(), at::kFloat);
  const auto n = NorDion2Options();
  EXPECT_TRUE(n.nordion2());
  EXPECT_EQ(n.lr(), 0.01);
  EXPECT_EQ(n.fraction(), 0.25);
  EXPECT_EQ(n.ef_decay(), 0.95);  // mu
  EXPECT_EQ(n.muon_beta2(), 0.95);
  EXPECT_EQ(n.weight_decay(), 0.01);
  EXPECT_EQ(n.epsilon(), 1e-8);
  EXPECT_EQ(n.adjust_lr(), Dion2AdjustLr::kSpectralNorm);
}

TEST(Dion2, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({3, 4}));
  expect_value_error([&] { Dion2 opt({p}, Dion2Options(-1)); }, {"[muon::Dion2]", "lr", "-1"});
  expect_value_error([&] { Dion2 opt({p}, Dion2Options().fraction(0)); },
                     {"fraction", "(0, 1]", "0"});
  expect_value_error([&] { Dion2 opt({p}, Dion2Options().fraction(1.5)); }, {"fraction", "1.5"});
  expect_value_error([&] { Dion2 opt({p}, Dion2Options().ef_decay(-0.5)); }, {"ef_decay", "-0.5"});
  expect_value_error([&] { Dion2 opt({p}, NorDion2Options().ef_decay(-0.5)); },
                     {"[muon::NorDion2]", "mu", "-0.5"});
  expect_value_error([&] { Dion2 opt({p}, NorDion2Options().muon_beta2(-1)); },
                     {"muon_beta2", "-1"});
  expect_value_error([&] { Dion2 opt({p}, Dion2Options().weight_decay(-2)); },
                     {"weight_decay", "-2"});
  expect_value_error([&] { Dion2 opt({p}, Dion2Options().epsilon(0)); }, {"epsilon", "0"});
  expect_value_error([&] { Dion2 opt({p}, Dion2Options().ns_coefficients("nope")); },
                     {"ns_coefficients", "nope"});
  expect_value_error([&] { Dion2 opt({p}, Dion2Options().ns_steps(100)); }, {"ns_steps", "100"});
  expect_value_error([&] { Dion2Options().adjust_lr("spectral"); }, {"adjust_lr", "spectral"});
  auto v = leaf(at::randn({3}));
  expect_value_error([&] { Dion2 opt({v}); }, {"[muon::Dion2]", "1 dims", "matrices"});
  // Groups of another algorithm than the defaults'.
  std::vector<torch::optim::OptimizerParamGroup> groups{
      torch::optim::OptimizerParamGroup({p}, std::make_unique<Dion2Options>(NorDion2Options()))};
  expect_value_error([&] { Dion2 opt(groups, Dion2Options()); },
                     {"nordion2 true", "one algorithm"});
  // A bad edit between steps is caught by the next step, which changes nothing.
  expect_negative_lr_edit_caught<Dion2>(p);
  OptimizerConfig c;
  expect_value_error([&] { c.set("dion2_fraction", 0.0); }, {"dion2_fraction", "0"});
  expect_value_error([&] { c.set("dion2_adjust_lr", "spectral"); },
                     {"dion2_adjust_lr", "spectral"});
  expect_value_error([&] { c.set("nordion2_mu", -1.0); }, {"nordion2_mu", "-1"});
}

TEST(Dion2, ResumedRunIsBitIdentical) {
  for (const auto& options :
       {Dion2Options(0.02).weight_decay(0.1), NorDion2Options(0.02).fraction(0.5)}) {
    // 7 steps straight against 3, saved, loaded into other options of the
    // same algorithm, and 4 more.
    expect_resumed_run_bit_identical<Dion2>(
        gradient_run(1, {6, 4}, 7), 3, options,
        Dion2Options(0.5).nordion2(options.nordion2()).fraction(1.0), state_of,
        options.algorithm());
  }
}

TEST(Dion2, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  auto p = leaf(at::randn({3, 2}));
  const auto laprop = archive_after_a_step<LaProp>(p);  // p keeps its gradient of ones
  Dion2 opt({p}, Dion2Options(0.2));
  expect_value_error([&] { load_from_string(opt, laprop); }, {"[muon::Dion2]", "muon::LaProp"});
  Dion2 nor({p}, NorDion2Options(0.3));
  nor.step();
  expect_value_error([&] { load_from_string(opt, save_to_string(nor)); },
                     {"[muon::Dion2]", "muon::NorDion2"});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_TRUE(opt.state().empty());
}

TEST(Dion2, BuiltFromAConfigWithItsFieldsAndExplained) {
  for (const bool nor : {false, true}) {
    auto named = ckpt::matrix_and_bias();
    OptimizerConfig config;
    if (nor) {
      apply_config_json(config, R"({"optimizer": "nordion2", "lr": 0.01, "nordion2_fraction": 0.5,
                                    "nordion2_mu": 0.9, "nordion2_muon_beta2": 0.8,
                                    "nordion2_adjust_lr": "rms_norm", "nordion2_num_ns_steps": 6})");
    } else {
      apply_config_json(config, R"({"optimizer": "dion2", "lr": 0.01, "dion2_fraction": 0.5,
                                    "dion2_ef_decay": 0.9, "dion2_flatten": true, "weight_decay": 0.05,
                                    "dion2_adjust_lr": "none", "dion2_epsilon": 1e-7})");
    }
    auto opt = muon::make_optimizer(named, config);
    auto* d = ckpt::part_holding_w<Dion2>(*opt, nor ? "nordion2" : "dion2", named);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->is_nordion2(), nor);
    const auto& o = static_cast<const Dion2Options&>(d->param_groups()[0].options());
    EXPECT_EQ(o.lr(), 0.01);
    EXPECT_EQ(o.fraction(), 0.5);
    EXPECT_EQ(o.ef_decay(), 0.9);
    if (nor) {
      EXPECT_EQ(o.muon_beta2(), 0.8);
      EXPECT_EQ(o.adjust_lr(), Dion2AdjustLr::kRmsNorm);
      EXPECT_EQ(o.ns_steps(), 6);
    } else {
      EXPECT_TRUE(o.flatten());
      EXPECT_EQ(o.weight_decay(), 0.05);
      EXPECT_EQ(o.adjust_lr(), Dion2AdjustLr::kNone);
      EXPECT_EQ(o.epsilon(), 1e-7);
    }
    for (auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
    opt->step();
    // w: momentum 8×4 (and NorDion2's variance 8×1), fp32.
    EXPECT_EQ(d->state_bytes(), 4 * (32 + (nor ? 8 : 0)));
    const auto text = muon::explain(named, config);
    const std::string name = nor ? "nordion2" : "dion2";
    EXPECT_NE(text.find("state of " + name + ": step [counter], momentum ["), std::string::npos)
        << text;
  }
}

// ---- layouts -------------------------------------------------------------------

// The checkpoint model's matrices: qkv 48×16 and fc1 64×16 are tall (columns
// selected), fc2 16×64 is wide (rows selected).
TEST(Dion2, LayerwiseAndShardedEqualOneProcessThroughMakeOptimizer) {
  for (const std::string optimizer : {"dion2", "nordion2"}) {
    ckpt::expect_owner_compute_layouts<distributed::ShardedDion2>(optimizer, 4);
  }
}

// Why bit for bit: the selection's norms are exact integer sums, the same
// from any split of the rows, so every rank selects what one process
// selects; the owner assembles the selected submatrix bit for bit as one
// process gathers it and runs muon::detail::dion2_orthogonalize, the function
// one process runs; the rest (M + G, the error feedback, weight decay,
// X − adjusted_lr·U) is element-wise on each rank's rows. Stacked matrices
// are whole on their rank, stepped by muon::detail::dion2_update.
// Wide, tall, conv, stacked experts and a 2-row matrix (empty shards at 3
// and 4 ranks); rows split unevenly.
const layouts::SeededMatrices kSharded{{
    {7, 12}, {13, 5}, {6, 2, 2, 3}, {5, 3, 4}, {2, 9}}, 70, 300};

TEST(ShardedDion2, OwnerComputeEqualsOneProcessBitForBit) {
  const std::vector<Dion2Options> sets{
      Dion2Options(0.02).weight_decay(0.1),
      Dion2Options(0.02).fraction(0.5).flatten(true).adjust_lr("rms_norm"),
      NorDion2Options(0.02).weight_decay(0.1).fraction(0.4)};
  for (size_t hs = 0; hs < sets.size(); ++hs) {
    layouts::row_parts_against_one_process<Dion2, distributed::ShardedDion2>(
        kSharded, 5, sets[hs], {1, 2, 3, 4}, "set " + std::to_string(hs),
        [&](distributed::ShardedDion2& opt, layouts::RowParts& parts, Dion2& single, std::vector<at::Tensor>& whole,
            const std::string& what) {
          auto& params = parts.params;
          for (size_t k = 0; k < params.size(); ++k) {
            EXPECT_TRUE(at::equal(params[k].detach(), parts.local(k, whole[k].detach()))) << what << " param " << k;
            const auto& st = state_of(opt, params[k]);
            EXPECT_EQ(st.step(), 5) << what;
            EXPECT_EQ(opt.whole_shape(params[k]), kSharded.shapes[k]) << what;
            // Each rank holds its rows of one process's state, bit for bit.
            const auto& want = state_of(single, whole[k]);
            EXPECT_TRUE(at::equal(st.momentum(), parts.local(k, want.momentum())))
                << what << " momentum of param " << k;
            if (sets[hs].nordion2()) {
              EXPECT_TRUE(at::equal(st.variance(), parts.local(k, want.variance())))
                  << what << " variance of param " << k;
            }
          }
        });
  }
}

TEST(ShardedDion2, CheckpointsReshardBitIdentically) {
  // Sharded at 2 ranks → one process → sharded at 3 ranks (and layer-wise):
  // the owner writes each matrix's whole state once; a load gives it to the
  // new owner, and training on equals never stopping, bit for bit.
  for (const std::string optimizer : {"dion2", "nordion2"}) ckpt::owner_compute_reshard_chain(optimizer);
}

TEST(ShardedDion2, SplittingLayoutsAreRefusedNamingTheOptimizer) {
  ckpt::expect_splitting_layouts_refused<distributed::ShardedDion2>("dion2", "[muon::distributed::ShardedDion2]",
                                                                    Dion2Options(), "dion2");
  ckpt::expect_splitting_layouts_refused<distributed::ShardedDion2>("nordion2", "[muon::distributed::ShardedDion2]",
                                                                    NorDion2Options(), "nordion2");
}

// ---- bytes sent per step ---------------------------------------------------------

// In the sharded layout Dion2 and NorDion2 move the selected slices to each
// matrix's owner and back, plus the norms; Muon's owner-compute moves every
// rank's rows of each matrix there and back: with fraction 0.25 Dion2 sends
// less. In the layer-wise layout every optimizer moves the updated
// parameters: equal bytes. Printed as the table in docs/distributed.md.
TEST(ShardedDion2, BytesSentPerStepBesideMuons) {
  std::printf("| layout | ranks | muon | dion2 | nordion2 |\n|---|---|---|---|---|\n");
  for (const auto& [kind, world] :
       {std::make_pair(std::string("sharded"), 2), std::make_pair(std::string("sharded"), 4),
        std::make_pair(std::string("layerwise"), 2), std::make_pair(std::string("layerwise"), 4)}) {
    const auto muon = ckpt::bytes_of_step("muon", kind, world);
    const auto dion2 = ckpt::bytes_of_step("dion2", kind, world);
    const auto nordion2 = ckpt::bytes_of_step("nordion2", kind, world);
    std::printf("| %s | %d | %lld | %lld (%.2f) | %lld (%.2f) |\n", kind.c_str(), world,
                static_cast<long long>(muon), static_cast<long long>(dion2),
                static_cast<double>(dion2) / static_cast<double>(muon),
                static_cast<long long>(nordion2),
                static_cast<double>(nordion2) / static_cast<double>(muon));
    EXPECT_GT(muon, 0) << kind << " W=" << world;
    if (kind == "sharded") {
      EXPECT_LT(dion2, muon) << kind << " W=" << world;
      EXPECT_LT(nordion2, muon) << kind << " W=" << world;
    } else {
      EXPECT_EQ(dion2, muon) << kind << " W=" << world;
      EXPECT_EQ(nordion2, muon) << kind << " W=" << world;
    }
  }
}

}  // namespace
}  // namespace muon::test
