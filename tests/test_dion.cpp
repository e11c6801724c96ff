// Tests of muon::Dion: values against an independent fp64 reference of
// microsoft/dion's arithmetic, options and their errors, save/load, the
// registry entry (config fields, make_optimizer, explain), and the layouts
// (layer-wise equal to one process bit for bit; sharded and tensor-parallel
// with the low-rank factors exchanged, muon::distributed::ShardedDion and
// TensorParallelDion, to rounding; checkpoints resharded across them; the
// 2-D layout refused), with the bytes each step sends beside Muon's.
#include <gtest/gtest.h>

#include "archive_util.h"
#include "elementwise_cases.h"
#include "expect_util.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "checkpoint_model.h"
#include "layout_harness.h"
#include "muon/compat.h"
#include "muon/distributed/layouts/sharded_dion.h"
#include "muon/distributed/layouts/tensor_parallel_dion.h"
#include "muon/optim/composite.h"
#include "muon/optim/dion.h"
#include "muon/optim/laprop.h"
#include "muon/registry.h"
#include "beside_reference.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace ckpt = muon::test::checkpoint;

// ---- an fp64 reference of Dion's arithmetic -------------------------------------

// One parameter's plain fp64 run of Dion as microsoft/dion writes it
// (dion/dion.py dion_update_ddp with one process, orthogonalize,
// fix_all_zero_or_nan, column_normalize; dion/dion_reference.py
// power_iteration for power_iters > 1; commit 0a059a45), with Householder QR
// for orth (P's orthonormal basis: RCQR's in exact arithmetic, up to column
// signs, which P·Qᵀ and P·Rᵀ do not see). Q starts from the library's
// seeded draw (an input, as the gradients are). It records the largest
// condition number of any B·Q it orthogonalized, which bounds how far fp32
// rounding can move P.
struct RefDion {
  DionOptions o;
  at::Tensor x, m, q;
  int64_t rows, cols;
  double max_cond = 0;

  RefDion(const DionOptions& options, const at::Tensor& init) : o(options), x(init.to(at::kDouble)) {
    rows = init.size(0);
    cols = init.numel() / rows;
    m = at::zeros({rows, cols}, at::kDouble);
    q = detail::dion_initial_q(rows, cols, o, at::TensorOptions().dtype(at::kDouble));
  }
  void step(const at::Tensor& grad) {
    m += grad.to(at::kDouble).reshape({rows, cols});
    const bool transposed = rows < cols;
    const auto b = transposed ? m.t() : m;
    const auto q_old = q;
    at::Tensor p, r = q;
    for (int64_t i = 0; i < o.power_iters(); ++i) {
      const auto bq = b.mm(r);
      const auto sv = at::linalg_svdvals(bq);
      max_cond = std::max(max_cond, (sv.max() / sv.min()).item<double>());
      p = std::get<0>(at::linalg_qr(bq));
      r = b.t().mm(p);
    }
    if (b.eq(0).all().item<bool>()) {
      p = at::zeros_like(p);
      r = q_old;
    }
    const auto pr = p.mm(r.t());
    m -= (1 - o.mu()) * (transposed ? pr.t() : pr);
    q = r / (r.norm(2, {0}, /*keepdim=*/true) + o.epsilon());
    const auto u = p.mm(q.t());
    x = x * (1 - o.lr() * o.weight_decay()) -
        o.lr() * std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)) *
            (transposed ? u.t() : u).reshape(x.sizes());
  }
};

const DionParamState& state_of(const torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const DionParamState&>(*opt.state().at(compat::state_key(p)));
}

// Runs 5 fp32 steps of `o` on a parameter of `shape` beside the fp64
// reference and compares the parameter, M and Q (up to column signs).
// Tolerance: 5·d·κ·u, u = 2^-24 (fp32's unit roundoff), d the longest
// dimension, κ the largest condition number of a B·Q the reference
// orthogonalized. Each step's fp32 products B·Q and Bᵀ·P carry relative
// error up to d·u, and the orthonormal factor of a QR moves by at most κ
// times its input's relative perturbation to first order (Householder's
// backward error and RCQR's triangular solves and Cholesky pass, on the
// sketched and so well-conditioned P·R₁⁻¹, are of the same d·u order); the
// error feedback and the warm start carry each step's error into the next:
// 5 steps. The errors measured sit 10–1000× below the bound; a wrong
// formula (mu, a transpose, the scale, the sign of the feedback) moves the
// values by 1e-2 or more. κ must stay below 1000 for the bound to mean something.
void expect_matches_reference(const std::vector<int64_t>& shape, const DionOptions& o, uint64_t seed) {
  BesideReference<Dion, RefDion> beside(gradient_run(seed, shape, 5), o, o, 5);
  auto& [data, ref, p, opt] = beside;
  const auto what = "shape " + c10::str(c10::IntArrayRef(shape)) + " qr_method " + o.qr_method() + " rank_fraction " +
                    std::to_string(o.rank_fraction()) + " power_iters " + std::to_string(o.power_iters());
  ASSERT_LT(ref.max_cond, 1000.0) << what << ": B·Q too ill-conditioned for the bound";
  const double d = static_cast<double>(std::max(ref.rows, ref.cols));
  const double tol = std::ldexp(1.0, -24) * 5 * d * ref.max_cond;
  EXPECT_LT(relative(p.detach(), ref.x), tol) << what;
  const auto& st = state_of(opt, p);
  EXPECT_EQ(st.step(), 5) << what;
  EXPECT_LT(relative(st.momentum(), ref.m), tol) << what;
  ASSERT_EQ(st.Q().sizes(), ref.q.sizes()) << what;
  EXPECT_LT(relative(signs_aligned(st.Q(), ref.q), ref.q), tol) << what;
}

TEST(Dion, FiveFp32StepsEqualDionArithmetic) {
  for (const std::string method : {"rcqr", "qr"}) {
    auto o = DionOptions(0.02).weight_decay(0.1).mu(0.9).qr_method(method);
    expect_matches_reference({12, 5}, o, 1);       // tall: B = M
    expect_matches_reference({6, 10}, o, 2);       // wide: B = Mᵀ
    expect_matches_reference({7, 7}, o, 3);        // square, full rank: Householder QR
    expect_matches_reference({4, 3, 3, 3}, o, 4);  // conv: one 4×27 matrix
    o.rank_fraction(0.5).rank_multiple_of(2);      // r = 2·⌈0.5·12/2⌉ = 6 of 12
    expect_matches_reference({16, 12}, o, 5);
    o.rank_fraction(0.3).rank_multiple_of(1).power_iters(2);
    expect_matches_reference({10, 18}, o, 6);
  }
}

TEST(Dion, RankIsDions) {
  const auto r = [](int64_t rows, int64_t cols, double fraction, int64_t multiple) {
    return detail::dion_rank(rows, cols, DionOptions().rank_fraction(fraction).rank_multiple_of(multiple));
  };
  EXPECT_EQ(r(64, 32, 1.0, 1), 32);
  EXPECT_EQ(r(64, 32, 0.25, 1), 8);
  EXPECT_EQ(r(64, 30, 0.25, 1), 8);   // ⌈7.5⌉
  EXPECT_EQ(r(64, 30, 0.25, 16), 16); // rounded up to the multiple
  EXPECT_EQ(r(64, 30, 0.6, 16), 30);  // 16·⌈18/16⌉ = 32, capped at min(rows, cols)
}

TEST(Dion, AnAllZeroMomentumStepsOnlyTheWeightDecayAndKeepsQ) {
  auto p = leaf(at::randn({6, 4}));
  const auto before = p.detach().clone();
  const auto o = DionOptions(0.1).weight_decay(0.5);
  Dion opt({p}, o);
  p.mutable_grad() = at::zeros({6, 4});
  opt.step();
  EXPECT_TRUE(at::allclose(p.detach(), before * (1 - 0.05), 0, 0));
  const auto& st = state_of(opt, p);
  EXPECT_TRUE(at::equal(st.momentum(), at::zeros({6, 4})));
  // Q ← the old Q with unit columns (Dion's fix_all_zero_or_nan, then column_normalize).
  const auto q0 = detail::dion_initial_q(6, 4, o, at::TensorOptions());
  EXPECT_TRUE(at::allclose(st.Q(), q0 / (q0.norm(2, {0}, true) + 1e-8), 1e-6, 0));
}

TEST(Dion, QIsTheSameDrawInEveryOptimizerAndDevice) {
  const auto o = DionOptions().rank_fraction(0.5);
  const auto a = detail::dion_initial_q(8, 6, o, at::TensorOptions());
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{6, 3}));
  EXPECT_TRUE(at::equal(a, detail::dion_initial_q(8, 6, o, at::TensorOptions())));
  EXPECT_FALSE(at::equal(a, detail::dion_initial_q(8, 6, DionOptions(o).seed(1), at::TensorOptions())));
  // Unit normal entries: mean and spread of the 18 draws within 4 standard errors.
  EXPECT_LT(std::abs(a.mean().item<double>()), 4 / std::sqrt(18.0));
}

TEST(Dion, DefaultsAreDions) {
  // dion/dion.py Dion.__init__: lr 0.01, mu 0.95, rank_fraction 1.0,
  // rank_multiple_of 1, weight_decay 0.01, epsilon 1e-8, power_iters 1,
  // qr_method "rcqr", rcqr_oversample 1.25; the sketch's seed 0.
  elementwise::expect_fields(DionOptions(), 0.01, 0.95, 1.0, 1, 0.01, 1e-8, 1, "rcqr", 1.25, 0);
}

TEST(Dion, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({4, 3}));
  const auto bad = elementwise::refused_with<Dion, DionOptions>({p});
  bad(DionOptions(-1), {"[muon::Dion]", "lr", "-1"});
  bad(DionOptions().mu(1.5), {"mu", "1.5"});
  bad(DionOptions().rank_fraction(0), {"rank_fraction", "0"});
  bad(DionOptions().rank_multiple_of(0), {"rank_multiple_of", "0"});
  bad(DionOptions().weight_decay(-0.1), {"weight_decay", "-0.1"});
  bad(DionOptions().epsilon(0), {"epsilon", "0"});
  bad(DionOptions().power_iters(0), {"power_iters", "0"});
  bad(DionOptions().qr_method("cqr"), {"qr_method", "'cqr'", "rcqr"});
  bad(DionOptions().rcqr_oversample(0.5), {"rcqr_oversample", "0.5"});
  bad(DionOptions().seed(-2), {"seed", "-2"});
  auto v = leaf(at::randn({5}));
  expect_value_error([&] { Dion opt({v}); }, {"[muon::Dion]", "1 dims", "matrices"});
  // An edit of a group's options is caught at the step, changing nothing.
  Dion opt({p}, DionOptions(0.1));
  static_cast<DionOptions&>(opt.param_groups()[0].options()).power_iters(-3);
  p.mutable_grad() = at::ones_like(p);
  const auto before = p.detach().clone();
  expect_value_error([&] { opt.step(); }, {"power_iters", "-3"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_TRUE(opt.state().empty());
}

TEST(Dion, ResumedRunIsBitIdentical) {
  for (const auto& options : {DionOptions(0.02).weight_decay(0.1), DionOptions(0.02).rank_fraction(0.5).qr_method("qr")}) {
    // 7 steps straight against 3, saved, loaded into other options, and 4 more.
    expect_resumed_run_bit_identical<Dion>(gradient_run(1, {6, 4}, 7), 3, options, DionOptions(0.5), state_of,
                                           options.qr_method());
  }
}

TEST(Dion, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  expect_refuses_archive_of<Dion, LaProp>(DionOptions(0.2), "[muon::Dion]", "muon::LaProp");
}

TEST(Dion, BuiltFromAConfigWithItsFieldsAndExplained) {
  ckpt::BuiltFromConfig<Dion, DionOptions> built(
      "dion", R"({"optimizer": "dion", "lr": 0.01, "dion_mu": 0.9, "dion_rank_fraction": 0.5,
                  "dion_rank_multiple_of": 2, "weight_decay": 0.05, "dion_epsilon": 1e-7,
                  "dion_power_iters": 2, "dion_qr_method": "qr", "dion_rcqr_oversample": 2.0,
                  "dion_seed": 7})");
  ASSERT_NE(built.part, nullptr);
  // Every field, as the config set it.
  elementwise::expect_fields(built.options(), 0.01, 0.9, 0.5, 2, 0.05, 1e-7, 2, "qr", 2.0, 7);
  const auto text = built.step_and_explain();
  // w 8×4: momentum 8×4 and Q 4×r, r = 2·⌈0.5·4/2⌉ = 2, fp32.
  EXPECT_EQ(built.part->state_bytes(), 4 * (32 + 8));
  EXPECT_NE(text.find("state of dion: step [counter], momentum ["), std::string::npos) << text;
  expect_value_error([&] { apply_config_json(built.config, R"({"dion_qr_method": "householder"})"); },
                     {"dion_qr_method", "householder"});
}

// ---- layouts ---------------------------------------------------------------------

// The sharded layout's distance from one process: its sums (Σ Mᵢᵀ·Pᵢ or
// Σ Mᵢᵀ·Qᵢ over the ranks) run in another order than one process's
// products, d·u relative each (d ≤ 64 here, u = 2^-24), which the QR
// amplifies by at most κ(B·Q) (below 50 for these matrices: the fp64
// reference test's bound, 5·d·κ·u, over 5 steps): 5·64·50·2^-24 ≈ 1e-3;
// a wrong exchange (a missing rank's part, a transposed factor) moves the
// values by 1e-1 or more.
constexpr double kShardedTolerance = 1e-3;

TEST(Dion, LayerwiseAndShardedEqualOneProcessThroughMakeOptimizer) {
  ckpt::expect_owner_compute_layouts<distributed::ShardedDion>(
      "dion", 4, ckpt::kOwnerComputeLayouts,
      [](const std::string& kind) { return kind == "layerwise" ? 0.0 : kShardedTolerance; });
}

// Wide (B = Mᵀ: P all-reduced), tall (B = M: P's rows gathered, R
// all-reduced), conv and a 2-row matrix (empty shards at 3 and 4 ranks);
// rows split unevenly. Layer-wise is bit for bit (whole matrices).
const layouts::SeededMatrices kSharded{{{7, 12}, {13, 5}, {6, 2, 2, 3}, {2, 9}}, 70, 300};

TEST(ShardedDion, LowRankExchangeEqualsOneProcessToRounding) {
  const std::vector<DionOptions> sets{DionOptions(0.02).weight_decay(0.1),
                                      DionOptions(0.02).rank_fraction(0.5).power_iters(2).qr_method("qr")};
  for (size_t hs = 0; hs < sets.size(); ++hs) {
    layouts::row_parts_against_one_process<Dion, distributed::ShardedDion>(
        kSharded, 5, sets[hs], {1, 2, 3, 4}, "set " + std::to_string(hs),
        [&](distributed::ShardedDion& opt, layouts::RowParts& parts, Dion& single, std::vector<at::Tensor>& whole,
            const std::string& what) {
          auto& params = parts.params;
          for (size_t k = 0; k < params.size(); ++k) {
            const auto want = parts.local(k, whole[k].detach());
            if (want.numel() > 0) {
              EXPECT_LT(relative(params[k].detach(), want) * want.abs().max().item<double>() /
                            whole[k].abs().max().item<double>(),
                        kShardedTolerance)
                  << what << " param " << k;
            }
            const auto& st = state_of(opt, params[k]);
            EXPECT_EQ(st.step(), 5) << what;
            const auto& one = state_of(single, whole[k]);
            const auto m = parts.local(k, one.momentum());
            if (m.numel() > 0) {
              EXPECT_LT((st.momentum() - m).abs().max().item<double>() / one.momentum().abs().max().item<double>(),
                        kShardedTolerance)
                  << what << " momentum of param " << k;
            }
            // Q lives with the owner alone.
            if (opt.holds_whole_state(params[k])) {
              EXPECT_LT(relative(signs_aligned(st.Q(), one.Q().to(at::kDouble)), one.Q()), kShardedTolerance)
                  << what << " Q of param " << k;
            } else {
              EXPECT_FALSE(st.Q().defined()) << what;
            }
          }
        });
  }
}

TEST(ShardedDion, CheckpointsReshard) {
  // M splits with the rows, the owner writes Q once and a load gives it to
  // the new owner; training on equals never stopping, to the sharded
  // layout's rounding (a lost or misplaced M or Q moves the values far more).
  ckpt::owner_compute_reshard_chain("dion", kShardedTolerance);
}

// Dion runs in tensor_parallel (TensorParallelDion); the 2-D layout and the
// replicated mode refuse it.
TEST(ShardedDion, SplittingLayoutsAreRefusedNamingTheOptimizer) {
  ckpt::expect_splitting_layouts_refused<distributed::ShardedDion>("dion", "[muon::distributed::ShardedDion]",
                                                                   DionOptions(), "dion", /*in_tensor_parallel=*/true);
}

// ---- tensor parallel ----------------------------------------------------------------

// Every orientation of the exchange: tall and wide matrices (B = M, B = Mᵀ),
// a square one (B = M), each split by rows and by columns over 2 and 3
// ranks (uneven blocks), so that B is split by its rows in some and by its
// columns in others; 5 steps against one process on the whole matrices, at
// the sharded layout's tolerance (the same all-reduced and all-gathered
// products, kShardedTolerance).
TEST(TensorParallelDion, BlocksEqualOneProcessToRoundingInEveryOrientation) {
  const std::vector<std::vector<int64_t>> shapes{{13, 5}, {7, 12}, {8, 8}};
  const std::vector<DionOptions> sets{DionOptions(0.02).weight_decay(0.1),
                                      DionOptions(0.02).rank_fraction(0.5).power_iters(2).qr_method("qr")};
  for (const int world : {2, 3}) {
    for (size_t hs = 0; hs < sets.size(); ++hs) {
      run_ranks(world, [&](distributed::Group& g) {
        std::vector<at::Tensor> whole, blocks;
        std::unordered_map<const void*, distributed::TensorParallelShard> shards;
        std::vector<std::pair<int64_t, int64_t>> where;  // (dim, offset) of each block
        for (size_t k = 0; k < 2 * shapes.size(); ++k) {
          const auto& shape = shapes[k / 2];
          const int64_t dim = static_cast<int64_t>(k % 2);
          const auto sizes = distributed::balanced_split_sizes(shape[static_cast<size_t>(dim)], world);
          const auto offset = distributed::split_offset(sizes, g.rank());
          const auto init = seeded_randn(shape, 90 + k);
          whole.push_back(leaf(init));
          blocks.push_back(leaf(init.narrow(dim, offset, sizes[static_cast<size_t>(g.rank())])));
          shards.emplace(blocks.back().unsafeGetTensorImpl(), distributed::TensorParallelShard(shape, dim, g));
          where.emplace_back(dim, offset);
        }
        Dion single(whole, sets[hs]);
        distributed::TensorParallelDion opt({torch::optim::OptimizerParamGroup(blocks)}, sets[hs], shards);
        for (int64_t step = 0; step < 5; ++step) {
          for (size_t k = 0; k < whole.size(); ++k) {
            const auto grad = seeded_randn(shapes[k / 2], 400 + 7 * static_cast<uint64_t>(step) + k);
            whole[k].mutable_grad() = grad;
            blocks[k].mutable_grad() = grad.narrow(where[k].first, where[k].second, blocks[k].size(where[k].first)).contiguous();
          }
          single.step();
          opt.step();
        }
        for (size_t k = 0; k < whole.size(); ++k) {
          const auto what = "W=" + std::to_string(world) + " set " + std::to_string(hs) + " shape " +
                            c10::str(c10::IntArrayRef(shapes[k / 2])) + " split along " + std::to_string(where[k].first);
          const auto own = [&](const at::Tensor& t) {
            return t.narrow(where[k].first, where[k].second, blocks[k].size(where[k].first));
          };
          const auto scale = whole[k].abs().max().item<double>();
          EXPECT_LT((blocks[k].detach() - own(whole[k].detach())).abs().max().item<double>() / scale, kShardedTolerance)
              << what;
          const auto& st = state_of(opt, blocks[k]);
          const auto& one = state_of(single, whole[k]);
          EXPECT_EQ(st.step(), 5) << what;
          EXPECT_LT((st.momentum() - own(one.momentum())).abs().max().item<double>() /
                        one.momentum().abs().max().item<double>(),
                    kShardedTolerance)
              << what;
          // Q whole, alike on every rank of the group.
          EXPECT_LT(relative(signs_aligned(st.Q(), one.Q()), one.Q()), kShardedTolerance) << what;
        }
      });
    }
  }
}

TEST(TensorParallelDion, ThroughMakeOptimizerEqualsOneProcess) {
  const auto single = ckpt::one_process_after("dion", {4}).at(4);
  ckpt::expect_layouts_equal(
      "dion", 4, single, {{"tp", 2}, {"tp", 3}}, "dion",
      [&](ckpt::Rank& r, const std::string&) {
        auto* composite = dynamic_cast<CompositeOptimizer*>(r.opt.get());
        ASSERT_NE(composite, nullptr);
        EXPECT_NE(dynamic_cast<distributed::TensorParallelDion*>(composite->find_part("dion")), nullptr);
      },
      [](const std::string&) { return kShardedTolerance; });
}

// Q, whole on every rank of a tensor-parallel group, is stored once and
// loads into every layout; M splits with the blocks.
TEST(TensorParallelDion, CheckpointsReshard) {
  ckpt::reshard_chain("dion", "dion_tp_chain",
                      {{"tp", 2, 2, "dion tp W=2", kShardedTolerance},
                       {"none", 1, 3, "dion single from tp W=2", kShardedTolerance},
                       {"tp", 3, 4, "dion tp W=3 from single", kShardedTolerance},
                       {"sharded", 2, 5, "dion sharded W=2 from tp W=3", kShardedTolerance},
                       {"tp", 2, 6, "dion tp W=2 from sharded W=2", kShardedTolerance}},
                      ckpt::one_process_after("dion", {2, 3, 4, 5, 6}));
}

TEST(TensorParallelDion, ABlockThatDoesNotFitIsRefused) {
  run_ranks(2, [&](distributed::Group& g) {
    auto p = leaf(at::randn({3, 4}));
    std::unordered_map<const void*, distributed::TensorParallelShard> shards;
    shards.emplace(p.unsafeGetTensorImpl(), distributed::TensorParallelShard({8, 4}, 0, g));
    expect_value_error([&] { distributed::TensorParallelDion opt({torch::optim::OptimizerParamGroup({p})}, {}, shards); },
                       {"[muon::distributed::TensorParallelDion]", "does not fit rank"});
  });
}

// Sharded Dion moves the low-rank factors (Q, P or its rows, R or its rows:
// about (m + 2n)·r elements per matrix) where Muon's owner-compute moves
// each rank's rows of every matrix to the owner and back (about m·n);
// tensor-parallel Dion moves P's or R's rows and the other whole (about
// (m + n)·r) where Muon's duplicated mode gathers every block (about m·n):
// at rank_fraction 1 (r = min(m, n) = 16 on these 16-wide matrices) Dion
// moves more, at 1/4 less. Layer-wise, every optimizer moves the updated
// parameters. Printed as the table in docs/distributed.md.
TEST(ShardedDion, BytesSentPerStepBesideMuons) {
  std::printf("| layout | ranks | muon | dion (rank_fraction 1) | dion (rank_fraction 1/4) |\n|---|---|---|---|---|\n");
  for (const auto& [kind, world] : {std::make_pair(std::string("sharded"), 2), std::make_pair(std::string("sharded"), 4),
                                    std::make_pair(std::string("tp"), 2), std::make_pair(std::string("tp"), 4),
                                    std::make_pair(std::string("layerwise"), 2),
                                    std::make_pair(std::string("layerwise"), 4)}) {
    const auto muon = ckpt::bytes_of_step("muon", kind, world);
    const auto full = ckpt::bytes_of_step("dion", kind, world);
    const auto quarter = ckpt::bytes_of_step("dion/0.25", kind, world);
    const auto ratio = [&](int64_t b) { return static_cast<double>(b) / static_cast<double>(muon); };
    std::printf("| %s | %d | %lld | %lld (%.2f) | %lld (%.2f) |\n", kind.c_str(), world, static_cast<long long>(muon),
                static_cast<long long>(full), ratio(full), static_cast<long long>(quarter), ratio(quarter));
    EXPECT_GT(muon, 0) << kind << " W=" << world;
    if (kind != "layerwise") {
      EXPECT_GT(full, muon) << kind << " W=" << world;
      EXPECT_LT(quarter, muon) << kind << " W=" << world;
    } else {
      EXPECT_EQ(full, muon) << kind << " W=" << world;
      EXPECT_EQ(quarter, muon) << kind << " W=" << world;
    }
  }
}

}  // namespace
}  // namespace muon::test
