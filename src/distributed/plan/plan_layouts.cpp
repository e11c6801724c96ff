// muon::plan: each layout's traffic model (src/distributed/plan/planner.h):
// the gradient reduction, the optimizer's collectives and the gather of the
// updated parameters of the replicated, layer-wise, sharded and
// tensor-parallel layouts, with the same bucketing, padding, row splits and
// owner packing as src/distributed/layouts/.
#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/assignment.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "planner.h"

namespace muon::plan::planner {

// Expert parallelism (expert_data_parallel 1): each rank's own experts,
// never reduced or exchanged: orthogonalized and updated where they are.
void Planner::local_experts(int64_t tp_rank, const std::vector<Tensor>& experts) {
  for (int64_t d = 0; d < dp_; ++d) {
    const int64_t r = world_rank(d, tp_rank);
    for (const auto& t : experts) {
      add_params(r, t.bytes());
      const bool muon = is_muon(t, o_);
      elementwise(r, t.numel(), muon);
      if (muon) {
        const auto m = matrices_of(t.shape);
        orthogonalize(r, m.count, m.rows, m.cols);
      }
    }
  }
}

// Duplicated TP Muon: every TP rank gathers each split matrix's blocks
// (all_gather_uneven: its shape, then the blocks padded to the largest)
// and orthogonalizes the whole matrix. In the 2-D layout only the owner
// of the matrix in its dp group does, with its TP peers.
void Planner::tensor_parallel_gathers(int64_t tp_rank, const std::vector<Tensor>& tensors) {
  if (tp_rank != 0) return;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& whole = model_.tensors[i];
    if (!is_muon(whole, o_) || whole.split == Split::kNone) continue;
    int64_t largest = 0;
    for (int64_t t = 0; t < tp_; ++t) largest = std::max(largest, block_of(whole, tp_, t).numel());
    const int64_t bytes = ints_bytes(kUnevenShapeInts, tp_) + all_gather_bytes(largest * whole.dtype_bytes, tp_);
    if (layout_ == LayoutKind::kTensorParallel) {
      for (int64_t d = 0; d < dp_; ++d) same_bytes("TP block gather", tp_members(d), bytes, 2 * (tp_ - 1));
    }
  }
}

void Planner::replicated(int64_t tp_rank, const std::vector<Tensor>& tensors) {
  gradient_all_reduce(tp_rank, tensors);
  for (int64_t d = 0; d < dp_; ++d) {
    const int64_t r = world_rank(d, tp_rank);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      add_params(r, t.bytes());
      const bool muon = is_muon(t, o_);
      elementwise(r, t.numel(), muon);
      if (muon) {
        // TP blocks are orthogonalized whole (duplicated mode).
        const auto m = matrices_of(layout_ == LayoutKind::kTensorParallel ? model_.tensors[i].shape : t.shape);
        orthogonalize(r, m.count, m.rows, m.cols);
      }
    }
  }
}

void Planner::layerwise(int64_t tp_rank, const std::vector<Tensor>& tensors) {
  gradient_all_reduce(tp_rank, tensors);
  std::vector<double> costs;
  for (const auto& t : tensors) {
    if (t.shape.size() >= 2) {
      costs.push_back(muon::distributed::newton_schulz_cost(rows_of(t), row_numel(t)));
    } else {
      costs.push_back(static_cast<double>(t.numel()));
    }
  }
  const auto owners = muon::distributed::assign_owners(costs, dp_);
  // Buckets per owner in parameter order; bucket k of every rank is
  // gathered at the largest rank's size.
  std::vector<std::vector<int64_t>> used(static_cast<size_t>(dp_));
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& mine = used[static_cast<size_t>(owners[i])];
    const int64_t bytes = tensors[i].bytes();
    if (mine.empty() || mine.back() + bytes > o_.layerwise_bucket_bytes) {
      mine.push_back(aligned(bytes));
    } else {
      mine.back() = detail::add(mine.back(), aligned(bytes), "a bucket's bytes");
    }
    const int64_t r = world_rank(owners[i], tp_rank);
    const bool muon = is_muon(tensors[i], o_);
    elementwise(r, tensors[i].numel(), muon);
    if (muon) {
      const auto m = matrices_of(tensors[i].shape);
      orthogonalize(r, m.count, m.rows, m.cols);
    }
  }
  for (int64_t d = 0; d < dp_; ++d) {
    for (const auto& t : tensors) add_params(world_rank(d, tp_rank), t.bytes());
  }
  size_t buckets = 0;
  for (const auto& b : used) buckets = std::max(buckets, b.size());
  int64_t bytes = 0;
  for (size_t k = 0; k < buckets; ++k) {
    int64_t largest = 0;
    for (const auto& b : used) {
      if (k < b.size()) largest = std::max(largest, b[k]);
    }
    bytes = detail::add(bytes, all_gather_bytes(largest, dp_), "the updated parameters all-gather's bytes");
  }
  same_bytes("updated parameters all-gather", dp_members(tp_rank), bytes, static_cast<int64_t>(buckets) * (dp_ - 1),
             true);
}

// The sharded layout's owner-compute: each rank's rows of a matrix to its
// owner and back (one all-to-all each way per shape), Newton–Schulz on the
// owner (with its TP peers for a split matrix).
void Planner::owner_exchange(int64_t tp_rank, const std::vector<Tensor>& tensors,
                             const std::vector<std::vector<int64_t>>& rows, const std::vector<size_t>& owned,
                             const std::vector<double>& costs, const std::vector<int64_t>& members) {
  const auto owners = muon::distributed::assign_owners(costs, dp_);
  std::vector<int64_t> bytes(static_cast<size_t>(dp_), 0);
  for (size_t k = 0; k < owned.size(); ++k) {
    const auto i = owned[k];
    const auto& t = tensors[i];
    const int64_t owner = owners[k];
    const int64_t row_bytes = row_numel(t) * t.dtype_bytes;
    for (int64_t d = 0; d < dp_; ++d) {
      if (d != owner) bytes[static_cast<size_t>(d)] = detail::add(bytes[static_cast<size_t>(d)], rows[i][static_cast<size_t>(d)] * row_bytes, "the owner exchange's bytes");
    }
    bytes[static_cast<size_t>(owner)] = detail::add(bytes[static_cast<size_t>(owner)], (rows_of(t) - rows[i][static_cast<size_t>(owner)]) * row_bytes, "the owner exchange's bytes");
    const auto& whole = model_.tensors[i];
    const bool split = tp_ > 1 && whole.split != Split::kNone;
    const int64_t r = world_rank(owner, tp_rank);
    if (!split) {
      orthogonalize(r, 1, rows_of(t), row_numel(t));
      continue;
    }
    // The 2-D layout's TP mode is distributed (LayoutGroups::tp_mode):
    // the owners of a split matrix, one per TP rank, run Newton–Schulz
    // together on their blocks: one all-reduce of ‖G‖² (a double), then
    // per iteration one of the Gram matrix that the blocks' own Grams
    // sum to (cols² for a row split, rows² for a column split; fp32).
    orthogonalize(r, 1, whole.shape[0], whole.shape[1], 1.0 / static_cast<double>(tp_));
    if (tp_rank == 0) {
      const int64_t side = whole.split == Split::kRows ? whole.shape[1] : whole.shape[0];
      const int64_t gram = ring_all_reduce_bytes(mul(mul(side, side, "a Gram matrix"), 4, "a Gram matrix"), tp_);
      const int64_t bytes = detail::add(ring_all_reduce_bytes(8, tp_), mul(o_.ns_steps, gram, "the Gram all-reduces"), "the Gram all-reduces");
      same_bytes("distributed Newton-Schulz all-reduces (TP)", tp_members(owner), bytes,
                 (1 + o_.ns_steps) * 2 * (tp_ - 1));
    }
  }
  // One all-to-all out and one back per batch (matrices of one shape).
  std::set<std::pair<int64_t, int64_t>> shapes;
  for (const auto i : owned) shapes.insert({rows_of(tensors[i]), row_numel(tensors[i])});
  add("owner exchange (all-to-all)", members, bytes, static_cast<int64_t>(shapes.size()) * 2 * (dp_ - 1), true);
}

// Row shards over dp: reduce-scatter (all-to-all per bucket), the Muon
// matrices through their owners (or gathered everywhere), the AdamW part
// on the shards, the updated rows all-gathered per bucket.
void Planner::sharded(int64_t tp_rank, const std::vector<Tensor>& tensors) {
  const auto members = dp_members(tp_rank);
  std::vector<std::vector<int64_t>> rows;
  for (const auto& t : tensors) rows.push_back(muon::distributed::balanced_split_sizes(rows_of(t), dp_));
  // Buckets: in order, up to row_bucket_bytes (one dtype here).
  std::vector<std::vector<size_t>> buckets;
  int64_t filled = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (buckets.empty() || detail::add(filled, tensors[i].bytes(), "a bucket's bytes") > o_.row_bucket_bytes) {
      buckets.push_back({});
      filled = 0;
    }
    buckets.back().push_back(i);
    filled += tensors[i].bytes();
  }
  std::vector<int64_t> scatter(static_cast<size_t>(dp_), 0), gather(static_cast<size_t>(dp_), 0);
  int64_t hops = 0;
  for (const auto& b : buckets) {
    int64_t total = 0, largest = 0;
    std::vector<int64_t> held(static_cast<size_t>(dp_), 0);
    for (const auto i : b) {
      for (int64_t d = 0; d < dp_; ++d) held[static_cast<size_t>(d)] += rows[i][static_cast<size_t>(d)] * row_numel(tensors[i]) * tensors[i].dtype_bytes;
      total = detail::add(total, tensors[i].bytes(), "a bucket's bytes");
    }
    for (int64_t d = 0; d < dp_; ++d) {
      scatter[static_cast<size_t>(d)] = detail::add(scatter[static_cast<size_t>(d)], dp_ > 1 ? total - held[static_cast<size_t>(d)] : 0, "the reduce-scatter's bytes");
      largest = std::max(largest, held[static_cast<size_t>(d)]);
    }
    const int64_t gathered = all_gather_bytes(largest, dp_);
    for (auto& g : gather) g = detail::add(g, gathered, "the updated rows all-gather's bytes");
    hops += dp_ - 1;
  }
  add("gradients reduce-scatter", members, scatter, hops, true);
  // The optimizer on the shards.
  std::vector<double> costs;
  std::vector<size_t> owned;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    for (int64_t d = 0; d < dp_; ++d) {
      const int64_t r = world_rank(d, tp_rank);
      const int64_t mine = rows[i][static_cast<size_t>(d)] * row_numel(t);
      elementwise(r, mine, is_muon(t, o_));
      add_params(r, detail::add(t.bytes(), mine * t.dtype_bytes, "a rank's parameter bytes"));
    }
    if (!is_muon(t, o_)) continue;
    if (t.shape.size() >= 3) {  // stacked experts: each rank its own, no exchange
      const auto m = matrices_of(t.shape);
      for (int64_t d = 0; d < dp_; ++d) {
        orthogonalize(world_rank(d, tp_rank), rows[i][static_cast<size_t>(d)] * (m.count / rows_of(t)), m.rows, m.cols);
      }
      continue;
    }
    owned.push_back(i);
    const auto& whole = model_.tensors[i];
    costs.push_back(tp_ > 1 && whole.split != Split::kNone
                        ? muon::distributed::newton_schulz_cost(whole.shape[0], whole.shape[1])
                        : muon::distributed::newton_schulz_cost(rows_of(t), row_numel(t)));
  }
  if (layout_ == LayoutKind::kShardedReplicated) {
    std::vector<int64_t> bytes(static_cast<size_t>(dp_), 0);
    for (const auto i : owned) {
      const auto& t = tensors[i];
      const int64_t largest = *std::max_element(rows[i].begin(), rows[i].end());
      const int64_t each = detail::add(ints_bytes(kUnevenShapeInts, dp_), all_gather_bytes(largest * row_numel(t) * t.dtype_bytes, dp_), "the matrices all-gather's bytes");
      for (auto& b : bytes) b = detail::add(b, each, "the matrices all-gather's bytes");
      for (int64_t d = 0; d < dp_; ++d) orthogonalize(world_rank(d, tp_rank), 1, rows_of(t), row_numel(t));
    }
    add("matrices all-gather (every rank)", members, bytes, static_cast<int64_t>(owned.size()) * 2 * (dp_ - 1));
  } else {
    owner_exchange(tp_rank, tensors, rows, owned, costs, members);
  }
  add("updated rows all-gather", members, gather, hops, true);
}

}  // namespace muon::plan::planner
