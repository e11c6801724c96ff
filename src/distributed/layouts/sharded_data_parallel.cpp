// Sharded data parallelism (ZeRO-2): this rank's rows of every parameter,
// bucketed reduce-scatter by all-to-all, bucketed all-gather; and
// ShardedDataParallel, the sharded Layout built from a data-parallel group.
#include "muon/distributed/layouts/sharded_data_parallel.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <utility>

#include "distributed/layouts/pipeline.h"
#include "distributed/layouts/row_shards.h"
#include "distributed/runtime/agreement.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"
#include "util/names.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedDataParallel] ";

// Low-precision gradients are summed in fp32.
at::ScalarType accumulate_type(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

}  // namespace

namespace detail {

RowShards::RowShards(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                     const Group& dp, const TensorParallelShards& tensor_parallel,
                     TensorParallelMode tp_mode, int64_t bucket_bytes, const char* who)
    : who_(who), params_(named_parameters) {
  TORCH_CHECK_VALUE(dp.valid(), who_, "the data-parallel group is invalid (default-constructed); "
                    "pass one, e.g. muon::distributed::init_from_env() or the first group of Group::mesh");
  TORCH_CHECK_VALUE(bucket_bytes >= 1, who_, "bucket_bytes must be >= 1, got ", bucket_bytes);
  for (const auto& item : named_parameters) {
    const auto& p = item.value();
    TORCH_CHECK_VALUE(p.defined(), who_, "parameter '", muon::detail::clip(item.key()), "' is undefined");
    TORCH_CHECK_VALUE(p.dim() >= 1, who_, "parameter '", muon::detail::clip(item.key()),
                      "' is 0-d (a scalar); rows cannot be split: give it shape [1]");
  }
  for (const auto& entry : tensor_parallel) {
    TORCH_CHECK_VALUE(named_parameters.contains(entry.first), who_, "tensor_parallel names '",
                      muon::detail::clip(entry.first), "', which is not one of the ", named_parameters.size(),
                      " parameters");
  }
  const int world = dp.size();
  const int rank = dp.rank();
  check_ranks_agree(dp, detail::parameter_items(named_parameters), who_,
                    "every rank of the data-parallel group must pass the same named parameters "
                    "(names, shapes, dtypes, order)");
  check_ranks_agree(dp, detail::value_items(named_parameters), who_,
                    "data-parallel replicas must start equal: broadcast them from rank 0 "
                    "(muon::distributed::broadcast_parameters) first");

  layout_.group = dp;
  at::NoGradGuard no_grad;
  for (const auto i : c10::irange(named_parameters.size())) {
    const auto& name = named_parameters[i].key();
    const auto& p = named_parameters[i].value();
    auto rows = balanced_split_sizes(p.size(0), world);
    std::vector<int64_t> offsets;
    for (const auto r : c10::irange(world)) offsets.push_back(split_offset(rows, r));
    auto shard = local_rows(p.detach(), rows, rank);
    shard.set_requires_grad(p.requires_grad());
    shards_.insert(name, shard);
    RowShard row_shard(p.sizes().vec(), dp);
    const auto tp = tensor_parallel.find(name);
    if (tp != tensor_parallel.end()) row_shard.tensor_parallel(tp->second, tp_mode);
    layout_.row_shards.emplace(name, std::move(row_shard));
    const auto rest = p.sizes().slice(1);
    row_numel_.push_back(std::accumulate(rest.begin(), rest.end(), int64_t{1}, std::multiplies<>()));
    rows_.push_back(std::move(rows));
    offsets_.push_back(std::move(offsets));
    index_.emplace(name, i);
  }

  // Buckets: parameters in order, by dtype and device, each up to bucket_bytes.
  std::vector<std::pair<std::string, size_t>> open;  // (dtype and device, bucket index)
  std::vector<int64_t> filled;
  for (const auto i : c10::irange(params_.size())) {
    const auto& p = params_[i].value();
    const auto key = c10::str(p.scalar_type(), "@", p.device());
    const auto bytes = static_cast<int64_t>(p.nbytes());
    auto it = std::find_if(open.begin(), open.end(), [&](const auto& o) { return o.first == key; });
    if (it == open.end() || filled[it->second] + bytes > bucket_bytes) {
      buckets_.push_back({});
      filled.push_back(0);
      if (it == open.end()) {
        it = open.insert(open.end(), {key, buckets_.size() - 1});
      } else {
        it->second = buckets_.size() - 1;
      }
    }
    buckets_[it->second].members.push_back(i);
    filled[it->second] += bytes;
  }

}

size_t RowShards::index_of(const std::string& name) const {
  const auto it = index_.find(name);
  TORCH_CHECK_VALUE(it != index_.end(), who_, "no parameter named '", muon::detail::clip(name), "' (there are ",
                    params_.size(), ")");
  return it->second;
}

const std::vector<int64_t>& RowShards::rows_per_rank(const std::string& name) const {
  return rows_[index_of(name)];
}

int64_t RowShards::row_offset(const std::string& name) const {
  return offsets_[index_of(name)][static_cast<size_t>(group().rank())];
}

int64_t RowShards::shard_bytes() const {
  int64_t bytes = 0;
  for (const auto& item : shards_) bytes += static_cast<int64_t>(item.value().nbytes());
  return bytes;
}

void RowShards::clear_shard_grads() {
  for (auto& item : shards_) item.value().mutable_grad() = at::Tensor();
}

void RowShards::reduce_scatter(const std::vector<bool>& active) {
  const auto world = static_cast<size_t>(group().size());
  const auto me = static_cast<size_t>(group().rank());
  struct InFlight {
    std::vector<size_t> members;
    int64_t recv = 0;  // elements of my rows of the members
  };
  std::vector<InFlight> stages(buckets_.size());
  auto start = [&](size_t k) -> PendingCollective {
    auto& f = stages[k];
    for (const auto i : buckets_[k].members) {
      if (active[i]) f.members.push_back(i);
    }
    std::vector<int64_t> send(world, 0);
    std::vector<at::Tensor> pieces;
    for (const auto r : c10::irange(world)) {
      for (const auto i : f.members) {
        const auto rows = rows_[i][r];
        send[r] += rows * row_numel_[i];
        if (rows * row_numel_[i] > 0) {
          pieces.push_back(params_[i].value().grad().detach().narrow(0, offsets_[i][r], rows).reshape({-1}));
        }
      }
    }
    for (const auto i : f.members) f.recv += rows_[i][me] * row_numel_[i];
    const auto total = std::accumulate(send.begin(), send.end(), int64_t{0});
    if (total == 0) return {};  // nothing to exchange on any rank (all agree)
    const auto& first = params_[f.members.front()].value();
    const auto input = pieces.empty() ? at::empty({0}, first.options().requires_grad(false))
                                      : at::cat(pieces);
    return group().all_to_all_async(input, send, std::vector<int64_t>(world, f.recv));
  };
  auto finish = [&](size_t k, const std::vector<at::Tensor>& results) {
    const auto& f = stages[k];
    at::Tensor sum;
    if (!results.empty()) {
      const auto& received = results.at(0);
      const auto type = received.scalar_type();
      // Every rank's copy of my rows, summed in rank order, then averaged.
      sum = received.narrow(0, 0, f.recv).to(accumulate_type(type), /*non_blocking=*/false, /*copy=*/true);
      for (const auto r : c10::irange(size_t{1}, world)) {
        sum.add_(received.narrow(0, static_cast<int64_t>(r) * f.recv, f.recv));
      }
      sum.div_(static_cast<double>(world));
      sum = sum.to(type);
    }
    int64_t pos = 0;
    for (const auto i : f.members) {
      auto& shard = shards_[i].value();
      const auto n = rows_[i][me] * row_numel_[i];
      shard.mutable_grad() = n > 0 ? sum.narrow(0, pos, n).view(shard.sizes()) : at::zeros_like(shard);
      pos += n;
    }
  };
  // The next bucket's all-to-all runs while this one is summed.
  detail::run_pipeline(buckets_.size(), /*depth=*/1, start, finish);
}

void RowShards::all_gather(const std::vector<bool>& active) {
  const auto world = static_cast<size_t>(group().size());
  const auto me = static_cast<size_t>(group().rank());
  std::vector<std::vector<size_t>> members(buckets_.size());
  auto start = [&](size_t k) -> PendingCollective {
    auto& f = members[k];
    for (const auto i : buckets_[k].members) {
      if (active[i]) f.push_back(i);
    }
    // Ranks hold different numbers of rows: every rank pads to the largest.
    int64_t largest = 0;
    for (const auto r : c10::irange(world)) {
      int64_t count = 0;
      for (const auto i : f) count += rows_[i][r] * row_numel_[i];
      largest = std::max(largest, count);
    }
    if (largest == 0) return {};
    const auto& first = shards_[f.front()].value();
    auto buffer = at::zeros({largest}, first.options().requires_grad(false));
    int64_t pos = 0;
    for (const auto i : f) {
      const auto n = rows_[i][me] * row_numel_[i];
      if (n > 0) buffer.narrow(0, pos, n).copy_(shards_[i].value().detach().reshape({-1}));
      pos += n;
    }
    return group().all_gather_async(buffer);
  };
  auto finish = [&](size_t k, const std::vector<at::Tensor>& gathered) {
    if (gathered.empty()) return;
    for (const auto r : c10::irange(world)) {
      int64_t pos = 0;
      for (const auto i : members[k]) {
        const auto rows = rows_[i][r];
        const auto n = rows * row_numel_[i];
        if (n == 0) continue;
        auto target = params_[i].value().detach().narrow(0, offsets_[i][r], rows);
        target.copy_(gathered[r].narrow(0, pos, n).view(target.sizes()));
        pos += n;
      }
    }
  };
  at::NoGradGuard no_grad;
  detail::run_pipeline(buckets_.size(), /*depth=*/1, start, finish);
}

}  // namespace detail

namespace {

OptimizerConfig sharded_config(const OptimizerConfig& config) {
  const auto& kind = config.get_string("layout");
  TORCH_CHECK_VALUE(kind == "none" || kind == "sharded", kWho, "config field 'layout' is '",
                    muon::detail::clip(kind), "'; ShardedDataParallel builds the 'sharded' layout itself: "
                    "leave it 'none' or 'sharded'");
  auto out = config;
  out.set("layout", "sharded");
  return out;
}

LayoutGroups sharded_groups(const Group& dp, TensorParallelShards tensor_parallel,
                            const ShardedDataParallelOptions& options) {
  TORCH_CHECK_VALUE(dp.valid(), kWho, "dp is invalid (default-constructed); pass the data-parallel "
                    "group, e.g. muon::distributed::init_from_env() or the first group of Group::mesh");
  TORCH_CHECK_VALUE(options.bucket_bytes() >= 1, kWho, "bucket_bytes must be >= 1, got ",
                    options.bucket_bytes());
  return LayoutGroups()
      .dp(dp)
      .tensor_parallel(std::move(tensor_parallel))
      .bucket_bytes(options.bucket_bytes())
      .tp_mode(options.tp_mode());
}

}  // namespace

ShardedDataParallel::ShardedDataParallel(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters, const OptimizerConfig& config,
    Group dp, std::map<std::string, TensorParallelShard> tensor_parallel,
    ShardedDataParallelOptions options, const OptimizerRegistry& registry)
    : Layout(named_parameters, sharded_config(config), sharded_groups(dp, std::move(tensor_parallel), options),
             registry),
      options_(options) {
  set_who(kWho);
}

const torch::OrderedDict<std::string, at::Tensor>& ShardedDataParallel::shards() const {
  return rows().shards();
}

const std::vector<int64_t>& ShardedDataParallel::rows_per_rank(const std::string& name) const {
  return rows().rows_per_rank(name);
}

int64_t ShardedDataParallel::row_offset(const std::string& name) const { return rows().row_offset(name); }

int64_t ShardedDataParallel::parameter_bytes() const {
  int64_t bytes = rows().shard_bytes();
  for (const auto& item : parameters()) bytes += static_cast<int64_t>(item.value().nbytes());
  return bytes;
}

size_t ShardedDataParallel::bucket_count() const { return rows().bucket_count(); }

}  // namespace muon::distributed
