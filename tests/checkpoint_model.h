#pragma once
// The small model of the checkpoint tests and of tests/distributed/checkpoint_writer:
// one rank's parameters and optimizer in a layout, trained on seeded
// gradients of the whole model (each rank takes its part), saved and loaded
// with muon::distributed checkpoints.
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <tuple>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist_util.h"
#include "expect_util.h"
#include "muon/config.h"
#include "muon/distributed/checkpoints/checkpoint.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/optim/composite.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test::checkpoint {

using muon::OptimizerConfig;
using muon::distributed::CheckpointOptions;
using muon::distributed::DistributedLayout;
using muon::distributed::Group;
using Named = torch::OrderedDict<std::string, at::Tensor>;

/// A matrix "w" (8, 4) and a bias "b" (8), leaves drawn from the global
/// generator in that order: the model of the tests that build an optimizer
/// from a config.
inline Named matrix_and_bias() {
  Named named;
  named.insert("w", leaf(at::randn({8, 4})));
  named.insert("b", leaf(at::randn({8})));
  return named;
}

/// Part `name` of `opt`, built over matrix_and_bias() `named` in two parts:
/// a T whose one group holds "w" alone. nullptr, after a failure, otherwise.
template <typename T, typename Composite>
T* part_holding_w(Composite& opt, const std::string& name, Named& named) {
  EXPECT_EQ(opt.num_parts(), 2u);
  auto* part = dynamic_cast<T*>(opt.find_part(name));
  EXPECT_NE(part, nullptr) << name;
  if (part == nullptr) return nullptr;
  const auto& params = part->param_groups()[0].params();
  EXPECT_EQ(params.size(), 1u) << name;
  if (params.size() != 1) return nullptr;
  EXPECT_TRUE(params[0].is_same(named["w"])) << name;
  return part;
}

// Matrices go to Muon, vectors and embeddings to AdamW (the hybrid).
inline const std::vector<std::pair<std::string, std::vector<int64_t>>> kModel{
    {"wte.weight", {40, 16}},       {"blocks.0.qkv.weight", {48, 16}}, {"blocks.0.norm.weight", {16}},
    {"blocks.0.fc1.weight", {64, 16}}, {"blocks.0.fc1.bias", {64}},    {"blocks.0.fc2.weight", {16, 64}},
    {"lm_head.weight", {40, 16}}};

inline at::Tensor full_param(size_t k) { return muon::test::seeded_randn(kModel[k].second, 10 + k); }
inline at::Tensor full_grad(size_t k, int64_t step) { return muon::test::seeded_randn(kModel[k].second, 500 + 13 * step + k); }

// `optimizer` is a registry name, "adaptive_muon/<mode>" for AdaptiveMuon in
// that mode, or "dion/<rank_fraction>" for Dion at that rank fraction; a
// suffix "@<hook>" puts every parameter under that weight_update_hook
// (hyperball at radius 3).
inline OptimizerConfig config(const std::string& layout, const std::string& spec = "muon") {
  OptimizerConfig c;
  const auto at = spec.find('@');
  const auto optimizer = spec.substr(0, at);
  if (at != std::string::npos) {
    c.set("weight_update_hook", spec.substr(at + 1)).set("weight_update_hook_radius", 3.0);
  }
  const auto slash = optimizer.find('/');
  const auto name = optimizer.substr(0, slash);
  // Iso has no weight decay.
  c.set("optimizer", name).set("lr", 0.02).set("weight_decay", name == "iso" ? 0.0 : 0.1).set("layout", layout);
  if (slash != std::string::npos && name == "dion") {
    c.set("dion_rank_fraction", std::stod(optimizer.substr(slash + 1)));
  } else if (slash != std::string::npos) {
    c.set("adaptive_muon_mode", optimizer.substr(slash + 1));
  }
  return c;
}

// One rank's model and optimizer in a layout: "none" (whole, one process),
// "layerwise" (whole, one owner per parameter), "sharded" (every tensor's
// rows split over the ranks), "padded" (the same, flat-buffer style), "tp" (the block's matrices split over the
// ranks along dim 0 (qkv, fc1) or dim 1 (fc2); the rest replicated), "2d"
// (a (dp, tp = 2) mesh: the block's TP blocks split by rows over dp, the
// rest split by rows over dp).
struct Rank {
  Named named;
  DistributedLayout layout;
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::vector<std::function<at::Tensor(const at::Tensor&)>> local;  // whole → this rank's part
  CheckpointOptions options;

  /// The model: kModel, plus a vector "extra.bias" of `extra` elements when
  /// `extra` > 0 (bulk for the kill loop's files; it goes to AdamW).
  std::vector<std::pair<std::string, std::vector<int64_t>>> model = kModel;

  Rank(const std::string& kind, const Group& group, const std::string& optimizer = "muon", int64_t extra = 0) {
    if (extra > 0) model.emplace_back("extra.bias", std::vector<int64_t>{extra});
    const int world = group.size();
    const int rank = group.rank();
    // 2-D: a (dp, tp) mesh, tp = 2.
    Group dp;
    Group tp;
    if (kind == "2d") std::tie(dp, tp) = group.mesh(world / 2, 2);
    for (size_t k = 0; k < model.size(); ++k) {
      const auto& [name, shape] = model[k];
      std::function<at::Tensor(const at::Tensor&)> part = [](const at::Tensor& t) { return t; };
      const bool block = name.find("blocks.0.") == 0 && shape.size() == 2;
      if (kind == "sharded" || kind == "padded") {
        // padded: flat-buffer style, equal chunks with padding rows at the
        // tail (at 5 ranks the 16-row tensors leave rank 4 only padding).
        const auto rows = kind == "sharded" ? muon::distributed::balanced_split_sizes(shape[0], world)
                                            : std::vector<int64_t>(static_cast<size_t>(world),
                                                                   (shape[0] + world - 1) / world);
        part = [rows, rank](const at::Tensor& t) { return muon::distributed::local_rows(t, rows, rank); };
        layout.row_shards.emplace(name, muon::distributed::RowShard(shape, group));
      } else if (kind == "tp" && block) {
        const int64_t dim = name.find("fc2") != std::string::npos ? 1 : 0;
        const auto sizes = muon::distributed::balanced_split_sizes(shape[static_cast<size_t>(dim)], world);
        const auto offset = muon::distributed::split_offset(sizes, rank);
        part = [dim, offset, sizes, rank](const at::Tensor& t) {
          return t.narrow(dim, offset, sizes[static_cast<size_t>(rank)]).contiguous();
        };
        layout.tensor_parallel.emplace(name, muon::distributed::TensorParallelShard(shape, dim, group));
      } else if (kind == "2d") {
        // Block matrices: the TP block (as "tp", over tp), then its rows over
        // dp; the rest: rows over dp (the same on both TP ranks).
        const int64_t dim = !block ? 0 : name.find("fc2") != std::string::npos ? 1 : 0;
        const auto tp_sizes = muon::distributed::balanced_split_sizes(shape[static_cast<size_t>(dim)], block ? 2 : 1);
        const auto tp_rank = block ? tp.rank() : 0;
        const auto offset = muon::distributed::split_offset(tp_sizes, tp_rank);
        auto block_shape = shape;
        block_shape[static_cast<size_t>(dim)] = tp_sizes[static_cast<size_t>(tp_rank)];
        const auto rows = muon::distributed::balanced_split_sizes(block_shape[0], dp.size());
        const auto dp_rank = dp.rank();
        part = [dim, offset, block_shape, rows, dp_rank](const at::Tensor& t) {
          const auto b = t.narrow(dim, offset, block_shape[static_cast<size_t>(dim)]);
          return muon::distributed::local_rows(b.contiguous(), rows, dp_rank);
        };
        auto shard = muon::distributed::RowShard(block_shape, dp);
        if (block) {
          shard.tensor_parallel(muon::distributed::TensorParallelShard(shape, dim, tp),
                                muon::distributed::TensorParallelMode::kDistributed);
        }
        layout.row_shards.emplace(name, shard);
      }
      local.push_back(part);
      named.insert(name, part(muon::test::seeded_randn(model[k].second, 10 + k)).requires_grad_(true));
    }
    layout.group = group;
    options.group(group);
    const auto layout_field = kind == "tp" ? "tensor_parallel" : kind == "2d" || kind == "padded" ? "sharded" : kind;
    opt = muon::distributed::make_optimizer(named, config(layout_field, optimizer), layout);
  }

  // Steps [from, to) with the whole model's gradients, each rank its part.
  void train(int64_t from, int64_t to) {
    for (int64_t s = from; s < to; ++s) {
      for (size_t k = 0; k < model.size(); ++k) named[model[k].first].mutable_grad() = local[k](muon::test::seeded_randn(model[k].second, 500 + 13 * s + static_cast<int64_t>(k)));
      opt->step();
    }
  }

  std::string save(const std::string& dir, int64_t step, int64_t keep = 2) {
    auto o = options;
    return muon::distributed::save_checkpoint(dir, named, *opt, step, layout, "extra " + std::to_string(step),
                                       o.keep(keep));
  }
  muon::distributed::CheckpointInfo load(const std::string& dir) {
    return muon::distributed::load_checkpoint(dir, named, *opt, layout, options);
  }
};

// One leg of a reshard chain: a fresh `optimizer` in `kind` at `world`
// ranks, loaded from the checkpoint in `in` (none when empty; it holds step
// `from`), trained on steps [from, to) and saved to `out`; then `check` on
// every rank, when given.
inline void reshard_leg(const std::string& kind, int world, const std::string& in, const std::string& out,
                        int64_t from, int64_t to, const std::string& optimizer, const std::string& what,
                        const std::function<void(Rank&, const Group&)>& check = nullptr) {
  muon::test::run_ranks(world, [&](Group& group) {
    Rank r(kind, group, optimizer);
    if (!in.empty()) {
      EXPECT_EQ(r.load(in).step, from) << what;
    }
    r.train(from, to);
    r.save(out, to);
    if (check) check(r, group);
  });
}

// ---- the harness of "an optimizer in every layout, and its checkpoints" ----

/// The parameter values of `r`, cloned.
inline Named values_of(const Rank& r) {
  Named out;
  for (const auto& item : r.named) out.insert(item.key(), item.value().detach().clone());
  return out;
}

/// Expects each of `r`'s parameters to be its part of `reference` (one
/// process's whole values; nothing when it is empty): bit for bit when
/// `tolerance` is 0, else (parts that are not empty) within `tolerance` of
/// the largest |value| of the whole parameter. `rank` names the rank.
inline void expect_parts_equal(Rank& r, const Named& reference, const std::string& what, int rank,
                               double tolerance = 0) {
  for (size_t k = 0; k < r.model.size() && !reference.is_empty(); ++k) {
    const auto& name = r.model[k].first;
    const auto got = r.named[name].detach();
    const auto want = r.local[k](reference[name]);
    if (tolerance == 0) {
      EXPECT_TRUE(at::equal(got, want)) << what << " " << name << " rank " << rank;
    } else if (want.numel() > 0) {
      const double err = (got - want).abs().max().item<double>() / reference[name].abs().max().item<double>();
      EXPECT_LE(err, tolerance) << what << " " << name << " rank " << rank;
    }
  }
}

/// make_optimizer over matrix_and_bias() from the JSON config `json`, and
/// its part `name`, an Opt that holds the matrix "w" alone (nullptr, after
/// a failure, otherwise): the fixture of the tests that build an optimizer
/// from its config fields.
template <typename Opt, typename Options>
struct BuiltFromConfig {
  BuiltFromConfig(const std::string& name, const std::string& json) {
    apply_config_json(config, json);
    opt = muon::make_optimizer(named, config);
    part = part_holding_w<Opt>(*opt, name, named);
  }
  /// The part's options (part not nullptr).
  const Options& options() const { return static_cast<const Options&>(part->param_groups()[0].options()); }
  /// One step of every parameter with a gradient of ones; then explain's
  /// text for the model and the config.
  std::string step_and_explain() {
    for (auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
    opt->step();
    return muon::explain(named, config);
  }

  Named named = matrix_and_bias();
  OptimizerConfig config;
  std::unique_ptr<CompositeOptimizer> opt;
  Opt* part = nullptr;
};

/// One process trains `optimizer` through each step of `at` (ascending) in
/// turn: its values after each, by step; then `check(r)`, when given.
inline std::map<int64_t, Named> one_process_after(const std::string& optimizer, const std::vector<int64_t>& at,
                                                  const std::function<void(Rank&)>& check = nullptr) {
  std::map<int64_t, Named> after;
  muon::test::run_ranks(1, [&](Group& g) {
    Rank r("none", g, optimizer);
    int64_t done = 0;
    for (const int64_t s : at) {
      r.train(done, s);
      done = s;
      after[s] = values_of(r);
    }
    if (check) check(r);
  });
  return after;
}

/// `optimizer` in each layout (kind, world) trained `steps` steps equals one
/// process's `single` (parts, bit for bit; within `tolerance(kind)` of the
/// largest |value| where that is given and not 0); `built(r, kind)`, when
/// given, checks each rank's optimizer before it trains.
inline void expect_layouts_equal(const std::string& optimizer, int64_t steps, const Named& single,
                                 const std::vector<std::pair<std::string, int>>& layouts, const std::string& what,
                                 const std::function<void(Rank&, const std::string&)>& built = nullptr,
                                 const std::function<double(const std::string&)>& tolerance = nullptr) {
  for (const auto& [kind, world] : layouts) {
    muon::test::run_ranks(world, [&, kind = kind, world = world](Group& g) {
      Rank r(kind, g, optimizer);
      if (built) built(r, kind);
      r.train(0, steps);
      expect_parts_equal(r, single, what + " " + kind + " W=" + std::to_string(world), g.rank(),
                         tolerance ? tolerance(kind) : 0.0);
    });
  }
}

/// The layouts an owner-compute optimizer is checked in: layer-wise at 2
/// and 3 ranks, sharded at 2, 3 and 4, and padded rows at 3.
inline const std::vector<std::pair<std::string, int>> kOwnerComputeLayouts{
    {"layerwise", 2}, {"layerwise", 3}, {"sharded", 2}, {"sharded", 3}, {"sharded", 4}, {"padded", 3}};

/// `optimizer` through make_optimizer in each of `layouts`, trained `steps`
/// steps, equals one process (expect_layouts_equal, within `tolerance`), and
/// every layout but layerwise steps the matrices with `Sharded`, the part of
/// the composite named `optimizer`.
template <typename Sharded>
void expect_owner_compute_layouts(const std::string& optimizer, int64_t steps,
                                  const std::vector<std::pair<std::string, int>>& layouts = kOwnerComputeLayouts,
                                  const std::function<double(const std::string&)>& tolerance = nullptr) {
  expect_layouts_equal(
      optimizer, steps, one_process_after(optimizer, {steps}).at(steps), layouts, optimizer,
      [&](Rank& r, const std::string& kind) {
        if (kind == "layerwise") return;
        auto* composite = dynamic_cast<CompositeOptimizer*>(r.opt.get());
        ASSERT_NE(composite, nullptr) << optimizer << " " << kind;
        EXPECT_NE(dynamic_cast<Sharded*>(composite->find_part(optimizer)), nullptr) << optimizer << " " << kind;
      },
      tolerance);
}

/// Group::bytes_sent of one optimizer step (the 4th) on rank 0 of the
/// model in layout `kind` at `world` ranks, with `optimizer` for its matrices.
inline int64_t bytes_of_step(const std::string& optimizer, const std::string& kind, int world) {
  int64_t bytes = 0;
  run_ranks(world, [&](distributed::Group& g) {
    Rank r(kind, g, optimizer);
    r.train(0, 3);
    g.reset_bytes_sent();
    r.train(3, 4);
    if (g.rank() == 0) bytes = g.bytes_sent();
  });
  return bytes;
}

/// A leg of a reshard chain: `kind` at `world` ranks trains to step `to`;
/// its parts must equal one process after `to` (when that is known) within
/// `tolerance` (0: bit for bit).
struct Leg {
  std::string kind;
  int world;
  int64_t to;
  std::string what;
  double tolerance = 0;
};

/// The legs in turn, each a fresh `optimizer` loaded from the last one's
/// checkpoint (the first from none, at step 0), trained to its step and
/// saved, compared with `after` (one process's values by step; a step not
/// there is not compared). The checkpoints go to a temporary directory
/// named by `tag`, removed before and after.
inline void reshard_chain(const std::string& optimizer, const std::string& tag, const std::vector<Leg>& legs,
                          const std::map<int64_t, Named>& after) {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("muon_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string in;
  int64_t from = 0;
  for (size_t i = 0; i < legs.size(); ++i) {
    const auto& l = legs[i];
    const auto out = (dir / std::to_string(i)).string();
    const auto found = after.find(l.to);
    const Named reference = found == after.end() ? Named() : found->second;
    reshard_leg(l.kind, l.world, in, out, from, l.to, optimizer, l.what, [&](Rank& r, const Group& group) {
      expect_parts_equal(r, reference, l.what, group.rank(), l.tolerance);
    });
    in = out;
    from = l.to;
  }
  fs::remove_all(dir);
}

/// The reshard chain of an optimizer with an owner-compute sharded layout:
/// sharded 2 → one process → sharded 3 → layer-wise 2, each leg against one
/// process within `tolerance` (0: bit for bit).
inline void owner_compute_reshard_chain(const std::string& optimizer, double tolerance = 0) {
  reshard_chain(optimizer, optimizer + "_chain",
                {{"sharded", 2, 2, optimizer + " sharded W=2", tolerance},
                 {"none", 1, 3, optimizer + " single from sharded W=2", tolerance},
                 {"sharded", 3, 5, optimizer + " sharded W=3 from single", tolerance},
                 {"layerwise", 2, 6, optimizer + " layerwise W=2 from sharded W=3", tolerance}},
                one_process_after(optimizer, {2, 3, 5, 6}));
}

/// The layouts that split the whole matrices `optimizer` needs refuse it,
/// naming it: tensor_parallel at 2 ranks (unless `in_tensor_parallel`, where
/// it runs) and the 2-D layout at 4; and Sharded, built over Options
/// `options` in the `replicated` mode, raises naming `who`, `named` (the
/// optimizer the options are) and owner_compute.
template <typename Sharded, typename Options>
void expect_splitting_layouts_refused(const std::string& optimizer, const std::string& who, const Options& options,
                                      const std::string& named, bool in_tensor_parallel = false) {
  run_ranks(2, [&](distributed::Group& g) {
    if (!in_tensor_parallel) {
      expect_value_error([&] { Rank r("tp", g, optimizer); }, {"'" + optimizer + "'", "'tensor_parallel'"});
    }
    auto p = leaf(at::randn({3, 4}));
    expect_value_error(
        [&] {
          Sharded opt({p}, {distributed::RowShard({6, 4}, g)}, options,
                      distributed::ShardedOptions().mode("replicated"));
        },
        {who, "'" + named + "'", "owner_compute", "'replicated'"});
  });
  run_ranks(4, [&](distributed::Group& g) {
    expect_value_error([&] { Rank r("2d", g, optimizer); }, {"'" + optimizer + "'", "2-D"});
  });
}

}  // namespace muon::test::checkpoint
