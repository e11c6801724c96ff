// Layer-wise distributed optimizer: equals single-process optimization,
// each matrix orthogonalized once, state split over the ranks, save/load,
// gradient averaging, errors. Ranks are threads over real Gloo groups.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "archive_util.h"
#include "dist_util.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/newton_schulz.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/state_bytes.h"

namespace {

using muon::distributed::Group;
using muon::distributed::LayerwiseOptimizer;
using muon::distributed::LayerwiseOptions;
using muon::test::ParamSpec;
using Named = torch::OrderedDict<std::string, at::Tensor>;


// A small model: hidden matrices for Muon; embedding, head, norm gains and a
// bias for AdamW (the hybrid's default routing).
std::vector<ParamSpec> hybrid_model() {
  return {{"wte.weight", {40, 16}},          {"blocks.0.qkv.weight", {48, 16}},
          {"blocks.0.proj.weight", {16, 16}}, {"blocks.0.norm.weight", {16}},
          {"blocks.0.fc1.weight", {64, 16}},  {"blocks.0.fc1.bias", {64}},
          {"blocks.0.fc2.weight", {16, 64}},  {"blocks.1.qkv.weight", {48, 16}},
          {"blocks.1.fc2.weight", {16, 64}},  {"lm_head.weight", {40, 16}}};
}

using muon::test::seeded_randn;

// Fresh parameters, identical on every rank (seeded by name index).
Named make_params(const std::vector<ParamSpec>& specs) { return muon::test::seeded_params(specs, 1000); }

// The (already averaged) gradient of step `step`, identical on every rank.
void set_grads(Named& named, int64_t step) {
  size_t i = 0;
  for (auto& item : named) {
    item.value().mutable_grad() = seeded_randn(item.value().sizes().vec(), 7919 * (step + 1) + i++);
  }
}

// Steps [from, to) of `opt`, which holds `named`, each with set_grads' gradient.
void train(Named& named, torch::optim::Optimizer& opt, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    set_grads(named, s);
    opt.step();
  }
}

std::unique_ptr<torch::optim::Optimizer> make_hybrid(const Named& owned) {
  muon::MuonWithAdamWOptions o;
  o.muon(muon::MuonOptions(0.02).weight_decay(0.1));
  o.adamw(torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  return std::make_unique<muon::MuonWithAdamW>(owned, o);
}

// max |a − b| / max |b| over every parameter.
double max_relative_difference(const Named& a, const Named& b) {
  double diff = 0;
  double scale = 0;
  for (const auto& item : b) {
    const auto& x = a[item.key()];
    diff = std::max(diff, (x - item.value()).abs().max().item<double>());
    scale = std::max(scale, item.value().abs().max().item<double>());
  }
  return diff / scale;
}

Named reference_after(const std::vector<ParamSpec>& specs, int64_t steps) {
  auto named = make_params(specs);
  auto opt = make_hybrid(named);
  train(named, *opt, 0, steps);
  return named;
}

class LayerwiseEquality : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(LayerwiseEquality, EqualsSingleProcessHybrid) {
  const auto [world, in_flight] = GetParam();
  constexpr int64_t kSteps = 4;
  const auto reference = reference_after(hybrid_model(), kSteps);
  muon::test::run_ranks(world, [&](Group& group) {
    auto named = make_params(hybrid_model());
    // Small buckets: several per rank, so the overlap path runs.
    LayerwiseOptimizer opt(named, group, make_hybrid,
                           LayerwiseOptions().bucket_bytes(4096).max_in_flight(in_flight));
    train(named, opt, 0, kSteps);
    // The owner runs the single-process code on the same data and the gather
    // copies bytes; 1e-5 (the bound) leaves room only for BLAS
    // summation order, which can differ with the threads a rank gets.
    EXPECT_LE(max_relative_difference(named, reference), 1e-5) << "rank " << group.rank();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndOverlap, LayerwiseEquality,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(int64_t{0}, int64_t{2})));

TEST(Layerwise, FewerParametersThanRanks) {
  const std::vector<ParamSpec> specs{{"a.weight", {24, 16}}, {"b.weight", {16, 8}}};
  const auto reference = reference_after(specs, 3);
  muon::test::run_ranks(4, [&](Group& group) {
    auto named = make_params(specs);
    LayerwiseOptimizer opt(named, group, make_hybrid);
    EXPECT_EQ(opt.inner() == nullptr, group.rank() >= 2);  // two owners, two idle ranks
    // Idle ranks hold only the group of other ranks' parameters.
    EXPECT_EQ(opt.param_groups().size(), group.rank() >= 2 ? 1u : 2u);
    train(named, opt, 0, 3);
    EXPECT_LE(max_relative_difference(named, reference), 1e-5);
  });
}

// An optimizer may change its parameters when it is built (MuonHyperball
// rescales them to its radius). Under the layer-wise layout each parameter is
// changed once, by its owner's optimizer, and every rank holds the owner's
// values before the first step: here an optimizer that doubles its parameters
// when built, which a second build (or none) would show.
TEST(Layerwise, ParametersChangedWhenBuiltChangeOnceEverywhere) {
  const std::vector<ParamSpec> specs{{"a.weight", {24, 16}}, {"b.weight", {16, 8}}, {"c.weight", {8, 8}}};
  for (int world = 1; world <= 3; ++world) {
    muon::test::run_ranks(world, [&](Group& group) {
      auto named = make_params(specs);
      const auto original = make_params(specs);
      LayerwiseOptimizer opt(named, group, [](const Named& owned) {
        at::NoGradGuard no_grad;
        for (const auto& item : owned) item.value().mul_(2);
        return make_hybrid(owned);
      });
      for (const auto& item : original) {
        EXPECT_TRUE(at::equal(named[item.key()].detach(), item.value() * 2))
            << item.key() << " world " << world << " rank " << group.rank();
      }
    });
  }
}

// Per layer the shapes of bench/bench_distributed_layouts.cpp (d = 512: 1536×512,
// 512×512, 2048×512, 512×2048) divided by 16: every matrix has
// min(m, n) = 32, so NS cost and state bytes are both proportional to m·n.
std::vector<ParamSpec> balanced_model() {
  std::vector<ParamSpec> specs;
  for (int layer = 0; layer < 8; ++layer) {
    const auto p = "layers." + std::to_string(layer) + ".";
    specs.push_back({p + "qkv.weight", {96, 32}});
    specs.push_back({p + "proj.weight", {32, 32}});
    specs.push_back({p + "fc1.weight", {128, 32}});
    specs.push_back({p + "fc2.weight", {32, 128}});
  }
  return specs;
}

TEST(Layerwise, EachMatrixOrthogonalizedOnceAndWorkBalanced) {
  const auto specs = balanced_model();
  const muon::NewtonSchulzOptions ns;
  double total = 0;
  int64_t total_state = 0;
  for (const auto& s : specs) {
    total += muon::newton_schulz_flops(s.shape[0], s.shape[1], ns);
    total_state += s.shape[0] * s.shape[1] * 4;  // one fp32 momentum buffer
  }
  for (const int world : {2, 3, 4}) {
    std::mutex mu;
    std::vector<double> flops(static_cast<size_t>(world));
    std::vector<int64_t> state(static_cast<size_t>(world));
    muon::test::run_ranks(world, [&](Group& group) {
      auto named = make_params(specs);
      LayerwiseOptimizer opt(named, group, [](const Named& owned) {
        std::vector<at::Tensor> params;
        for (const auto& item : owned) params.push_back(item.value());
        return std::make_unique<muon::Muon>(params);
      });
      set_grads(named, 0);
      muon::reset_newton_schulz_flops_on_this_thread();
      opt.step();
      std::lock_guard<std::mutex> lock(mu);
      flops[static_cast<size_t>(group.rank())] = muon::newton_schulz_flops_on_this_thread();
      state[static_cast<size_t>(group.rank())] = opt.state_bytes();
    });
    // Every matrix once: the ranks' FLOPs add up to the single-process total.
    EXPECT_DOUBLE_EQ(std::accumulate(flops.begin(), flops.end(), 0.0), total) << world;
    EXPECT_EQ(std::accumulate(state.begin(), state.end(), int64_t{0}), total_state) << world;
    for (int r = 0; r < world; ++r) {
      EXPECT_NEAR(flops[r], total / world, 0.1 * total / world) << "world " << world << " rank " << r;
      EXPECT_NEAR(static_cast<double>(state[r]), static_cast<double>(total_state) / world,
                  0.1 * static_cast<double>(total_state) / world)
          << "world " << world << " rank " << r;
    }
  }
}

TEST(Layerwise, SaveLoadResumesBitIdentically) {
  const auto specs = hybrid_model();
  muon::test::run_ranks(3, [&](Group& group) {
    auto straight = make_params(specs);
    LayerwiseOptimizer a(straight, group, make_hybrid, LayerwiseOptions().bucket_bytes(4096));
    train(straight, a, 0, 4);
    auto resumed = make_params(specs);
    std::string archive;
    {
      LayerwiseOptimizer b(resumed, group, make_hybrid, LayerwiseOptions().bucket_bytes(4096));
      train(resumed, b, 0, 2);
      archive = muon::test::save_to_string(b);
    }
    LayerwiseOptimizer c(resumed, group, make_hybrid, LayerwiseOptions().bucket_bytes(4096));
    muon::test::load_from_string(c, archive);
    train(resumed, c, 2, 4);
    for (const auto& item : straight) {
      EXPECT_TRUE(at::equal(item.value(), resumed[item.key()])) << item.key();
    }
  });
}

TEST(Layerwise, AnotherRanksArchiveIsRejected) {
  std::mutex mu;
  std::vector<std::string> archives(2);
  muon::test::run_ranks(2, [&](Group& group) {
    auto named = make_params(hybrid_model());
    LayerwiseOptimizer opt(named, group, make_hybrid);
    set_grads(named, 0);
    opt.step();
    {
      std::lock_guard<std::mutex> lock(mu);
      archives[static_cast<size_t>(group.rank())] = muon::test::save_to_string(opt);
    }
    group.barrier();
    const auto other = archives[static_cast<size_t>(1 - group.rank())];
    try {
      muon::test::load_from_string(opt, other);
      ADD_FAILURE() << "loaded another rank's archive";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("rank"), std::string::npos) << e.what();
    }
  });
}

TEST(Layerwise, DifferentParametersOnSomeRankFailEverywhere) {
  const auto errors = muon::test::run_ranks_collect(3, [&](Group& group) {
    auto specs = hybrid_model();
    if (group.rank() == 1) specs[2].shape = {16, 17};
    auto named = make_params(specs);
    LayerwiseOptimizer opt(named, group, make_hybrid);
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find("same named parameters"), std::string::npos) << r << ": " << errors[r];
  }
}

TEST(Layerwise, GradientsOnSomeRanksOnlyFailEverywhereAndChangeNothing) {
  // Rank 1 has no gradient at all (its backward was skipped), then one
  // parameter without a gradient on rank 1 only: each rank owns some
  // parameters, so a rank without a gradient would drop the update of what
  // it owns while the others step on. Every rank raises, naming the first
  // parameter that differs, and nothing changes on any rank.
  for (const int missing : {-1, 4}) {
    std::vector<std::vector<at::Tensor>> before(2), after(2);
    const auto errors = muon::test::run_ranks_collect(2, [&](Group& group) {
      auto named = make_params(hybrid_model());
      LayerwiseOptimizer opt(named, group, make_hybrid);
      set_grads(named, 0);
      if (group.rank() == 1) {
        int i = 0;
        for (auto& item : named) {
          if (missing < 0 || i == missing) item.value().mutable_grad() = at::Tensor();
          ++i;
        }
      }
      const auto r = static_cast<size_t>(group.rank());
      for (const auto& item : named) before[r].push_back(item.value().detach().clone());
      try {
        opt.step();
      } catch (...) {
        for (const auto& item : named) after[r].push_back(item.value().detach().clone());
        throw;
      }
    });
    const std::string first = missing < 0 ? "wte.weight" : hybrid_model()[4].name;
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_NE(errors[r].find("parameter '" + first + "' has "), std::string::npos)
          << r << ": " << errors[r];
      EXPECT_NE(errors[r].find("for the same parameters"), std::string::npos) << errors[r];
      EXPECT_LT(errors[r].size(), 500u) << errors[r];
      ASSERT_EQ(after[r].size(), before[r].size()) << "rank " << r << " did not raise";
      for (size_t i = 0; i < before[r].size(); ++i) {
        EXPECT_TRUE(at::equal(before[r][i], after[r][i])) << "rank " << r << " parameter " << i;
      }
    }
  }
}

TEST(Layerwise, OptionErrors) {
  muon::test::run_ranks(1, [&](Group& group) {
    auto named = make_params(hybrid_model());
    EXPECT_THROW(LayerwiseOptimizer(named, group, make_hybrid, LayerwiseOptions().bucket_bytes(0)),
                 c10::ValueError);
    EXPECT_THROW(LayerwiseOptimizer(named, group, make_hybrid, LayerwiseOptions().max_in_flight(-1)),
                 c10::ValueError);
    EXPECT_THROW(LayerwiseOptimizer(named, Group(), make_hybrid), c10::ValueError);
  });
}

TEST(Layerwise, SchedulersSeeTheInnerGroups) {
  muon::test::run_ranks(2, [&](Group& group) {
    auto named = make_params(hybrid_model());
    LayerwiseOptimizer opt(named, group, make_hybrid);
    ASSERT_NE(opt.inner(), nullptr);
    // The inner groups, then the other ranks' parameters.
    ASSERT_EQ(opt.param_groups().size(), opt.inner()->param_groups().size() + 1);
    for (auto& g : opt.param_groups()) g.options().set_lr(g.options().get_lr() * 0.5);
    set_grads(named, 0);
    opt.step();
    for (size_t i = 0; i < opt.inner()->param_groups().size(); ++i) {
      EXPECT_EQ(opt.inner()->param_groups()[i].options().get_lr(),
                opt.param_groups()[i].options().get_lr());
    }
  });
}

TEST(Layerwise, ZeroGradClearsEveryGradientAndBackwardAccumulationWorks) {
  // Gradients come from backward (which accumulates): after zero_grad every
  // parameter's gradient, owned or not, must be cleared, or the next
  // all-reduce would mix in old gradients.
  const auto specs = hybrid_model();
  auto loss_of = [](const Named& named, int64_t step) {
    at::Tensor loss = at::zeros({}, at::kFloat);
    size_t i = 0;
    for (const auto& item : named) {
      loss = loss + (item.value() * seeded_randn(item.value().sizes().vec(), 31 * (step + 1) + i++)).sum();
    }
    return loss;
  };
  auto reference = make_params(specs);
  {
    auto opt = make_hybrid(reference);
    for (int64_t s = 0; s < 3; ++s) {
      opt->zero_grad();
      loss_of(reference, s).backward();
      opt->step();
    }
  }
  muon::test::run_ranks(2, [&](Group& group) {
    auto named = make_params(specs);
    LayerwiseOptimizer opt(named, group, make_hybrid);
    for (int64_t s = 0; s < 3; ++s) {
      opt.zero_grad();
      for (const auto& item : named) {
        if (item.value().grad().defined()) {
          EXPECT_EQ(item.value().grad().abs().max().item<double>(), 0.0) << item.key();
        }
      }
      loss_of(named, s).backward();
      opt.step();
    }
    EXPECT_LE(max_relative_difference(named, reference), 1e-5);
  });
}

TEST(Layerwise, OptimizerStateBytesIsTheInnerOptimizers) {
  const auto specs = hybrid_model();
  std::mutex mu;
  std::vector<int64_t> bytes(2);
  muon::test::run_ranks(2, [&](Group& group) {
    auto named = make_params(specs);
    LayerwiseOptimizer opt(named, group, make_hybrid);
    set_grads(named, 0);
    opt.step();
    const torch::optim::Optimizer& as_optimizer = opt;
    ASSERT_NE(opt.inner(), nullptr);
    EXPECT_GT(muon::optimizer_state_bytes(as_optimizer), 0);
    EXPECT_EQ(muon::optimizer_state_bytes(as_optimizer), muon::optimizer_state_bytes(*opt.inner()));
    std::lock_guard<std::mutex> lock(mu);
    bytes[static_cast<size_t>(group.rank())] = muon::optimizer_state_bytes(as_optimizer);
  });
  // Together the ranks hold the single-process hybrid's state.
  auto named = make_params(specs);
  auto single = make_hybrid(named);
  set_grads(named, 0);
  single->step();
  EXPECT_EQ(bytes[0] + bytes[1], muon::optimizer_state_bytes(*single));
}

TEST(AllReduceGradients, AveragesOverRanks) {
  muon::test::run_ranks(3, [&](Group& group) {
    auto a = at::zeros({5, 3}).set_requires_grad(true);
    auto b = at::zeros({7}, at::kDouble).set_requires_grad(true);
    a.mutable_grad() = at::full({5, 3}, static_cast<double>(group.rank()));
    b.mutable_grad() = at::full({7}, 2.0 * group.rank(), at::kDouble);
    muon::distributed::all_reduce_gradients({a, b}, group, /*bucket_bytes=*/16);
    EXPECT_TRUE(at::allclose(a.grad(), at::full({5, 3}, 1.0)));  // (0 + 1 + 2) / 3
    EXPECT_TRUE(at::allclose(b.grad(), at::full({7}, 2.0, at::kDouble)));
    auto c = at::zeros({2}).set_requires_grad(true);
    EXPECT_THROW(muon::distributed::all_reduce_gradients({c}, group), c10::ValueError);
  });
}

}  // namespace
