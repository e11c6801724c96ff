// ShardedOrthogonalizer's owner-compute exchange, for any whole-matrix
// step: per group, batches of matrices; each rank sends its rows of each
// matrix to the matrix's owner (all-to-all), the owner runs the step on the
// whole matrices it owns in the batch and sends each rank its rows of the
// results back, with up to max_in_flight batches travelling while others
// are computed. Muon's step orthogonalizes (batched Newton–Schulz);
// owner_compute takes the step from its caller (muon::distributed::ShardedSoap's
// SOAP step).
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "distributed/layouts/pipeline.h"
#include "distributed/layouts/sharded_internal.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "optim/muon_fused.h"

namespace muon::distributed {

// One group's batches and the three legs of each: forward (my rows of each
// matrix to its owner), compute and return (the owner's whole matrices
// through `whole`, each rank's rows of the results sent back), apply (the
// returned rows into `back`). Matrix i (flat order) sends `send[i]`, this
// rank's rows × any number of columns, and gets back its rows × the
// matrix's columns.
class ShardedOrthogonalizer::OwnerExchange {
 public:
  using Whole = std::function<std::vector<at::Tensor>(const std::vector<size_t>& mine,
                                                      const std::vector<at::Tensor>& wholes)>;

  OwnerExchange(const ShardedOrthogonalizer& self, size_t g, std::vector<std::vector<size_t>> batches,
                const std::vector<at::Tensor>& send, Whole whole, std::vector<at::Tensor>& back)
      : self_(self),
        group_(self.groups_[g]),
        world_(group_.size()),
        me_(static_cast<size_t>(group_.rank())),
        batches_(std::move(batches)),
        send_(send),
        whole_(std::move(whole)),
        back_(back) {}

  // The batches in order: forwards travel up to `ahead` batches beyond the
  // one being computed; each batch's return is started when it is
  // computed, and up to max(ahead, 1) returns travel while later batches are.
  void run(size_t ahead) {
    auto apply_returned = [&](size_t b, const std::vector<at::Tensor>& returned) {
      apply(b, returned.at(0));
    };
    detail::Pipeline<decltype(apply_returned)> backward(std::max<size_t>(ahead, 1), apply_returned);
    detail::run_pipeline(
        batches_.size(), ahead + 1, [&](size_t b) { return start_forward(b); },
        [&](size_t b, const std::vector<at::Tensor>& received) {
          backward.push(b, compute_and_return(b, received.at(0)));
        });
    backward.drain();
  }

 private:
  int64_t sent_cols(size_t i) const { return send_[i].size(1); }

  // Forward: my rows of each matrix to its owner.
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
        pieces.push_back(send_[i].reshape({-1}));
        send[static_cast<size_t>(d)] += send_[i].numel();
      }
    }
    for (const auto i : batch) {
      if (owners[i] != static_cast<int64_t>(me_)) continue;
      for (int s = 0; s < world_; ++s) {
        recv[static_cast<size_t>(s)] += layout[i].rows_per_rank[static_cast<size_t>(s)] * sent_cols(i);
      }
    }
    auto input = pieces.empty() ? at::empty({0}, send_[batch[0]].options()) : at::cat(pieces);
    return group_.all_to_all_async(input, send, recv);
  }

  // Owner: assemble, compute, send each rank its rows of the results.
  PendingCollective compute_and_return(size_t b, const at::Tensor& received) {
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
        const int64_t rows = layout[mine[k]].rows_per_rank[static_cast<size_t>(s)];
        const int64_t cols = sent_cols(mine[k]);
        blocks[k].push_back(received.narrow(0, offset, rows * cols).view({rows, cols}));
        offset += rows * cols;
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
      const auto results = whole_(mine, full);
      TORCH_INTERNAL_ASSERT(results.size() == mine.size(), "owner-compute: one result per matrix");
      for (int s = 0; s < world_; ++s) {
        for (const auto k : c10::irange(mine.size())) {
          const auto& l = layout[mine[k]];
          const auto rs = static_cast<size_t>(s);
          TORCH_INTERNAL_ASSERT(results[k].dim() == 2 && results[k].size(0) == l.rows &&
                                    results[k].size(1) == l.cols,
                                "owner-compute: a result must be the whole matrix");
          out_pieces.push_back(
              detail::rows_padded(results[k], l.offsets[rs], l.rows_per_rank[rs]).reshape({-1}));
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
        back_[i] = returned.narrow(0, offset, n);
        offset += n;
      }
    }
  }

  const ShardedOrthogonalizer& self_;
  const Group& group_;
  const int world_;
  const size_t me_;
  const std::vector<std::vector<size_t>> batches_;
  const std::vector<at::Tensor>& send_;
  const Whole whole_;
  std::vector<at::Tensor>& back_;
};

void ShardedOrthogonalizer::step_owner_compute(const std::vector<size_t>& active,
                                               std::vector<OrthogonalizeItem*>& items) {
  const size_t ahead = static_cast<size_t>(options_.max_in_flight());
  std::vector<at::Tensor> send(layout_.size());
  std::vector<at::Tensor> back(layout_.size());
  for (const auto i : active) send[i] = items[i]->update.reshape({params_[i].size(0), layout_[i].cols});
  for (const auto g : c10::irange(groups_.size())) {
    // Batches: same (rows, cols, dtype) and param group, in order of first
    // appearance (muon::detail::BatchKey).
    std::vector<size_t> members;
    std::vector<muon::detail::BatchKey> keys;
    for (const auto i : active) {
      const auto& l = layout_[i];
      if (l.group_index != static_cast<int64_t>(g)) continue;
      // TP blocks batch by their whole matrix and layout, so that every TP
      // rank forms the same batches in the same order (their blocks may
      // differ). The device is left out: it may differ between ranks.
      muon::detail::BatchKey key;
      key.rows = l.tp ? l.scale_rows : l.rows;
      key.cols = l.tp ? l.scale_cols : l.cols;
      key.dtype = items[i]->update.scalar_type();
      key.options = items[i]->options;
      key.by_group = true;
      if (l.tp) key.split = {1 + static_cast<int64_t>(l.tp_mode), l.tp_dim};
      members.push_back(i);
      keys.push_back(key);
    }
    auto batches = muon::detail::group_by_key(keys);
    for (auto& batch : batches) {
      for (auto& k : batch) k = members[k];
    }
    const auto orthogonalize_whole = [&](const std::vector<size_t>& mine,
                                         const std::vector<at::Tensor>& wholes) {
      return orthogonalize(mine, wholes, *items[mine[0]]->options);
    };
    OwnerExchange(*this, g, std::move(batches), send, orthogonalize_whole, back).run(ahead);
  }
  for (const auto i : active) items[i]->orth = back[i];
}

void ShardedOrthogonalizer::owner_compute(std::vector<OwnerComputeItem>& items, const WholeMatrixStep& step) {
  TORCH_CHECK_VALUE(options_.mode() == ShardedMode::kOwnerCompute, detail::kShardedWho,
                    "owner_compute needs mode owner_compute, got ", to_string(options_.mode()));
  std::vector<OwnerComputeItem*> by_param(layout_.size(), nullptr);
  std::vector<at::Tensor> send(layout_.size());
  std::vector<at::Tensor> back(layout_.size());
  for (auto& item : items) {
    const size_t i = index_of(item.param);
    TORCH_INTERNAL_ASSERT(by_param[i] == nullptr, "a parameter was given twice to owner_compute");
    const auto& l = layout_[i];
    TORCH_CHECK_VALUE(!l.tp && !l.experts, detail::kShardedWho, "owner_compute of parameter ", i,
                      ": tensor-parallel blocks and stacked experts are not whole row-sharded matrices");
    TORCH_CHECK_VALUE(item.rows.dim() == 2 && item.rows.size(0) == params_[i].size(0), detail::kShardedWho,
                      "owner_compute of parameter ", i, ": rows of shape ", item.rows.sizes(), " for a shard of ",
                      params_[i].size(0), " rows");
    by_param[i] = &item;
    send[i] = item.rows.contiguous();
  }
  const size_t ahead = static_cast<size_t>(options_.max_in_flight());
  for (const auto g : c10::irange(groups_.size())) {
    // Batches: the same param group, shape, dtype and columns sent, in the
    // flat order every rank shares.
    using Key = std::tuple<size_t, int64_t, int64_t, at::ScalarType, int64_t>;
    std::vector<Key> keys;
    std::vector<std::vector<size_t>> batches;
    for (const auto i : c10::irange(layout_.size())) {
      if (by_param[i] == nullptr || layout_[i].group_index != static_cast<int64_t>(g)) continue;
      const auto& l = layout_[i];
      const Key key{l.param_group, l.rows, l.cols, send[i].scalar_type(), send[i].size(1)};
      const auto it = std::find(keys.begin(), keys.end(), key);
      if (it == keys.end()) {
        keys.push_back(key);
        batches.push_back({i});
      } else {
        batches[static_cast<size_t>(it - keys.begin())].push_back(i);
      }
    }
    const auto whole = [&](const std::vector<size_t>& mine, const std::vector<at::Tensor>& wholes) {
      std::vector<const OwnerComputeItem*> of;
      for (const auto i : mine) of.push_back(by_param[i]);
      return step(of, wholes);
    };
    OwnerExchange(*this, g, std::move(batches), send, whole, back).run(ahead);
  }
  for (const auto i : c10::irange(layout_.size())) {
    if (by_param[i] != nullptr) by_param[i]->result = back[i].view({params_[i].size(0), layout_[i].cols});
  }
}

}  // namespace muon::distributed
