#pragma once

/// How `muon::Muon` turns momentum into an orthogonalized update: the one
/// narrow interface behind which every layout sits.
///
/// Steps 1–3 (weight decay, momentum, Nesterov) and 6 (the update) are
/// element-wise and run on whatever tensor a process holds. Step 4 needs the
/// whole matrix, and a layout says how to get it. `Muon` holds one
/// `Orthogonalizer`, chosen when it is built, and hands it the updates of a
/// step; the strategy returns each one's orthogonalized part and the scale
/// still to apply:
///
///   local (single process)  newton_schulz on each whole matrix   muon::make_local_orthogonalizer
///   tensor parallel         duplicated | distributed | blockwise  muon::distributed::make_orthogonalizer(TensorParallelOptions)
///   row shards (ZeRO/FSDP)  owner-compute | replicated            muon::distributed::make_orthogonalizer(ShardedOptions)
///
/// Stages that need statistics of the whole matrix (the NorMuon / AdaMuon
/// second moment, muon/optim/adaptive_muon.h) work on a process's part and
/// ask the strategy to sum partial statistics over the other parts
/// (`sum_parts`), so they compose with every layout.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace muon {

struct MuonOptions;
struct MuonParamState;

/// One parameter's orthogonalization in a step: the inputs `Muon` fills in,
/// and the results the strategy writes.
struct OrthogonalizeItem {
  /// This process's tensor of the parameter (a whole matrix, a tensor-parallel
  /// block or a row shard).
  at::Tensor param;
  /// Its Nesterov/momentum update: param's shape, never aliasing the momentum
  /// buffer or the gradient.
  at::Tensor update;
  /// The options of its param group.
  const MuonOptions* options = nullptr;
  /// Its param group's index.
  size_t group = 0;
  /// Its state (this step already counted).
  MuonParamState* state = nullptr;

  /// Result: the orthogonalized update of this process's part (param's
  /// element count), not yet multiplied by −lr·alpha.
  at::Tensor orth;
  /// Result: the scale still to apply (1 when `orth` is fully scaled).
  double alpha = 1.0;
  /// Result: the shape of the matrix the scale is taken from (the whole
  /// matrix; a block in blockwise tensor parallelism).
  int64_t rows = 0;
  /// See `rows`.
  int64_t cols = 0;
  /// What an `UpdateStage` keeps from `apply` to `after_update` (e.g. the
  /// weight norm before the update); undefined otherwise.
  at::Tensor stage_scratch;
};

/// Which parts of a split matrix `Orthogonalizer::sum_parts` sums over.
enum class PartSum {
  /// Every part of the matrix: a statistic of the whole matrix (a norm).
  kWholeMatrix,
  /// The parts that hold the same rows: a per-row statistic (a row mean).
  kRows,
};

/// The strategy that orthogonalizes `Muon`'s updates (see the top of this
/// header). Implementations are held by the optimizer, not derived from it.
///
/// One operation, `orthogonalize`, like Ceres's `LinearSolver::Solve`; what
/// `Muon` needs to know about a strategy to drive it is a plain `Traits`
/// value given at construction, not a virtual. The other virtuals are the
/// points where a distributed strategy must communicate or validate:
///
///   name                archives record the layout a state belongs to
///   attach, begin_step  distributed strategies exchange and check their
///                       layouts (collective), once and before every step
///   max_over_processes  the checks before a step agree over the processes
///                       of the layout (muon/optim/step_guard.h)
///   check_options       what options a layout cannot apply (per group)
///   orthogonalize       the operation itself
///   sum_parts           whole-matrix statistics of split matrices, for the
///                       update stages (NorMuon / AdaMuon)
class Orthogonalizer {
 public:
  /// How `Muon` hands a step's parameters to the strategy, fixed for the
  /// strategy's lifetime.
  struct Traits {
    /// Parameters of zero size are valid (empty blocks or shards of a split
    /// matrix); otherwise `Muon` rejects them.
    bool empty_parts = false;
    /// Steps 1–6 of a contiguous fp32 CPU parameter may run as Muon's fused
    /// passes instead of `orthogonalize`: true only where the update is
    /// Muon's own Newton–Schulz on whole matrices of this process.
    bool fuses = false;
    /// `Muon` hands the waiting parameters over once they hold at least this
    /// many elements (0: each parameter alone; more: batches, bounding the
    /// updates alive at once), and the rest at the end of the step, in a
    /// call made even when none waits. -1: every parameter of a step in that
    /// one last call (collective strategies that batch need that).
    int64_t call_elements = 0;
  };

  /// A strategy that `Muon` hands one parameter at a time, none empty.
  Orthogonalizer() = default;
  /// A strategy driven as `traits` says.
  explicit Orthogonalizer(Traits traits) : traits_(traits) {}
  virtual ~Orthogonalizer() = default;

  /// How `Muon` drives this strategy (see Traits).
  const Traits& traits() const { return traits_; }

  /// A short name, written in archives ("local", "tensor_parallel", "sharded").
  virtual std::string name() const = 0;
  /// Called once by the optimizer's constructor, after its groups are
  /// validated. Distributed strategies exchange their layouts here, so it is
  /// collective for them.
  virtual void attach(const std::vector<torch::optim::OptimizerParamGroup>& groups);
  /// Called at the start of every step, before any state changes: checks what
  /// must hold across processes (collective for distributed strategies).
  virtual void begin_step(const std::vector<torch::optim::OptimizerParamGroup>& groups);
  /// The largest `code` over every process this strategy's steps involve, and
  /// the lowest rank (in its first group) that passed it: how the checks
  /// before a step (muon/optim/step_guard.h) agree. {code, 0} by default;
  /// collective for distributed strategies.
  virtual std::pair<int64_t, int64_t> max_over_processes(int64_t code) const;
  /// Raises c10::ValueError, naming group `group`, for options this strategy
  /// cannot apply (e.g. fused-QKV splits on row shards).
  virtual void check_options(const MuonOptions& options, size_t group) const;
  /// Writes `orth`, `alpha`, `rows` and `cols` of every item. Collective for
  /// distributed strategies: every process of a group passes its parts of
  /// the same matrices in the same order.
  virtual void orthogonalize(std::vector<OrthogonalizeItem>& items) = 0;
  /// Sums `partial`, a statistic of this process's part of `item`'s matrix,
  /// over the processes that hold its other parts (see PartSum), in place.
  /// For a kRows sum, `partial` has one entry per local row. The default
  /// (whole matrices) leaves it as it is. Collective where parts are split.
  virtual void sum_parts(const OrthogonalizeItem& item, at::Tensor& partial, PartSum what) const;

 private:
  Traits traits_;
};

/// Whole matrices on this process: `muon::newton_schulz` on each parameter's
/// matrices, scaled from their shape, fused passes where they apply. The
/// strategy of a single-process `muon::Muon`.
std::shared_ptr<Orthogonalizer> make_local_orthogonalizer();

/// One stage after orthogonalization, run on every item before the update
/// (e.g. the NorMuon / AdaMuon second moment): may rewrite `orth` and `alpha`.
/// It sees a process's part and uses `parts.sum_parts` for whole-matrix
/// statistics, so it works in every layout.
class UpdateStage {
 public:
  virtual ~UpdateStage() = default;
  /// Raises c10::ValueError, naming group `group`, for options it cannot apply.
  virtual void check_options(const MuonOptions& options, size_t group) const;
  /// Rewrites `item.orth` and `item.alpha`.
  virtual void apply(OrthogonalizeItem& item, const Orthogonalizer& parts) const = 0;
  /// Runs once the update p ← p − lr·alpha·orth of every item of a call is
  /// applied, on those items: may change the parameters further (SPEL's
  /// re-orthogonalization of the weight, MuonHyperball's renormalization),
  /// with `parts.sum_parts` for whole-matrix statistics and
  /// `parts.orthogonalize` for whole-matrix Newton–Schulz of other tensors
  /// of the same parameters. Collective as `orthogonalize` is (called even
  /// with no item). The default does nothing.
  virtual void after_update(std::vector<OrthogonalizeItem>& items, Orthogonalizer& parts) const;
};

}  // namespace muon
