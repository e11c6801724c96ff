// The weight-update hooks' sums over a parameter's parts (hook_sums.h).
#include "hook_sums.h"

#include <c10/util/irange.h>

#include <utility>
#include <vector>

namespace muon::distributed::detail {
namespace {

// A group and the rows of the sums it reduces.
struct Batch {
  Group group;
  std::vector<int64_t> rows;
};

// The batch of `group` in `batches` (added at the end the first time):
// groups are told apart by their name and members.
Batch& batch_of(std::vector<Batch>& batches, const Group& group) {
  for (auto& b : batches) {
    if (b.group.name() == group.name() && b.group.world_ranks() == group.world_ranks()) return b;
  }
  batches.push_back({group, {}});
  return batches.back();
}

void reduce(const std::vector<Batch>& batches, at::Tensor& sums) {
  for (const auto& b : batches) {
    const auto index = at::tensor(b.rows, at::kLong);
    auto rows = sums.index_select(0, index).to(b.group.device());
    b.group.all_reduce_(rows);
    sums.index_copy_(0, index, rows.cpu());
  }
}

}  // namespace

SumAcrossParts hook_sums(const DistributedLayout& layout, std::unordered_map<const void*, std::string> names) {
  return [tp = layout.tensor_parallel, shards = layout.row_shards, names = std::move(names)](
             const std::vector<at::Tensor>& params, at::Tensor& sums) {
    std::vector<Batch> first;   // row shards over their group; TP blocks over theirs
    std::vector<Batch> second;  // the 2-D layout's TP blocks, after their rows
    for (const auto i : c10::irange(params.size())) {
      const auto name = names.find(params[i].unsafeGetTensorImpl());
      if (name == names.end()) continue;
      const auto row = static_cast<int64_t>(i);
      if (const auto s = shards.find(name->second); s != shards.end()) {
        batch_of(first, s->second.group()).rows.push_back(row);
        if (s->second.has_tensor_parallel()) batch_of(second, s->second.tp().group()).rows.push_back(row);
      } else if (const auto t = tp.find(name->second); t != tp.end()) {
        batch_of(first, t->second.group()).rows.push_back(row);
      }
    }
    reduce(first, sums);
    reduce(second, sums);
  };
}

}  // namespace muon::distributed::detail
