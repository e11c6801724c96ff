#pragma once

/// The ways muon-train-gpt lays a run over its ranks (--parallel), each
/// giving the same training curve as one process up to float rounding:
///
///   single      one process.
///   ddp         data parallel: whole model and gradients averaged by
///               all-reduce on every rank; the optimizer layer-wise (each
///               rank updates the parameters it owns, then all-gathers
///               them) or replicated (--optimizer-layout).
///   sharded     sharded data parallel (ZeRO-2, muon::distributed::ShardedDataParallel):
///               gradients reduce-scattered into row shards, optimizer state
///               and master rows only for this rank's shard (Muon
///               owner-compute over whole matrices), updated rows all-gathered.
///   tp          tensor parallel (Megatron): the attention and MLP matrices
///               split over a tensor-parallel group of --tp ranks, Muon on
///               the blocks (muon::distributed::TensorParallelMuon); the remaining
///               ranks (world / tp) are data parallel with averaged gradients.
///   tp,sharded  2-D: tensor parallel inside (--tp ranks), sharded data
///               parallel outside, on a (world / tp, tp) mesh.
#include <memory>
#include <string>
#include <vector>

#include "gpt.h"
#include "muon/config.h"
#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/runtime/group.h"
#include "trainer.h"

namespace train_gpt {

/// A value of --parallel.
enum class Parallel { kSingle, kDdp, kSharded, kTensorParallel, kTensorSharded };

/// "single" | "ddp" | "sharded" | "tp" | "tp,sharded".
std::string to_string(Parallel parallel);
/// Inverse of to_string; other names raise c10::ValueError listing the valid ones.
Parallel parse_parallel(const std::string& name);
/// Every value, in the order above.
const std::vector<Parallel>& all_parallel();

/// The groups of a layout on this rank.
struct Mesh {
  /// Every rank.
  muon::distributed::Group world;
  /// The ranks that split each global batch (and, sharded, the shards).
  muon::distributed::Group dp;
  /// The ranks that split the matrices (size 1 without tensor parallelism).
  muon::distributed::Group tp;
  /// Every distinct group above, once each (for bytes sent).
  std::vector<muon::distributed::Group> distinct;
};

/// The tensor-parallel size of `parallel` at `world` ranks for --tp `tp`
/// (0: the default, all ranks for tp and 2 for tp,sharded; 1 without tensor
/// parallelism). Raises c10::ValueError naming the flags when the world
/// does not divide, or the model has fewer heads than the size.
int tensor_parallel_size(Parallel parallel, int world, int tp, int64_t heads);

/// The mesh of `parallel` over `world` with `tp_size` tensor-parallel ranks
/// (collective over `world` for the tensor-parallel layouts).
Mesh make_mesh(Parallel parallel, const muon::distributed::Group& world, int tp_size);

/// The layout in words, for logs and checkpoints ("layer-wise", "sharded",
/// "tensor parallel 2", "2-D 2 × 2", ...).
std::string describe(Parallel parallel, const Mesh& mesh, const std::string& optimizer_layout);

/// How a run of `config` steps `model` in `parallel` over `mesh`: broadcasts
/// the data-parallel rank 0's parameters over `mesh.dp` (as DDP does), then
/// builds the muon::distributed::Layout the config's `layout` field names (set
/// here from `parallel`; for ddp, `optimizer_layout`: "layerwise" or
/// "replicated"). Collective.
std::unique_ptr<muon::distributed::Layout> make_layout(Parallel parallel, const Mesh& mesh, Gpt& model,
                                                muon::OptimizerConfig config,
                                                const std::string& optimizer_layout);

}  // namespace train_gpt
