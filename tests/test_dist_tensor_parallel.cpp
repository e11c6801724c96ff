// Tensor-parallel Muon against single-process Muon on the whole matrices,
// with ranks as threads over real Gloo process groups.
//
// Accuracy measure used throughout: for parameters p (TP, reassembled from
// the blocks) and p_ref (single process), both started from p0,
//     rel = max|p − p_ref| / max|p_ref − p0|,
// the error relative to the largest change the optimizer made. It does not
// hide update errors behind the size of the weights (max|p| would).
// fp32 bound 1e-5: the distributed mode sums the Gram matrix and the norm in
// another order and, for a row split of a wide matrix, iterates on XᵀX
// instead of XXᵀ (same polynomial, other rounding); measured ≤ 1.3e-6 here.
// The duplicated mode runs the single-process code on the gathered matrix
// and is checked to be bit-identical. distributed_newton_schulz itself is
// tested in test_dist_newton_schulz.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/ordered_dict.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "archive_util.h"
#include "dist_util.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/muon.h"
#include "tensor_parallel_util.h"

namespace muon::test {
namespace {

using namespace muon::distributed;  // NOLINT(google-build-using-namespace): the module under test

constexpr int kSteps = 4;

at::Tensor initial(int index, c10::IntArrayRef shape) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(index + 5));
  return at::randn(shape, gen, at::TensorOptions(at::kFloat)) * 0.1;
}

double relative_error(const at::Tensor& p, const at::Tensor& ref, const at::Tensor& p0) {
  const double change = (ref - p0).abs().max().item<double>();
  return (p - ref).abs().max().item<double>() / change;
}

// The two matrices of the tests: one wide, one tall, so both Gram sides occur.
const std::vector<std::vector<int64_t>> kShapes = {{24, 40}, {40, 24}};

// Runs `steps` of single-process Muon on the whole matrices.
std::vector<at::Tensor> reference_run(const MuonOptions& options, int steps) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < kShapes.size(); ++i) params.push_back(initial(static_cast<int>(i), kShapes[i]));
  for (auto& p : params) p.set_requires_grad(true);
  Muon opt(params, options);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = gradient(s, static_cast<int>(i), kShapes[i]);
    }
    opt.step();
  }
  std::vector<at::Tensor> out;
  for (auto& p : params) out.push_back(p.detach().clone());
  return out;
}

// Runs the same steps with TP Muon on this rank's blocks; returns the blocks.
std::vector<at::Tensor> tp_run(const Group& tp, int64_t dim, TensorParallelMode mode,
                               const MuonOptions& options, int steps,
                               std::vector<std::vector<int64_t>>* sizes_out = nullptr) {
  std::vector<at::Tensor> params;
  std::vector<std::vector<int64_t>> sizes;
  TensorParallelOptions tpo;
  tpo.mode(mode);
  for (size_t i = 0; i < kShapes.size(); ++i) {
    sizes.push_back(uneven_sizes(kShapes[i][static_cast<size_t>(dim)], tp.size()));
    params.push_back(block_of(initial(static_cast<int>(i), kShapes[i]), dim, sizes[i], tp.rank()));
    params.back().set_requires_grad(true);
    tpo.shard(params.back(), TensorParallelShard(kShapes[i], dim, tp));
  }
  TensorParallelMuon opt(params, options, tpo);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(opt.block_sizes(params[i]), sizes[i]);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() =
          block_of(gradient(s, static_cast<int>(i), kShapes[i]), dim, sizes[i], tp.rank());
    }
    opt.step();
  }
  if (sizes_out) *sizes_out = sizes;
  std::vector<at::Tensor> out;
  for (auto& p : params) out.push_back(p.detach().clone());
  return out;
}

// ---- equivalence: duplicated and distributed = single process ------------------

using Case = std::tuple<int, int64_t, TensorParallelMode>;
class TensorParallelEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelEquivalence, MatchesSingleProcessMuonOnTheWholeMatrix) {
  const auto [world, dim, mode] = GetParam();
  // Every scale mode, nesterov on and off; decoupled weight decay on.
  std::vector<MuonOptions> configs;
  for (const auto scale : {ScaleMode::kShapeScaling, ScaleMode::kSpectral,
                           ScaleMode::kUnitRmsNorm, ScaleMode::kMatchRmsAdamW}) {
    for (const bool nesterov : {true, false}) {
      configs.push_back(MuonOptions(0.05).momentum(0.9).nesterov(nesterov).scale_mode(scale)
                            .weight_decay(0.01));
    }
  }
  std::vector<std::vector<at::Tensor>> refs;
  for (const auto& o : configs) refs.push_back(reference_run(o, kSteps));

  run_ranks(world, [&](Group& g) {
    for (size_t c = 0; c < configs.size(); ++c) {
      std::vector<std::vector<int64_t>> sizes;
      const auto blocks = tp_run(g, dim, mode, configs[c], kSteps, &sizes);
      for (size_t i = 0; i < kShapes.size(); ++i) {
        const auto ref = block_of(refs[c][i], dim, sizes[i], g.rank());
        const auto p0 = block_of(initial(static_cast<int>(i), kShapes[i]), dim, sizes[i], g.rank());
        // Relative to the whole matrix's largest change (each rank checks its block).
        const double change = (refs[c][i] - initial(static_cast<int>(i), kShapes[i])).abs().max().item<double>();
        const double err = (blocks[i] - ref).abs().max().item<double>() / change;
        EXPECT_LE(err, kFp32Tolerance)
            << "matrix " << i << " " << c10::IntArrayRef(kShapes[i]) << ", config " << c
            << " (scale " << muon::to_string(configs[c].scale_mode()) << ", nesterov "
            << configs[c].nesterov() << "), rank " << g.rank() << " of " << world;
        if (mode == TensorParallelMode::kDuplicated) {
          EXPECT_TRUE(at::equal(blocks[i], ref)) << "duplicated mode is not bit-identical";
        }
        // The step did move the parameter (the comparison is not vacuous).
        EXPECT_GT((blocks[i] - p0).abs().max().item<double>(), 1e-3);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    WorldsDimsModes, TensorParallelEquivalence,
    ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(int64_t{0}, int64_t{1}),
                       ::testing::Values(TensorParallelMode::kDuplicated,
                                         TensorParallelMode::kDistributed)),
    [](const ::testing::TestParamInfo<Case>& info) {
      return "world" + std::to_string(std::get<0>(info.param)) + "_dim" +
             std::to_string(std::get<1>(info.param)) + "_" +
             muon::distributed::to_string(std::get<2>(info.param));
    });

// ---- blockwise = per-block single process ------------------------------------------

TEST(TensorParallelBlockwise, EqualsSingleProcessMuonOnEachBlock) {
  for (const int64_t dim : {0, 1}) {
    const auto options = MuonOptions(0.05).scale_mode(ScaleMode::kSpectral);
    run_ranks(3, [&](Group& g) {
      std::vector<std::vector<int64_t>> sizes;
      const auto blocks = tp_run(g, dim, TensorParallelMode::kBlockwise, options, kSteps, &sizes);
      for (size_t i = 0; i < kShapes.size(); ++i) {
        // This rank's block as a matrix of its own, through plain Muon.
        auto p = block_of(initial(static_cast<int>(i), kShapes[i]), dim, sizes[i], g.rank());
        const auto p0 = p.clone();
        p.set_requires_grad(true);
        Muon opt(std::vector<at::Tensor>{p}, options);
        for (int s = 0; s < kSteps; ++s) {
          p.mutable_grad() =
              block_of(gradient(s, static_cast<int>(i), kShapes[i]), dim, sizes[i], g.rank());
          opt.step();
        }
        // Same operations on the same data: equal up to BLAS summation order.
        EXPECT_LE(relative_error(blocks[i], p.detach(), p0), 1e-6) << "matrix " << i << " dim " << dim;
      }
    });
  }
}

TEST(TensorParallelBlockwise, DiffersFromWholeMatrixMuon) {
  // Blockwise is a different optimizer: check the test above could tell.
  const auto options = MuonOptions(0.05);
  const auto refs = reference_run(options, kSteps);
  run_ranks(2, [&](Group& g) {
    std::vector<std::vector<int64_t>> sizes;
    const auto blocks = tp_run(g, 0, TensorParallelMode::kBlockwise, options, kSteps, &sizes);
    const auto ref = block_of(refs[0], 0, sizes[0], g.rank());
    const auto p0 = block_of(initial(0, kShapes[0]), 0, sizes[0], g.rank());
    EXPECT_GT(relative_error(blocks[0], ref, p0), 1e-2);
  });
}

// ---- construction: validation on every rank ----------------------------------------

std::vector<std::string> construct_errors(int world,
                                          const std::function<TensorParallelShard(Group&)>& shard,
                                          const std::function<at::Tensor(Group&)>& block,
                                          TensorParallelMode mode_rank1 = TensorParallelMode::kDistributed) {
  return run_ranks_collect(world, [&](Group& g) {
    auto p = block(g);
    TensorParallelOptions tpo;
    tpo.mode(g.rank() == 1 ? mode_rank1 : TensorParallelMode::kDistributed).shard(p, shard(g));
    TensorParallelMuon opt(std::vector<at::Tensor>{p}, MuonOptions(), tpo);
  });
}

TEST(TensorParallelValidation, GlobalShapeMismatchRaisesOnEveryRank) {
  const auto errors = construct_errors(
      2,
      [](Group& g) {
        return TensorParallelShard({24, g.rank() == 1 ? 41 : 40}, 0, g);
      },
      [](Group&) { return at::zeros({12, 40}); });
  // Rank 1's block [12, 40] does not fit its own global shape [24, 41]: it
  // raises with the local reason, rank 0 with "another rank reported ...".
  EXPECT_NE(errors[1].find("does not match global_shape [24, 41]"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("another rank reported an invalid shard"), std::string::npos) << errors[0];
}

TEST(TensorParallelValidation, DisagreementRaisesOnEveryRank) {
  // Consistent locally, inconsistent across ranks: the partition dim.
  auto errors = construct_errors(
      2, [](Group& g) { return TensorParallelShard({24, 24}, g.rank() == 1 ? 1 : 0, g); },
      [](Group& g) { return g.rank() == 1 ? at::zeros({24, 12}) : at::zeros({12, 24}); });
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("the ranks disagree on global_shape, partition_dim or mode"),
              std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
  // The mode.
  errors = construct_errors(
      2, [](Group& g) { return TensorParallelShard({24, 40}, 0, g); },
      [](Group&) { return at::zeros({12, 40}); }, TensorParallelMode::kBlockwise);
  for (size_t r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("disagree"), std::string::npos) << errors[r];
  // Blocks that do not tile the matrix (13 + 12 rows for a global 24).
  errors = construct_errors(
      2, [](Group& g) { return TensorParallelShard({24, 40}, 0, g); },
      [](Group& g) { return at::zeros({g.rank() == 0 ? 13 : 12, 40}); });
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("the blocks' sizes in dim 0 sum to 25, global_shape has 24"),
              std::string::npos)
        << errors[r];
  }
}

TEST(TensorParallelValidation, LocalArgumentErrors) {
  auto single = Group::single();
  auto p = at::zeros({4, 4});
  EXPECT_THROW(TensorParallelOptions().mode("sideways"), c10::ValueError);
  EXPECT_THROW(TensorParallelOptions().shard(p, TensorParallelShard({4, 4}, 0, Group())),
               c10::ValueError);
  EXPECT_THROW(TensorParallelOptions().shard(p, TensorParallelShard({4, 4}, 0, single))
                   .shard(p, TensorParallelShard({4, 4}, 0, single)),
               c10::ValueError);
  // A shard that is not a parameter of the optimizer.
  auto other = at::zeros({4, 4});
  TensorParallelOptions tpo;
  tpo.shard(other, TensorParallelShard({4, 4}, 0, single));
  EXPECT_THROW(TensorParallelMuon(std::vector<at::Tensor>{p}, MuonOptions(), tpo), c10::ValueError);
  // partition_dim 2.
  TensorParallelOptions bad_dim;
  bad_dim.shard(p, TensorParallelShard({4, 4}, 2, single));
  EXPECT_THROW(TensorParallelMuon(std::vector<at::Tensor>{p}, MuonOptions(), bad_dim),
               c10::ValueError);
}

TEST(TensorParallelValidation, GradientOnOneRankOnlyRaisesOnEveryRankAndChangesNothing) {
  // Rank 0 has a gradient for its block, rank 1 none: a precondition the
  // other layouts agree on before any work; here too, both ranks raise at
  // once (no rank waits in the block's collectives), naming the blocks.
  std::vector<at::Tensor> before(2), after(2);
  const auto errors = run_ranks_collect(2, [&](Group& g) {
    auto p = at::randn({12, 40});
    p.set_requires_grad(true);
    auto q = at::randn({12, 40});  // a second block, with a gradient on both ranks
    q.set_requires_grad(true);
    TensorParallelOptions tpo;
    tpo.mode("distributed")
        .shard(p, TensorParallelShard({24, 40}, 0, g))
        .shard(q, TensorParallelShard({24, 40}, 0, g));
    TensorParallelMuon opt(std::vector<at::Tensor>{p, q}, MuonOptions(), tpo);
    if (g.rank() == 0) p.mutable_grad() = at::ones({12, 40});
    q.mutable_grad() = at::ones({12, 40});
    const auto r = static_cast<size_t>(g.rank());
    before[r] = at::cat({p.detach(), q.detach()}).clone();
    try {
      opt.step();
    } catch (...) {
      after[r] = at::cat({p.detach(), q.detach()}).clone();
      throw;
    }
  });
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("the ranks differ in which tensor-parallel blocks have a gradient"),
              std::string::npos)
        << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("[1, 1]"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("[0, 1]"), std::string::npos) << errors[r];
    EXPECT_LT(errors[r].size(), 600u) << errors[r];
    ASSERT_TRUE(after[r].defined());
    EXPECT_TRUE(at::equal(before[r], after[r])) << "rank " << r << " changed its parameters";
  }
}

TEST(TensorParallelTimeout, RankThatNeverStepsMakesTheOtherRaiseWithinTheTimeout) {
  // Rank 1 builds its optimizer (a collective) and returns without stepping;
  // its optimizer and group stay alive, so rank 0 notices only by timeout.
  constexpr auto kTimeout = std::chrono::milliseconds(2000);
  std::mutex mu;
  std::vector<std::unique_ptr<TensorParallelMuon>> keep_alive;
  std::vector<at::Tensor> keep_params;
  double elapsed_s = -1;
  const auto errors = run_ranks_collect(
      2,
      [&](Group& g) {
        auto p = at::zeros({12, 40});
        p.set_requires_grad(true);
        TensorParallelOptions tpo;
        tpo.mode("distributed").shard(p, TensorParallelShard({24, 40}, 0, g));
        auto opt = std::make_unique<TensorParallelMuon>(std::vector<at::Tensor>{p}, MuonOptions(), tpo);
        if (g.rank() == 1) {
          std::lock_guard<std::mutex> lock(mu);
          keep_alive.push_back(std::move(opt));
          keep_params.push_back(p);
          return;
        }
        p.mutable_grad() = at::ones({12, 40});
        const auto start = std::chrono::steady_clock::now();
        try {
          opt->step();
        } catch (...) {
          elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          throw;
        }
      },
      muon::distributed::GroupOptions().timeout(kTimeout));
  EXPECT_TRUE(errors[1].empty()) << errors[1];
  // The first collective of a step is the agreement on its checks (muon/optim/step_guard.h).
  EXPECT_NE(errors[0].find("all_gather on group 'world' (rank 0 of 2, timeout 2000 ms) failed"),
            std::string::npos)
      << errors[0];
  EXPECT_GE(elapsed_s, 1.5);
  EXPECT_LT(elapsed_s, 5.0);
}

// ---- empty blocks ---------------------------------------------------------------------

TEST(TensorParallelEmptyBlocks, RankWithoutRowsStillMatchesSingleProcess) {
  // 3 rows (columns) over 4 ranks: blocks 1, 1, 1, 0. The empty rank joins
  // every collective and keeps an empty parameter.
  const std::vector<std::vector<int64_t>> shapes = {{3, 8}, {8, 3}};
  const std::vector<int64_t> dims = {0, 1};
  const auto options = MuonOptions(0.05).scale_mode(ScaleMode::kSpectral);
  std::vector<at::Tensor> whole;
  for (size_t i = 0; i < shapes.size(); ++i) {
    whole.push_back(initial(static_cast<int>(i), shapes[i]).set_requires_grad(true));
  }
  Muon ref(whole, options);
  for (int s = 0; s < kSteps; ++s) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      whole[i].mutable_grad() = gradient(s, static_cast<int>(i), shapes[i]);
    }
    ref.step();
  }
  for (const auto mode : {TensorParallelMode::kDuplicated, TensorParallelMode::kDistributed,
                          TensorParallelMode::kBlockwise}) {
    run_ranks(4, [&](Group& g) {
      std::vector<at::Tensor> blocks;
      std::vector<std::vector<int64_t>> sizes;
      TensorParallelOptions tpo;
      tpo.mode(mode);
      for (size_t i = 0; i < shapes.size(); ++i) {
        sizes.push_back(muon::distributed::balanced_split_sizes(3, 4));
        blocks.push_back(block_of(initial(static_cast<int>(i), shapes[i]), dims[i], sizes[i],
                                  g.rank())
                             .set_requires_grad(true));
        tpo.shard(blocks.back(), TensorParallelShard(shapes[i], dims[i], g));
      }
      TensorParallelMuon opt(blocks, options, tpo);
      for (int s = 0; s < kSteps; ++s) {
        for (size_t i = 0; i < shapes.size(); ++i) {
          blocks[i].mutable_grad() =
              block_of(gradient(s, static_cast<int>(i), shapes[i]), dims[i], sizes[i], g.rank());
        }
        opt.step();
      }
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_EQ(blocks[i].numel(), g.rank() == 3 ? 0 : 8);
        if (mode == TensorParallelMode::kBlockwise || g.rank() == 3) continue;
        const auto r = block_of(whole[i].detach(), dims[i], sizes[i], g.rank());
        const auto p0 = block_of(initial(static_cast<int>(i), shapes[i]), dims[i], sizes[i], g.rank());
        const double change = (whole[i].detach() - initial(static_cast<int>(i), shapes[i])).abs().max().item<double>();
        EXPECT_LE((blocks[i].detach() - r).abs().max().item<double>() / change, kFp32Tolerance)
            << muon::distributed::to_string(mode) << " matrix " << i << " rank " << g.rank();
        EXPECT_GT((blocks[i].detach() - p0).abs().max().item<double>(), 1e-3);
      }
    });
  }
  // Outside TP blocks, empty parameters are still rejected.
  auto empty = at::zeros({0, 4});
  EXPECT_THROW(TensorParallelMuon(std::vector<at::Tensor>{empty}, MuonOptions(), TensorParallelOptions()),
               c10::ValueError);
}

// ---- save / load, per rank ------------------------------------------------------------

TEST(TensorParallelMuonArchive, RoundTripContinuesBitIdenticallyOnTwoRanks) {
  const auto options = MuonOptions(0.05).scale_mode(ScaleMode::kSpectral);
  run_ranks(2, [&](Group& g) {
    const auto sizes = uneven_sizes(24, 2);
    auto make = [&](at::Tensor& p) {
      p = block_of(initial(0, {24, 40}), 0, sizes, g.rank());
      p.set_requires_grad(true);
      TensorParallelOptions tpo;
      tpo.mode("distributed").shard(p, TensorParallelShard({24, 40}, 0, g));
      return std::make_unique<TensorParallelMuon>(std::vector<at::Tensor>{p}, options, tpo);
    };
    auto grad = [&](int s) { return block_of(gradient(s, 0, {24, 40}), 0, sizes, g.rank()); };
    at::Tensor a, b;
    auto opt_a = make(a);
    for (int s = 0; s < 4; ++s) {
      a.mutable_grad() = grad(s);
      opt_a->step();
    }
    auto opt_b = make(b);
    for (int s = 0; s < 2; ++s) {
      b.mutable_grad() = grad(s);
      opt_b->step();
    }
    const auto archive = muon::test::save_to_string(*opt_b);  // this rank's file
    at::Tensor c;
    auto opt_c = make(c);
    {
      at::NoGradGuard no_grad;
      c.copy_(b);
    }
    muon::test::load_from_string(*opt_c, archive);
    for (int s = 2; s < 4; ++s) {
      c.mutable_grad() = grad(s);
      opt_c->step();
    }
    EXPECT_TRUE(at::equal(a, c)) << "rank " << g.rank();
    // A plain Muon archive is refused (kind check).
    auto plain_p = at::zeros({sizes[static_cast<size_t>(g.rank())], 40});
    Muon plain(std::vector<at::Tensor>{plain_p}, options);
    EXPECT_THROW(muon::test::load_from_string(plain, archive), c10::ValueError);
  });
}

// ---- inside the hybrid -----------------------------------------------------------------

TEST(TensorParallelHybrid, MatchesSingleProcessHybridOnTheWholeModel) {
  // A small model: fc1 column parallel (weight and bias split on dim 0), fc2
  // row parallel (weight split on dim 1, bias replicated), a replicated head.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> spec = {
      {"layer.fc1.weight", {24, 16}}, {"layer.fc1.bias", {24}},
      {"layer.fc2.weight", {16, 24}}, {"layer.fc2.bias", {16}},
      {"lm_head.weight", {10, 16}}};
  const std::vector<int64_t> split_dim = {0, 0, 1, -1, -1};  // -1: replicated
  auto options = muon::MuonWithAdamWOptions().muon(MuonOptions(0.05).scale_mode(ScaleMode::kSpectral));

  auto run = [&](const Group* g, int steps) {
    torch::OrderedDict<std::string, at::Tensor> named;
    std::vector<std::vector<int64_t>> sizes(spec.size());
    TensorParallelOptions tpo;
    tpo.mode("distributed");
    for (size_t i = 0; i < spec.size(); ++i) {
      auto p = initial(static_cast<int>(i), spec[i].second);
      if (g && split_dim[i] >= 0) {
        sizes[i] = uneven_sizes(spec[i].second[static_cast<size_t>(split_dim[i])], g->size());
        p = block_of(p, split_dim[i], sizes[i], g->rank());
      }
      p.set_requires_grad(true);
      named.insert(spec[i].first, p);
    }
    for (size_t i = 0; i < spec.size(); ++i) {
      // By name, as a hybrid user would.
      if (g && split_dim[i] >= 0 && spec[i].second.size() == 2) {
        tpo.shard(named, spec[i].first, TensorParallelShard(spec[i].second, split_dim[i], *g));
      }
    }
    if (g) {
      EXPECT_THROW(TensorParallelOptions().shard(named, "layer.fc3.weight",
                                                 TensorParallelShard({1, 1}, 0, *g)),
                   c10::ValueError);
    }
    auto o = options;
    if (g) o.muon_factory(muon::distributed::tensor_parallel_muon_factory(tpo));
    muon::MuonWithAdamW opt(named, o);
    if (g) {
      EXPECT_NE(dynamic_cast<TensorParallelMuon*>(opt.muon()), nullptr);
    }
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < spec.size(); ++i) {
        auto grad = gradient(s, static_cast<int>(i), spec[i].second);
        if (g && split_dim[i] >= 0) grad = block_of(grad, split_dim[i], sizes[i], g->rank());
        named[spec[i].first].mutable_grad() = grad;
      }
      opt.step();
    }
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < spec.size(); ++i) {
      auto p = named[spec[i].first].detach();
      out.push_back(p.clone());
    }
    return std::make_pair(out, sizes);
  };
  const auto ref = run(nullptr, kSteps).first;
  run_ranks(2, [&](Group& g) {
    const auto [got, sizes] = run(&g, kSteps);
    for (size_t i = 0; i < spec.size(); ++i) {
      auto r = ref[i];
      auto p0 = initial(static_cast<int>(i), spec[i].second);
      if (split_dim[i] >= 0) {
        r = block_of(r, split_dim[i], sizes[i], g.rank());
        p0 = block_of(p0, split_dim[i], sizes[i], g.rank());
      }
      EXPECT_LE(relative_error(got[i], r, p0), kFp32Tolerance) << spec[i].first << " rank " << g.rank();
    }
  });
}

TEST(TensorParallelHybrid, SaveLoadRoundTripPerRank) {
  // fc1 column parallel (TP Muon), its bias split too (AdamW), on 2 ranks:
  // 2 steps, save, fresh optimizer + load, 2 more steps == 4 steps straight.
  const auto options = muon::MuonWithAdamWOptions().muon(MuonOptions(0.05));
  run_ranks(2, [&](Group& g) {
    const auto sizes = uneven_sizes(24, 2);
    auto make_params = [&] {
      torch::OrderedDict<std::string, at::Tensor> named;
      auto w = block_of(initial(0, {24, 16}), 0, sizes, g.rank());
      auto b = block_of(initial(1, {24}), 0, sizes, g.rank());
      w.set_requires_grad(true);
      b.set_requires_grad(true);
      named.insert("fc1.weight", w);
      named.insert("fc1.bias", b);
      return named;
    };
    auto make_opt = [&](torch::OrderedDict<std::string, at::Tensor>& named) {
      TensorParallelOptions tpo;
      tpo.mode("distributed").shard(named["fc1.weight"], TensorParallelShard({24, 16}, 0, g));
      auto o = options;
      o.muon_factory(muon::distributed::tensor_parallel_muon_factory(tpo));
      return std::make_unique<muon::MuonWithAdamW>(named, o);
    };
    auto set_grads = [&](torch::OrderedDict<std::string, at::Tensor>& named, int s) {
      named["fc1.weight"].mutable_grad() = block_of(gradient(s, 0, {24, 16}), 0, sizes, g.rank());
      named["fc1.bias"].mutable_grad() = block_of(gradient(s, 1, {24}), 0, sizes, g.rank());
    };
    auto a = make_params();
    auto opt_a = make_opt(a);
    for (int s = 0; s < 4; ++s) {
      set_grads(a, s);
      opt_a->step();
    }
    auto b = make_params();
    auto opt_b = make_opt(b);
    for (int s = 0; s < 2; ++s) {
      set_grads(b, s);
      opt_b->step();
    }
    const auto archive = muon::test::save_to_string(*opt_b);
    auto c = make_params();
    {
      at::NoGradGuard no_grad;
      for (const auto& name : {"fc1.weight", "fc1.bias"}) c[name].copy_(b[name]);
    }
    auto opt_c = make_opt(c);
    muon::test::load_from_string(*opt_c, archive);
    for (int s = 2; s < 4; ++s) {
      set_grads(c, s);
      opt_c->step();
    }
    for (const auto& name : {"fc1.weight", "fc1.bias"}) {
      EXPECT_TRUE(at::equal(a[name], c[name])) << name << " on rank " << g.rank();
    }
  });
}

}  // namespace
}  // namespace muon::test
