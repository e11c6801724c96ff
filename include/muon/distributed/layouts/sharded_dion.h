#pragma once

/// Dion (muon::Dion) over ZeRO/FSDP row-sharded parameters, exchanging
/// the low-rank factors instead of whole matrices (Dion's FSDP design,
/// dion/dion.py dion_update_fsdp).
///
/// Each rank keeps its rows of the momentum M; the right factor Q (min(m, n)
/// × r) is held by the matrix's owner (ShardedOrthogonalizer's owners) and
/// broadcast to the group at each step. With B = M (m >= n, B's rows are the
/// ranks' rows): every rank forms its rows of B·Q, the rows are all-gathered,
/// every rank orthonormalizes the same P (m × r), and R = Bᵀ·P is the
/// all-reduced sum of each rank's Mᵢᵀ·Pᵢ (n × r). With B = Mᵀ (m < n, B's
/// columns are the ranks' rows): P = Σ Mᵢᵀ·Qᵢ is all-reduced (n × r), every
/// rank orthonormalizes it, and R = M·P is each rank's rows, all-gathered
/// (m × r). Then every rank has P and R whole: the zero check (one
/// all-reduced count), the error feedback and the update P·Qᵀ on its rows,
/// and Q ← R with unit columns, kept by the owner. Per matrix and step each
/// rank sends about (m + 2n)·r elements (m >= n) or (2n + m)·r (m < n),
/// against Muon's owner-compute m·n each way.
///
/// The same arithmetic as one process, the same seeded draws, but sums in
/// another order (the all-reduced products): parameters and state equal one
/// process to rounding, not bit for bit. Checkpoints split M with the rows
/// and save Q once, from its owner, and load at any world size and layout.
/// Only the owner_compute mode (the owners' layout) exists; tensor-parallel
/// blocks (the 2-D layout) and 1-D parameters are refused.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/optim/dion.h"

namespace muon::distributed {

/// Dion over row shards, the low-rank factors exchanged (see the top of this header).
/// Construction and `step()` are collective over every shard's group, as
/// ShardedMuon's.
class ShardedDion : public Dion {
 public:
  /// Over `param_groups` (groups without options get `defaults`); every
  /// parameter must have a RowShard in `options` (global shape of >= 2 dims,
  /// no tensor-parallel block) and `options.mode()` must be owner_compute.
  ShardedDion(std::vector<torch::optim::OptimizerParamGroup> param_groups, DionOptions defaults,
              ShardedOptions options);
  /// Over one group: `params[i]` is described by `shards[i]`.
  ShardedDion(std::vector<at::Tensor> params, std::vector<RowShard> shards, DionOptions defaults = {},
              ShardedOptions options = {});

  /// The whole matrix `param` is a row shard of (its global shape's dim 0 × the rest).
  std::pair<int64_t, int64_t> whole_matrix_dims(const at::Tensor& param) const override;
  /// Whether this rank owns `param`'s matrix (and holds its Q).
  bool holds_whole_state(const at::Tensor& param) const override;
  /// Collective over every shard group (muon/optim/step_guard.h).
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) override;
  /// The owner of each parameter (flat order over the param groups), a rank of its shard's group.
  const std::vector<int64_t>& owners() const { return strategy_->owners(); }

 protected:
  /// Dion's step on every matrix, the low-rank factors exchanged (the top of this header).
  void step_parameters() override;

 private:
  struct Part;
  Part part_of(const at::Tensor& param, size_t flat) const;
  static at::Tensor matrix_update(const at::Tensor& grad, DionParamState& st, const DionOptions& o, const Part& part);
  static std::vector<int64_t> q_dims(const Part& part, const DionOptions& o);

  std::shared_ptr<ShardedOrthogonalizer> strategy_;
  std::unordered_map<const void*, Group> groups_;  // each parameter's shard group
};

}  // namespace muon::distributed
