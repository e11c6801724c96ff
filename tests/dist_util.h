#pragma once
// Multi-rank tests with ranks as threads: N threads share one c10d::HashStore,
// each builds its own muon::distributed::Group (real Gloo process groups over TCP
// loopback) and runs the test body. Exceptions thrown on a rank are
// collected and reported with the rank that threw them.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/ordered_dict.h>

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "muon/distributed/layouts/row_shard.h"
#include "muon/distributed/runtime/group.h"

namespace muon::test {

/// A standard-normal fp32 tensor from its own generator seeded by `seed`:
/// the same values on every thread rank, without the global generator.
inline at::Tensor seeded_randn(const std::vector<int64_t>& shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions(at::kFloat));
}

/// A parameter of a test model: its name and shape.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
};

/// Fresh parameters requiring grad, by name, identical on every thread rank:
/// parameter k is seeded_randn(its shape, seed + k).
inline torch::OrderedDict<std::string, at::Tensor> seeded_params(const std::vector<ParamSpec>& specs,
                                                                 uint64_t seed) {
  torch::OrderedDict<std::string, at::Tensor> named;
  for (size_t k = 0; k < specs.size(); ++k) {
    named.insert(specs[k].name, seeded_randn(specs[k].shape, seed + k).requires_grad_(true));
  }
  return named;
}

/// This rank's rows `rows_per_rank[rank]` of `whole` (muon::distributed::local_rows),
/// or `whole` itself when `rows_per_rank` is empty (a tensor not split).
inline at::Tensor rows_or_whole(const at::Tensor& whole, const std::vector<int64_t>& rows_per_rank,
                                int rank) {
  return rows_per_rank.empty() ? whole : distributed::local_rows(whole, rows_per_rank, rank);
}

/// Timeout of thread-rank groups: short, so a hang fails the test quickly.
constexpr std::chrono::milliseconds kThreadRankTimeout{std::chrono::seconds(30)};

/// What each rank threw (empty string: returned normally), by rank.
using RankErrors = std::vector<std::string>;

/// Runs `body(group)` on `world` thread ranks over a shared HashStore and
/// returns each rank's exception message (empty when it returned). Every
/// thread is joined before returning; the store outlives all of them.
inline RankErrors run_ranks_collect(int world, const std::function<void(distributed::Group&)>& body,
                                    distributed::GroupOptions options = distributed::GroupOptions().timeout(
                                        kThreadRankTimeout)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  RankErrors errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto group = distributed::Group::create(store, r, world, options);
        body(group);
      } catch (const c10::Error& e) {
        errors[static_cast<size_t>(r)] = e.what_without_backtrace();
        if (errors[static_cast<size_t>(r)].empty()) errors[static_cast<size_t>(r)] = "c10::Error";
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        if (errors[static_cast<size_t>(r)].empty()) errors[static_cast<size_t>(r)] = "exception";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

/// As run_ranks_collect, failing the current test for every rank that threw.
inline void run_ranks(int world, const std::function<void(distributed::Group&)>& body,
                      distributed::GroupOptions options = distributed::GroupOptions().timeout(
                          kThreadRankTimeout)) {
  const auto errors = run_ranks_collect(world, body, options);
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_TRUE(errors[r].empty()) << "rank " << r << " of " << world << " threw: " << errors[r];
  }
}

}  // namespace muon::test
