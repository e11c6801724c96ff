// ShardedOrthogonalizer's owner-compute step: per group, batches of
// same-shape matrices; each rank sends its rows of each matrix to the
// matrix's owner (all-to-all), the owner orthogonalizes the whole matrices
// as one batch and sends each rank its rows back, with up to max_in_flight
// batches travelling while others are orthogonalized.
#include <c10/util/irange.h>

#include <algorithm>
#include <utility>

#include "dist/layouts/pipeline.h"
#include "dist/layouts/sharded_internal.h"
#include "muon/dist/layouts/sharded_muon.h"
#include "optim/muon_fused.h"

namespace muon::dist {

// One group's batches and the three legs of each: forward (my rows of each
// matrix to its owner), orthogonalize and return (the owner's whole
// matrices, each rank's rows sent back), apply (the returned rows).
class ShardedOrthogonalizer::OwnerComputeGroup {
 public:
  OwnerComputeGroup(const ShardedOrthogonalizer& self, size_t g, const std::vector<size_t>& active,
                    std::vector<OrthogonalizeItem*>& items)
      : self_(self),
        items_(items),
        group_(self.groups_[g]),
        world_(group_.size()),
        me_(static_cast<size_t>(group_.rank())),
        batches_(batches_of(g, active)) {}

  // The batches in order: forwards travel up to `ahead` batches beyond the
  // one being orthogonalized; each batch's return is started when it is
  // orthogonalized, and up to max(ahead, 1) returns travel while later
  // batches are.
  void run(size_t ahead) {
    auto apply_returned = [&](size_t b, const std::vector<at::Tensor>& returned) {
      apply(b, returned.at(0));
    };
    detail::Pipeline<decltype(apply_returned)> backward(std::max<size_t>(ahead, 1), apply_returned);
    detail::run_pipeline(
        batches_.size(), ahead + 1, [&](size_t b) { return start_forward(b); },
        [&](size_t b, const std::vector<at::Tensor>& received) {
          backward.push(b, orthogonalize_and_return(b, received.at(0)));
        });
    backward.drain();
  }

 private:
  const at::Tensor& update(size_t i) const { return items_[i]->update; }

  // Batches: same (rows, cols, dtype) and param group, in order of first
  // appearance (muon::detail::BatchKey).
  std::vector<std::vector<size_t>> batches_of(size_t g, const std::vector<size_t>& active) const {
    std::vector<size_t> members;
    std::vector<muon::detail::BatchKey> keys;
    for (const auto i : active) {
      const auto& l = self_.layout_[i];
      if (l.group_index != static_cast<int64_t>(g)) continue;
      // TP blocks batch by their whole matrix and layout, so that every TP
      // rank forms the same batches in the same order (their blocks may
      // differ). The device is left out: it may differ between ranks.
      muon::detail::BatchKey key;
      key.rows = l.tp ? l.scale_rows : l.rows;
      key.cols = l.tp ? l.scale_cols : l.cols;
      key.dtype = update(i).scalar_type();
      key.options = items_[i]->options;
      key.by_group = true;
      if (l.tp) key.split = {1 + static_cast<int64_t>(l.tp_mode), l.tp_dim};
      members.push_back(i);
      keys.push_back(key);
    }
    auto batches = muon::detail::group_by_key(keys);
    for (auto& batch : batches) {
      for (auto& k : batch) k = members[k];
    }
    return batches;
  }

  // Forward: my shard of each matrix to its owner.
  PendingCollective start_forward(size_t b) {
    const auto& batch = batches_[b];
    const auto& layout = self_.layout_;
    const auto& owners = self_.owners_;
    std::vector<int64_t> send(static_cast<size_t>(world_), 0);
    std::vector<int64_t> recv(static_cast<size_t>(world_), 0);
    std::vector<at::Tensor> pieces;
    for (int d = 0; d < world_; ++d) {
      for (const auto i : batch) {
        if (owners[i] != d) continue;
        pieces.push_back(update(i).reshape({-1}));
        send[static_cast<size_t>(d)] += update(i).numel();
      }
    }
    for (const auto i : batch) {
      if (owners[i] != static_cast<int64_t>(me_)) continue;
      for (int s = 0; s < world_; ++s) {
        recv[static_cast<size_t>(s)] += layout[i].rows_per_rank[static_cast<size_t>(s)] * layout[i].cols;
      }
    }
    auto input = pieces.empty() ? at::empty({0}, update(batch[0]).options()) : at::cat(pieces);
    return group_.all_to_all_async(input, send, recv);
  }

  // Owner: assemble, orthogonalize as one batch, send each rank its rows.
  PendingCollective orthogonalize_and_return(size_t b, const at::Tensor& received) {
    const auto& batch = batches_[b];
    const auto& layout = self_.layout_;
    const auto& owners = self_.owners_;
    std::vector<size_t> mine;
    for (const auto i : batch) {
      if (owners[i] == static_cast<int64_t>(me_)) mine.push_back(i);
    }
    // received: for each source rank s, for each of my matrices, its rows from s.
    std::vector<std::vector<at::Tensor>> blocks(mine.size());
    int64_t offset = 0;
    for (int s = 0; s < world_; ++s) {
      for (const auto k : c10::irange(mine.size())) {
        const auto& l = layout[mine[k]];
        const int64_t rows = l.rows_per_rank[static_cast<size_t>(s)];
        blocks[k].push_back(received.narrow(0, offset, rows * l.cols).view({rows, l.cols}));
        offset += rows * l.cols;
      }
    }
    std::vector<int64_t> send(static_cast<size_t>(world_), 0);
    std::vector<int64_t> recv(static_cast<size_t>(world_), 0);
    std::vector<at::Tensor> out_pieces;
    if (!mine.empty()) {
      std::vector<at::Tensor> full;
      for (const auto k : c10::irange(mine.size())) {
        full.push_back(at::cat(blocks[k]).narrow(0, 0, layout[mine[k]].rows));
      }
      const auto orth = self_.orthogonalize(mine, full, items_[mine[0]]->options->ns());
      for (int s = 0; s < world_; ++s) {
        for (const auto k : c10::irange(mine.size())) {
          const auto& l = layout[mine[k]];
          const auto rs = static_cast<size_t>(s);
          out_pieces.push_back(detail::rows_padded(orth[k], l.offsets[rs], l.rows_per_rank[rs]).reshape({-1}));
          send[rs] += l.rows_per_rank[rs] * l.cols;
        }
      }
    }
    for (const auto i : batch) {
      recv[static_cast<size_t>(owners[i])] += self_.params_[i].size(0) * layout[i].cols;
    }
    auto input = out_pieces.empty() ? at::empty({0}, received.options()) : at::cat(out_pieces);
    return group_.all_to_all_async(input, send, recv);
  }

  // Everyone: the returned rows of every matrix of the batch.
  void apply(size_t b, const at::Tensor& returned) {
    const auto& batch = batches_[b];
    int64_t offset = 0;
    for (int d = 0; d < world_; ++d) {
      for (const auto i : batch) {
        if (self_.owners_[i] != d) continue;
        const int64_t n = self_.params_[i].size(0) * self_.layout_[i].cols;
        items_[i]->orth = returned.narrow(0, offset, n);
        offset += n;
      }
    }
  }

  const ShardedOrthogonalizer& self_;
  std::vector<OrthogonalizeItem*>& items_;
  const Group& group_;
  const int world_;
  const size_t me_;
  const std::vector<std::vector<size_t>> batches_;
};

void ShardedOrthogonalizer::step_owner_compute(const std::vector<size_t>& active,
                                               std::vector<OrthogonalizeItem*>& items) {
  const size_t ahead = static_cast<size_t>(options_.max_in_flight());
  for (const auto g : c10::irange(groups_.size())) OwnerComputeGroup(*this, g, active, items).run(ahead);
}

}  // namespace muon::dist
