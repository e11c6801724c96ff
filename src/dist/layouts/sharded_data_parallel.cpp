// Sharded data parallelism (ZeRO-2): bucketed reduce-scatter by all-to-all,
// the sharded-layout optimizer on this rank's rows, bucketed all-gather.
#include "muon/dist/layouts/sharded_data_parallel.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <utility>

#include "dist/layouts/pipeline.h"
#include "dist/runtime/agreement.h"
#include "dist/runtime/max_over.h"
#include "muon/dist/layouts/sharded_muon.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"
#include "util/names.h"

namespace muon::dist {
namespace {

constexpr const char* kWho = "[muon::dist::ShardedDataParallel] ";
constexpr size_t kShownName = 80;  // characters of a parameter name in messages
constexpr size_t kShownRanks = 8;  // ranks listed in a message
constexpr int64_t kBitsPerWord = 63;  // bitmask bits per int64 (never the sign bit)

std::string shown(const std::string& name) { return muon::detail::clip(name, kShownName); }

// "[0, 2, 5]", at most kShownRanks of them, then "… (N ranks)".
std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string out = "[";
  for (const auto i : c10::irange(std::min(ranks.size(), kShownRanks))) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  if (ranks.size() > kShownRanks) out += ", \u2026 (" + std::to_string(ranks.size()) + " ranks)";
  return out + "]";
}

// Why a defined gradient cannot be averaged into its parameter's shard.
enum GradProblem : int64_t { kGradOk = 0, kGradShape, kGradDtype, kGradDevice, kGradLayout };

GradProblem grad_problem(const at::Tensor& param, const at::Tensor& grad) {
  if (grad.layout() != at::kStrided) return kGradLayout;
  if (grad.sizes() != param.sizes()) return kGradShape;
  if (grad.scalar_type() != param.scalar_type()) return kGradDtype;
  if (grad.device() != param.device()) return kGradDevice;
  return kGradOk;
}

const char* problem_text(int64_t problem) {
  switch (problem) {
    case kGradShape: return "shape";
    case kGradDtype: return "dtype";
    case kGradDevice: return "device";
    default: return "layout (it must be dense)";
  }
}

// Low-precision gradients are summed in fp32.
at::ScalarType accumulate_type(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

// Runs `finish` on what `start` began for every bucket in order, with the
// next bucket's collective started before the current one is finished.
template <typename Bucket, typename Start, typename Finish>
void pipeline(const std::vector<Bucket>& buckets, const Start& start, const Finish& finish) {
  if (buckets.empty()) return;
  auto current = start(buckets.front());
  for (const auto k : c10::irange(buckets.size())) {
    decltype(current) next;
    if (k + 1 < buckets.size()) next = start(buckets[k + 1]);
    finish(current);
    current = std::move(next);
  }
}

}  // namespace

ShardedDataParallel::ShardedDataParallel(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters, const OptimizerConfig& config,
    Group dp, std::map<std::string, TensorParallelShard> tensor_parallel,
    ShardedDataParallelOptions options, const OptimizerRegistry& registry)
    : params_(named_parameters), options_(options) {
  TORCH_CHECK_VALUE(dp.valid(), kWho, "dp is invalid (default-constructed); pass the data-parallel "
                    "group, e.g. muon::dist::init_from_env() or the first group of Group::mesh");
  TORCH_CHECK_VALUE(options_.bucket_bytes() >= 1, kWho, "bucket_bytes must be >= 1, got ",
                    options_.bucket_bytes());
  const auto& layout_kind = config.get_string("layout");
  TORCH_CHECK_VALUE(layout_kind == "none" || layout_kind == "sharded", kWho, "config field 'layout' is '",
                    shown(layout_kind), "'; ShardedDataParallel builds the 'sharded' layout itself: "
                    "leave it 'none' or 'sharded'");
  for (const auto& item : named_parameters) {
    const auto& p = item.value();
    TORCH_CHECK_VALUE(p.defined(), kWho, "parameter '", shown(item.key()), "' is undefined");
    TORCH_CHECK_VALUE(p.dim() >= 1, kWho, "parameter '", shown(item.key()),
                      "' is 0-d (a scalar); rows cannot be split: give it shape [1]");
  }
  for (const auto& entry : tensor_parallel) {
    TORCH_CHECK_VALUE(named_parameters.contains(entry.first), kWho, "tensor_parallel names '",
                      shown(entry.first), "', which is not one of the ", named_parameters.size(),
                      " parameters");
  }
  const int world = dp.size();
  const int rank = dp.rank();
  check_ranks_agree(dp, detail::parameter_items(named_parameters), kWho,
                    "every rank of the data-parallel group must pass the same named parameters "
                    "(names, shapes, dtypes, order)");
  check_ranks_agree(dp, detail::value_items(named_parameters), kWho,
                    "data-parallel replicas must start equal: broadcast them from rank 0 "
                    "(muon::dist::broadcast_parameters) first");

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
    if (tp != tensor_parallel.end()) row_shard.tensor_parallel(tp->second, options_.tp_mode());
    layout_.row_shards.emplace(name, std::move(row_shard));
    const auto rest = p.sizes().slice(1);
    row_numel_.push_back(std::accumulate(rest.begin(), rest.end(), int64_t{1}, std::multiplies<>()));
    rows_.push_back(std::move(rows));
    offsets_.push_back(std::move(offsets));
    index_.emplace(name, i);
  }

  // Steps agree over dp and over every TP group (2-D), each once.
  step_groups_.push_back(dp);
  for (const auto& entry : tensor_parallel) {
    const auto& g = entry.second.group();
    const bool seen = std::any_of(step_groups_.begin(), step_groups_.end(), [&](const Group& s) {
      return s.name() == g.name() && s.world_ranks() == g.world_ranks();
    });
    if (!seen) step_groups_.push_back(g);
  }

  // Buckets: parameters in order, by dtype and device, each up to bucket_bytes.
  std::vector<std::pair<std::string, size_t>> open;  // (dtype and device, bucket index)
  std::vector<int64_t> filled;
  for (const auto i : c10::irange(params_.size())) {
    const auto& p = params_[i].value();
    const auto key = c10::str(p.scalar_type(), "@", p.device());
    const auto bytes = static_cast<int64_t>(p.nbytes());
    auto it = std::find_if(open.begin(), open.end(), [&](const auto& o) { return o.first == key; });
    if (it == open.end() || filled[it->second] + bytes > options_.bucket_bytes()) {
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

  auto sharded_config = config;
  sharded_config.set("layout", "sharded");
  optimizer_ = make_optimizer(shards_, sharded_config, layout_, registry);
}

ShardedDataParallel::~ShardedDataParallel() = default;
ShardedDataParallel::ShardedDataParallel(ShardedDataParallel&&) = default;
ShardedDataParallel& ShardedDataParallel::operator=(ShardedDataParallel&&) = default;

size_t ShardedDataParallel::index_of(const std::string& name) const {
  const auto it = index_.find(name);
  TORCH_CHECK_VALUE(it != index_.end(), kWho, "no parameter named '", shown(name), "' (there are ",
                    params_.size(), ")");
  return it->second;
}

const std::vector<int64_t>& ShardedDataParallel::rows_per_rank(const std::string& name) const {
  return rows_[index_of(name)];
}

int64_t ShardedDataParallel::row_offset(const std::string& name) const {
  return offsets_[index_of(name)][static_cast<size_t>(group().rank())];
}

int64_t ShardedDataParallel::parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto i : c10::irange(params_.size())) {
    bytes += static_cast<int64_t>(params_[i].value().nbytes() + shards_[i].value().nbytes());
  }
  return bytes;
}

int64_t ShardedDataParallel::state_bytes() const { return muon::optimizer_state_bytes(*optimizer_); }

void ShardedDataParallel::zero_grad() {
  for (auto& item : params_) item.value().mutable_grad() = at::Tensor();
  clear_shard_grads();
}

void ShardedDataParallel::clear_shard_grads() {
  for (auto& item : shards_) item.value().mutable_grad() = at::Tensor();
}

std::vector<bool> ShardedDataParallel::exchange_grad_mask(std::string& error) const {
  const auto n = params_.size();
  const auto words = (static_cast<int64_t>(n) + kBitsPerWord - 1) / kBitsPerWord;
  // [first parameter whose gradient does not fit (or -1), its problem, mask words...]
  std::vector<int64_t> mine(static_cast<size_t>(2 + words), 0);
  mine[0] = -1;
  for (const auto i : c10::irange(n)) {
    const auto& p = params_[i].value();
    const auto& g = p.grad();
    if (!g.defined()) continue;
    mine[static_cast<size_t>(2 + static_cast<int64_t>(i) / kBitsPerWord)] |=
        int64_t{1} << (static_cast<int64_t>(i) % kBitsPerWord);
    const auto problem = grad_problem(p, g);
    if (problem != kGradOk && mine[0] < 0) {
      mine[0] = static_cast<int64_t>(i);
      mine[1] = problem;
    }
  }
  const auto all = group().all_gather_ints(mine);
  for (const auto r : c10::irange(all.size())) {
    if (all[r][0] < 0) continue;
    const auto i = static_cast<size_t>(all[r][0]);
    const auto& p = params_[i].value();
    error = c10::str(kWho, "the gradient of parameter '", shown(params_[i].key()), "' (shape ",
                     p.sizes(), ", ", p.scalar_type(), ") on rank ", r, " has another ",
                     problem_text(all[r][1]), " than the parameter");
    return {};
  }
  std::vector<bool> active(n, false);
  for (const auto i : c10::irange(n)) {
    const auto word = static_cast<size_t>(2 + static_cast<int64_t>(i) / kBitsPerWord);
    const auto bit = int64_t{1} << (static_cast<int64_t>(i) % kBitsPerWord);
    std::vector<int64_t> with;
    std::vector<int64_t> without;
    for (const auto r : c10::irange(all.size())) {
      ((all[r][word] & bit) != 0 ? with : without).push_back(static_cast<int64_t>(r));
    }
    if (!with.empty() && !without.empty()) {
      error = c10::str(kWho, "parameter '", shown(params_[i].key()), "' has a gradient on ranks ",
                       rank_list(with), " and none on ranks ", rank_list(without),
                       "; every rank of the data-parallel group must produce it, or none");
      return {};
    }
    active[i] = !with.empty();
  }
  return active;
}

void ShardedDataParallel::reduce_scatter(const std::vector<bool>& active) {
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

std::string ShardedDataParallel::find_nonfinite() const {
  int64_t first = -1;
  for (const auto i : c10::irange(shards_.size())) {
    const auto& g = shards_[i].value().grad();
    if (g.defined() && g.numel() > 0 && !muon::detail::all_finite(g)) {
      first = static_cast<int64_t>(i);
      break;
    }
  }
  const auto all = group().all_gather_ints({first});
  for (const auto r : c10::irange(all.size())) {
    if (all[r][0] < 0) continue;
    const auto i = static_cast<size_t>(all[r][0]);
    return c10::str(kWho, "non-finite gradient (NaN or Inf) in parameter '", shown(params_[i].key()),
                    "' (shape ", params_[i].value().sizes(), "), in the rows rank ", r,
                    " holds after averaging over the data-parallel group; nothing was updated");
  }
  return "";
}

void ShardedDataParallel::all_gather(const std::vector<bool>& active) {
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

void ShardedDataParallel::gather_parameters() {
  all_gather(std::vector<bool>(params_.size(), true));
}

void ShardedDataParallel::step() {
  at::NoGradGuard no_grad;
  clear_shard_grads();
  std::string error;
  const auto active = exchange_grad_mask(error);
  if (error.empty()) reduce_scatter(active);

  auto* guard = muon::step_guard(*optimizer_);
  const auto policy = guard != nullptr ? guard->nonfinite() : NonFinitePolicy::kPropagate;
  bool skip = false;
  if (error.empty() && policy != NonFinitePolicy::kPropagate) {
    auto nonfinite = find_nonfinite();
    if (!nonfinite.empty()) {
      if (policy == NonFinitePolicy::kSkipStep) {
        skip = true;
      } else {
        error = std::move(nonfinite);
      }
    }
  }
  // 2-D: a data-parallel group that raises or skips stops its TP peers in
  // other data-parallel groups from stepping (and waiting for it).
  if (step_groups_.size() > 1) {
    constexpr int64_t kSkip = 1;
    constexpr int64_t kFail = 2;
    const int64_t code = !error.empty() ? kFail : skip ? kSkip : 0;
    std::vector<const Group*> groups;
    for (const auto& g : step_groups_) groups.push_back(&g);
    const auto [agreed, who] = detail::max_over_groups(groups, code);
    if (agreed == kFail && error.empty()) {
      error = c10::str(kWho, "rank ", who, " of group '", group().name(),
                       "' or a tensor-parallel peer failed this step's checks (its message names "
                       "the parameter); nothing was updated");
    }
    if (agreed == kSkip) skip = true;
  }
  if (!error.empty()) {
    clear_shard_grads();
    TORCH_CHECK_VALUE(false, error);
  }
  if (skip) {
    clear_shard_grads();
    ++skipped_steps_;
    return;
  }
  optimizer_->step();
  all_gather(active);
}

}  // namespace muon::dist
