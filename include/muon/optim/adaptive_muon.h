#pragma once

/// Muon with a second moment on the orthogonalized update (AdaMuon, NorMuon),
/// as Megatron-Core's TensorParallelAdaptiveMuon offers.
///
/// Steps 1–4 are Muon's (weight decay, momentum, Nesterov, Newton–Schulz:
/// see muon/optim/muon.h), giving O = newton_schulz(u) for the m×n matrix of
/// a parameter (conv weights flattened to (out, in·kh·kw)). Then, with a
/// second-moment buffer v (state) and β2, ε from `AdaptiveMuonOptions`:
///
/// normuon (Li et al. 2025, "NorMuon: Making Muon more efficient and
/// scalable", arXiv:2510.05491), one second moment per row (neuron), v ∈ R^m:
///
///   v ← β2·v + (1 − β2)·mean_j(O_ij²)           (mean over the columns)
///   Ô = O / (√v + ε)                             (row i divided by √v_i + ε)
///   Ô ← Ô · ‖O‖_F / max(‖Ô‖_F, ε)               (keep Muon's update norm)
///   update = Ô · scale_factor(m, n, scale_mode) · extra_scale_factor
///
/// adamuon (Si et al. 2025, "AdaMuon: Adaptive Muon Optimizer",
/// arXiv:2507.11005), one second moment per element, v ∈ R^{m×n}:
///
///   v ← β2·v + (1 − β2)·O²
///   Ô = O / (√v + ε)
///   update = Ô · 0.2·√(m·n) / max(‖Ô‖_F, ε) · extra_scale_factor
///
/// namo (NAMO, arXiv:2602.17080, as Emerging-Optimizers' adaptive_muon.py
/// `moment2_method="namo"`, commit 033065f9ea59f6de26bcb91bc586458a84b9400f):
/// one scalar second moment per matrix, of the raw gradient g's norm; the
/// orthogonalized update is scaled by the norm of the Nesterov/momentum
/// update u it came from, divided by √v:
///
///   v ← β2·v + (1 − β2)·‖g‖_F²
///   update = O · ‖u‖_F / (√v + ε) · scale_factor(m, n, scale_mode) · extra_scale_factor
///
/// v is stored with one copy per row ((rows, 1), every entry equal), not
/// as EO's one-element buffer, so that it splits with the rows like
/// NorMuon's and checkpoints reshard it with no special case. NAMO with
/// weight_decay_mode l2 is rejected (as in EO: g would include the decay).
///
/// The AdaMuon rescale makes the update's RMS 0.2 (AdamW's typical RMS), so
/// AdamW learning rates carry over; `scale_mode` is not used in that mode.
/// Neither mode applies bias correction to v (the rescale removes its effect
/// on the update's size; Megatron-Core does the same).
///
/// Differences from Megatron-Core's Emerging-Optimizers implementation: it
/// averages NorMuon's second moment over the longer side (per column for
/// wide matrices) and divides by √max(v, ε); here it is always per row, as
/// in the NorMuon paper, with √v + ε. Its AdaMuon branch applies Muon's
/// scale_mode instead of the 0.2·√(mn) RMS alignment of the AdaMuon paper.
///
/// Stacked experts and fused-QKV splits are not supported here (the groups
/// must leave `stacked_experts` off and `split_sizes` empty).
///
/// In a distributed layout (tensor-parallel blocks, row shards), v lives
/// with the part of the matrix a process holds; NorMuon's row means and
/// both norms are summed over the parts, so every layout gives the
/// single-process result.
#include <ATen/ATen.h>
#include <torch/arg.h>

#include <memory>
#include <string>
#include <vector>

#include "muon/enum_names.h"
#include "muon/optim/muon.h"
#include "muon/optim/orthogonalizer.h"

namespace muon {

/// Which second moment `AdaptiveMuon` keeps.
enum class AdaptiveMode {
  /// Per row of the orthogonalized update (NorMuon).
  kNorMuon,
  /// Per element (AdaMuon).
  kAdaMuon,
  /// One scalar per matrix, of the gradient's norm (NAMO).
  kNamo,
};

/// "normuon" | "adamuon" | "namo".
MUON_ENUM_NAMES(AdaptiveMode, parse_adaptive_mode);

/// The second-moment settings of `AdaptiveMuon`, shared by all its groups.
/// Defaults: normuon, β2 0.95, ε 1e-8 (NorMuon's and Megatron-Core's values).
struct AdaptiveMuonOptions {
  /// Which second moment.
  TORCH_ARG(AdaptiveMode, mode) = AdaptiveMode::kNorMuon;
  /// Decay of the second moment, in [0, 1).
  TORCH_ARG(double, beta2) = 0.95;
  /// Added to √v (and floor of the norms), > 0.
  TORCH_ARG(double, eps) = 1e-8;

 public:
  /// mode by name: "normuon" | "adamuon" | "namo".
  AdaptiveMuonOptions& mode(const std::string& name);
  /// Raises c10::ValueError "[muon::AdaptiveMuon] <arg> must be ..., got <value>".
  void validate() const;
  /// Field-wise equality.
  friend bool operator==(const AdaptiveMuonOptions& lhs, const AdaptiveMuonOptions& rhs);
};

/// Per-parameter state of `AdaptiveMuon`: Muon's plus the second moment.
struct AdaptiveMuonParamState : public MuonParamState {
  /// Second moment: (rows, 1) for normuon and namo (namo: every entry the
  /// same scalar), the matrix's (rows, cols) for adamuon; fp32 (fp64 for fp64 parameters); zeros at first use.
  TORCH_ARG(at::Tensor, second_moment);

 public:
  /// A copy of this state, of this type.
  std::unique_ptr<torch::optim::OptimizerParamState> clone() const override;
  /// Reads Muon's fields and, when present, `second_moment`.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes Muon's fields and, when defined, `second_moment`.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  ~AdaptiveMuonParamState() override = default;
};

/// The second-moment stage (muon/optim/orthogonalizer.h): the formulas at the
/// top of this header on a process's part of each matrix, with the row
/// statistics and the norms summed over the other parts through the
/// strategy, so it gives the single-process result in every layout. The
/// state of each item must be an `AdaptiveMuonParamState`.
class SecondMomentStage final : public UpdateStage {
 public:
  /// A stage with `options` (validated).
  explicit SecondMomentStage(AdaptiveMuonOptions options);

  /// Stacked experts and fused-QKV splits are not supported; nor is namo
  /// with weight_decay_mode l2.
  void check_options(const MuonOptions& options, size_t group) const override;
  void apply(OrthogonalizeItem& item, const Orthogonalizer& parts) const override;

  /// The settings in force.
  const AdaptiveMuonOptions& options() const { return options_; }
  /// Replaces the settings (validated; the mode must stay the same).
  void set_options(const AdaptiveMuonOptions& options);

 private:
  AdaptiveMuonOptions options_;
};

/// Muon with a NorMuon, AdaMuon or NAMO second moment (see the top of this header):
/// a `muon::Muon` holding a `SecondMomentStage`, over whole matrices or any
/// distributed layout's strategy.
///
///     muon::AdaptiveMuon opt(params, muon::MuonOptions(3e-4).scale_mode("spectral"),
///                            muon::AdaptiveMuonOptions().mode("normuon"));
///
/// Per-group MuonOptions as in `muon::Muon`; the adaptive settings are
/// optimizer-wide. save/load write both and check the archive's kind and mode.
class AdaptiveMuon : public Muon {
 public:
  /// AdaptiveMuon over `param_groups`; groups without options get `defaults`.
  AdaptiveMuon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults = {},
               AdaptiveMuonOptions adaptive = {});
  /// AdaptiveMuon over one group of `params`.
  AdaptiveMuon(std::vector<at::Tensor> params, MuonOptions defaults = {},
               AdaptiveMuonOptions adaptive = {});
  /// AdaptiveMuon whose orthogonalization is `orthogonalizer` (e.g.
  /// `muon::distributed::make_orthogonalizer(...)` for tensor-parallel blocks or row
  /// shards; construction and steps are then collective as that strategy says).
  AdaptiveMuon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults,
               AdaptiveMuonOptions adaptive, std::shared_ptr<Orthogonalizer> orthogonalizer);

  /// The second-moment settings.
  const AdaptiveMuonOptions& adaptive_options() const { return stage_->options(); }

  /// Muon's archive plus the adaptive settings.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores what `save` wrote; the archive's mode must equal this optimizer's.
  void load(torch::serialize::InputArchive& archive) override;

  /// Momentum and second-moment bytes.
  int64_t state_bytes() const override;

 protected:
  /// An empty AdaptiveMuonParamState.
  std::unique_ptr<MuonParamState> new_state(const at::Tensor& param) const override;
  /// "muon::AdaptiveMuon".
  std::string archive_kind() const override;

 private:
  AdaptiveMuon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults,
               std::shared_ptr<SecondMomentStage> stage,
               std::shared_ptr<Orthogonalizer> orthogonalizer);

  std::shared_ptr<SecondMomentStage> stage_;
};

}  // namespace muon
