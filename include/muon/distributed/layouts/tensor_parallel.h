#pragma once

/// Muon on tensor-parallel (TP) weight shards.
///
/// Every rank of a TP group holds one block of each sharded matrix
/// (muon/distributed/layouts/tensor_parallel_shard.h). Momentum, Nesterov and weight decay are elementwise
/// and run on the local block as in `muon::Muon`; the orthogonalization
/// needs the whole matrix, and a mode says how it gets it:
///
///  - duplicated (Megatron-Core's default): all-gather the blocks, run
///    `muon::newton_schulz` on the whole matrix on every rank (the same code
///    as one process), keep the local block. Sends (p−1)·(block bytes) per
///    rank per matrix; the NS work is not divided.
///  - distributed (Megatron-Core, TransformerEngine): the ranks iterate
///    together. ‖X‖_F² is all-reduced; each step all-reduces the Gram matrix
///    of the side that is not split (rows split, X = [X₁; X₂; …]:
///    A = XᵀX = Σ XᵢᵀXᵢ, Xᵢ ← a·Xᵢ + Xᵢ·(b·A + c·A²); columns split,
///    X = [X₁ X₂ …]: A = XXᵀ = Σ XᵢXᵢᵀ, Xᵢ ← a·Xᵢ + (b·A + c·A²)·Xᵢ). Sends
///    one s×s Gram per step (s = the unsplit side, fp32 or fp64), and divides
///    the large products among the ranks. Same polynomial schedule, safety
///    factor, eps and fp64-accumulated norm as `newton_schulz` (standard
///    method), so fp32 results match one process to rounding.
///  - blockwise: every rank orthogonalizes its own block alone, scaled from
///    the block's shape (Megatron-Core's "blockwise" TP mode). No
///    communication; the result depends on the TP layout (it equals
///    single-process Muon on each block as a matrix of its own).
///
/// Duplicated and distributed scale from the GLOBAL shape, so they give the
/// same parameters as `muon::Muon` on the whole matrix.
#include <torch/arg.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/newton_schulz.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"
#include "muon/enum_names.h"
#include "muon/newton_schulz.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/muon.h"
#include "muon/optim/orthogonalizer.h"

namespace muon::distributed {

/// How a TP-sharded matrix is orthogonalized (see the top of this header).
enum class TensorParallelMode {
  /// All-gather the blocks, newton_schulz on the whole matrix, keep the block.
  kDuplicated,
  /// Newton–Schulz together: all-reduced norm and Gram matrix per step.
  kDistributed,
  /// newton_schulz on each block alone, scaled from the block's shape.
  kBlockwise,
};

/// "duplicated" | "distributed" | "blockwise".
MUON_ENUM_NAMES(TensorParallelMode, parse_tensor_parallel_mode);

/// Tensor-parallel options of `TensorParallelMuon`: the mode and the shard of
/// every sharded parameter. Parameters without a shard are whole matrices
/// (replicated across TP ranks) and take the single-process path.
struct TensorParallelOptions {
  /// Orthogonalization mode of every sharded parameter.
  TORCH_ARG(TensorParallelMode, mode) = TensorParallelMode::kDuplicated;

 public:
  /// mode by name: "duplicated" | "distributed" | "blockwise".
  TensorParallelOptions& mode(const std::string& name);
  /// Declares `param` (this rank's block) a shard described by `shard`.
  TensorParallelOptions& shard(const at::Tensor& param, TensorParallelShard shard);
  /// Declares the parameter called `name` in `named_parameters` (e.g. a
  /// module's `named_parameters()`, as given to MuonWithAdamW) a shard.
  /// Raises c10::ValueError naming `name` when there is no such parameter.
  TensorParallelOptions& shard(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                               const std::string& name, TensorParallelShard shard);
  /// The declared shards, in the order given.
  const std::vector<std::pair<at::Tensor, TensorParallelShard>>& shards() const { return shards_; }

 private:
  std::vector<std::pair<at::Tensor, TensorParallelShard>> shards_;
};

/// The tensor-parallel orthogonalization strategy (muon/optim/orthogonalizer.h):
/// declared shards in `tp.mode()`, every other parameter as a whole matrix
/// on this process. `attach` is collective over every shard's group (the
/// ranks exchange their block shapes and the options of the shard's param
/// group, and raise together on a mismatch, naming it);
/// `orthogonalize` and `sum_parts` are collective over a shard's group.
/// Empty blocks are valid (a matrix with fewer rows than ranks); empty
/// parameters that are not shards are rejected in `attach`. `Muon` hands
/// over one parameter at a time.
class TensorParallelOrthogonalizer final : public Orthogonalizer {
 public:
  /// The strategy for the shards `tp` declares.
  explicit TensorParallelOrthogonalizer(TensorParallelOptions tp);

  std::string name() const override { return "tensor_parallel"; }
  void attach(const std::vector<torch::optim::OptimizerParamGroup>& groups) override;
  /// Collective over every group of the layout (muon/optim/step_guard.h).
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) const override;
  /// Collective over every shard's group: the ranks agree on which shards
  /// have a gradient (a block steps on every rank of its group or on none),
  /// and raise together, naming the difference, where they do not.
  void begin_step(const std::vector<torch::optim::OptimizerParamGroup>& groups) override;
  /// Rejects the options that need whole matrices on one process (a spectral
  /// update, spectral_clipped weight decay), naming them and the layout, and
  /// a num_heads that does not divide a matrix's rows or whose heads would
  /// straddle the ranks of a row split (per-head Newton–Schulz: each rank
  /// orthogonalizes its whole heads alone; a column split runs the mode per
  /// head).
  void check_options(const MuonOptions& options, size_t group) const override;
  void orthogonalize(std::vector<OrthogonalizeItem>& items) override;
  void sum_parts(const OrthogonalizeItem& item, at::Tensor& partial, PartSum what) const override;

  /// The options given at construction.
  const TensorParallelOptions& options() const { return tp_; }
  /// Sizes of every rank's block along the partition dim of sharded
  /// `param`, in rank order (empty for an unsharded parameter).
  std::vector<int64_t> block_sizes(const at::Tensor& param) const;

 private:
  struct Layout {
    TensorParallelShard shard;
    std::vector<int64_t> sizes;  // per rank, along partition_dim
    int64_t offset;              // of this rank's block
    size_t param_group = 0;      // the optimizer's param group
  };
  /// A parameter that is not a shard (a whole matrix on every TP rank).
  struct Whole {
    size_t param_group;
    size_t index;  // in its param group
    std::vector<int64_t> shape;
  };
  const Layout* layout_of(const at::Tensor& param) const;
  // num_heads of param group `group` against every matrix of the group.
  void check_heads(const MuonOptions& options, size_t group) const;

  TensorParallelOptions tp_;
  std::shared_ptr<Orthogonalizer> local_;                 // unsharded parameters
  std::unordered_map<const void*, Layout> layouts_;  // by TensorImpl
  std::vector<Whole> wholes_;
};

/// The strategy of `TensorParallelMuon`, for `muon::Muon`'s and
/// `muon::AdaptiveMuon`'s strategy constructors.
std::shared_ptr<TensorParallelOrthogonalizer> make_orthogonalizer(TensorParallelOptions tp);

/// Muon over a mix of TP-sharded and whole matrices: a `muon::Muon` holding
/// the `TensorParallelOrthogonalizer` strategy.
///
///     auto [dp, tp] = world.mesh(2, 4);
///     muon::distributed::TensorParallelOptions tpo;
///     tpo.mode("distributed")
///        .shard(qkv, {{1536, 512}, 0, tp})    // column parallel
///        .shard(proj, {{512, 512}, 1, tp});   // row parallel
///     muon::distributed::TensorParallelMuon opt(params, muon::MuonOptions(0.02), tpo);
///
/// Construction is collective over every shard's group: the ranks exchange
/// their block shapes, and every rank raises the same c10::ValueError when
/// they disagree on the global shape, the partition dim, the mode or the
/// options of a shard's param group (naming the first field that differs,
/// e.g. "lr of the param group of sharded parameter 0 is 0.01 on rank 1,
/// 0.02 on rank 0"), or when the blocks do not tile the matrix (never a hang
/// or a wrong result).
/// A block may be empty (zero rows or columns: a matrix with fewer rows than
/// ranks); parameters that are not shards must not be.
/// `step` is collective too: every rank of a TP group must step the same
/// sharded parameters (all with gradients or all without), in the same
/// order. State (momentum of the local block) is per rank: `save` writes this
/// rank's part and `load` expects the archive this rank wrote (one file per
/// rank).
class TensorParallelMuon : public Muon {
 public:
  /// TP Muon over `param_groups` (groups without options get `defaults`).
  TensorParallelMuon(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     MuonOptions defaults, TensorParallelOptions tp);
  /// TP Muon over one group of `params`.
  TensorParallelMuon(std::vector<at::Tensor> params, MuonOptions defaults,
                     TensorParallelOptions tp);

  /// The options given at construction.
  const TensorParallelOptions& tp_options() const;
  /// Sizes of every rank's block along the partition dim of sharded
  /// `param`, in rank order (empty for an unsharded parameter).
  std::vector<int64_t> block_sizes(const at::Tensor& param) const;

 protected:
  /// "muon::distributed::TensorParallelMuon".
  std::string archive_kind() const override;

 private:
  TensorParallelMuon(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     MuonOptions defaults, std::shared_ptr<TensorParallelOrthogonalizer> strategy);

  std::shared_ptr<TensorParallelOrthogonalizer> strategy_;
};

/// A `muon::MuonFactory` that builds a `TensorParallelMuon` with `tp`, for
/// `muon::MuonWithAdamWOptions::muon_factory`: TP Muon for the matrices,
/// AdamW for the rest, one optimizer.
MuonFactory tensor_parallel_muon_factory(TensorParallelOptions tp);

}  // namespace muon::distributed
