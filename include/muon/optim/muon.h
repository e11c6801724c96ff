#pragma once

/// The Muon optimizer on `torch::optim` (Jordan et al. 2024, "Muon: An
/// optimizer for hidden layers in neural networks"; Liu et al. 2025,
/// "Muon is Scalable for LLM Training").
///
/// Muon is SGD with momentum whose update is replaced by its orthogonalized
/// version (the polar factor U·Vᵀ, approximated by `muon::newton_schulz`) and
/// rescaled by a shape-dependent factor. One step for a parameter p with
/// gradient g, in this order (Megatron-Core / TransformerEngine order):
///
///   1. weight decay   decoupled: p ← p·(1 − lr·wd); independent: p ← p·(1 − wd);
///                     palm: p ← p·(1 − lr²·wd); l2: g ← g + wd·p (before momentum);
///                     spectral_clipped: p ← spectral_clipped_weight_decay(p, β, lr·wd);
///                     cautious: at step 6 (it needs the update's sign)
///   2. momentum       ema: buf ← buf + (1 − μ)·(g − buf);  classic: buf ← μ·buf + g
///   3. nesterov       ema: u = g + μ·(buf − g);  classic: u = g + μ·buf;  else u = buf
///   4. orthogonalize  o = newton_schulz(u as matrices, ns); with spectral_update
///                     clip: o = spectral_clip(u, σmin, σmax), hardcap:
///                     o = spectral_hardcap(u, β) (muon/spectral.h)
///   5. scale          o ← o · scale_factor(rows, cols, scale_mode) · extra_scale_factor
///   6. update         p ← p − lr·o      (in the parameter's dtype); cautious decay
///                     first: p ← p − lr·wd·p·[p·o >= 0] with o the final update
///
/// Neither `p.grad()` nor the momentum buffer is ever modified by steps 3–5.
///
/// Shapes: a 2-D parameter is one matrix (rows = dim 0). A parameter with
/// ndim >= 3 is a convolution weight viewed as (dim 0, product of the other
/// dims), scaled from that 2-D shape; in a group with `stacked_experts(true)`
/// it is instead a stack of E = dim 0 expert matrices (dim 1, product of the
/// rest), orthogonalized as one batch. A group with `split_sizes` (fused QKV)
/// splits every matrix along dim 0, per query group, and orthogonalizes and
/// scales each block on its own. Parameters with fewer than two dimensions are
/// rejected: give them to AdamW, e.g. through `muon::MuonWithAdamW`
/// (muon/optim/hybrid.h).
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "muon/enum_names.h"
#include "muon/newton_schulz.h"
#include "muon/optim/orthogonalizer.h"
#include "muon/optim/settings_digest.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"
#include "muon/scaling.h"

namespace muon {
namespace detail {
struct FusedScratch;
}  // namespace detail

/// How the momentum buffer accumulates gradients.
enum class MomentumStyle {
  /// buf ← μ·buf + (1 − μ)·g (Megatron-Core, TransformerEngine, torch.optim.Muon);
  /// nesterov update g + μ·(buf − g).
  kEma,
  /// buf ← μ·buf + g (Moonlight, Dion, SGD); nesterov update g + μ·buf.
  kClassic,
};

/// "ema" | "classic".
MUON_ENUM_NAMES(MomentumStyle, parse_momentum_style);

/// How weight decay enters the step.
enum class WeightDecayMode {
  /// p ← p·(1 − lr·wd) (AdamW-style, scales with the learning rate).
  kDecoupled,
  /// p ← p·(1 − wd) (independent of the learning rate).
  kIndependent,
  /// g ← g + wd·p before momentum (classic L2 regularization).
  kL2,
  /// p ← p·(1 − lr²·wd) (Emerging-Optimizers' "palm": the decay shrinks
  /// with the square of the learning rate, so it fades with the schedule).
  kPalm,
  /// p ← spectral_clipped_weight_decay(p, spectral_wd_beta, lr·wd)
  /// (muon/spectral.h; the decoupled form of
  /// https://leloykun.github.io/ponder/spectral-clipping/): each matrix's
  /// singular values above β move a fraction c = lr·wd towards β, the rest
  /// stay; needs c in [0, 1] and whole matrices on this process.
  kSpectralClipped,
  /// p ← p − lr·wd·p·m, m = [p·(alpha·o) >= 0] element-wise, at step 6 just
  /// before the update, with o the final update (after any UpdateStage):
  /// cautious weight decay (arXiv:2510.12402; microsoft/dion
  /// dion/muon.py muon_update_post_orthogonalize). Elements whose update
  /// points against their sign keep their value but for the update.
  kCautious,
};

/// "decoupled" | "independent" | "l2" | "palm" | "spectral_clipped" | "cautious".
MUON_ENUM_NAMES(WeightDecayMode, parse_weight_decay_mode);

/// What step 4 makes of the update's matrices (muon/spectral.h).
enum class SpectralUpdate {
  /// newton_schulz(u, ns): Muon's orthogonalization.
  kNone,
  /// spectral_clip(u, spectral_sigma_min, spectral_sigma_max) = U·clamp(Σ)·Vᵀ.
  kClip,
  /// spectral_hardcap(u, spectral_hardcap_beta) = U·min(Σ, β)·Vᵀ.
  kHardcap,
};

/// "none" | "clip" | "hardcap".
MUON_ENUM_NAMES(SpectralUpdate, parse_spectral_update);

/// Default learning rate: Keller Jordan's 0.02, tuned for `kShapeScaling`.
constexpr double kDefaultMuonLr = 0.02;
/// Default momentum μ: 0.95, used by every public Muon implementation.
constexpr double kDefaultMuonMomentum = 0.95;

/// Options of `muon::Muon` (per parameter group), as chained setters.
///
/// Defaults and why:
///  - lr 0.02 with scale_mode shape_scaling: Keller Jordan's pairing, the
///    most widely tuned one (modded-nanogpt). An m×n orthogonalized update
///    has RMS 1/√max(m, n), times √max(1, m/n): lr lives on SGD's scale, not
///    AdamW's (with spectral scaling the RMS is 1 and lr ~3e-4 is typical).
///  - momentum 0.95, nesterov on, ema style: the setting of torch.optim.Muon,
///    Megatron-Core and TransformerEngine (EMA keeps the buffer on the
///    gradient's scale, so the step size does not depend on μ).
///  - weight_decay 0 (mode decoupled): the optimizer does exactly the Muon
///    update unless asked; a good decay depends on lr and model (0.01–0.1
///    decoupled in the field).
///  - ns: quintic ×5, fp32 compute, eps 1e-7 added to the norm
///    (NewtonSchulzOptions' defaults, Megatron-Core's schedule): full
///    precision by default. bf16
///    (`ns_compute_dtype(at::kBFloat16)`), what Keller's and torch.optim's
///    Muon use, is ~1.5× faster where bf16 matrix units exist
///    (docs/optimizer.md).
///  - extra_scale_factor 1; stacked_experts off; no QKV split.
struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions>,
                     public DigestibleOptions {
  /// Options with learning rate `lr` and every other field at its default.
  MuonOptions(double lr = kDefaultMuonLr) : lr_(lr) {}  // NOLINT(google-explicit-constructor): torch pattern

  /// Learning rate, >= 0.
  TORCH_ARG(double, lr);
  /// Momentum μ in [0, 1).
  TORCH_ARG(double, momentum) = kDefaultMuonMomentum;
  /// Use the Nesterov look-ahead update instead of the buffer itself.
  TORCH_ARG(bool, nesterov) = true;
  /// EMA (default) or classic momentum accumulation.
  TORCH_ARG(MomentumStyle, momentum_style) = MomentumStyle::kEma;
  /// Weight decay coefficient, >= 0.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// How weight decay is applied (decoupled by default).
  TORCH_ARG(WeightDecayMode, weight_decay_mode) = WeightDecayMode::kDecoupled;
  /// Newton–Schulz options: coefficient set, steps, eps, compute dtype, method.
  TORCH_ARG(NewtonSchulzOptions, ns);
  /// Shape-dependent scale of the orthogonalized update.
  TORCH_ARG(ScaleMode, scale_mode) = ScaleMode::kShapeScaling;
  /// Extra multiplier of the scale, finite and > 0 (0.2 with spectral = Moonlight).
  TORCH_ARG(double, extra_scale_factor) = 1.0;
  /// Treat parameters with ndim >= 3 as stacks of expert matrices
  /// (E, out, in...) and orthogonalize each expert, as one batch.
  TORCH_ARG(bool, stacked_experts) = false;
  /// Fused QKV: split every matrix of the group along dim 0 into blocks of
  /// these sizes (per query group), one Newton–Schulz and one scale per block
  /// ([q, k, v], or [q, q, k, v] with an output gate). Empty: no split.
  TORCH_ARG(std::vector<int64_t>, split_sizes) = {};
  /// Query groups G of a split matrix: its dim 0 is viewed as
  /// (G, sum(split_sizes)) and block i gathers rows of size split_sizes[i]
  /// from every query group (a (G·split_sizes[i]) × cols matrix).
  TORCH_ARG(int64_t, num_query_groups) = 1;
  /// Per-head orthogonalization (microsoft/dion's per-group `num_heads`):
  /// 0 or 1 off; H > 1 divides the rows of every matrix of the group into H
  /// equal blocks of consecutive rows (rows/H each, head h the rows
  /// [h·rows/H, (h+1)·rows/H)), one Newton–Schulz and one scale per block,
  /// taken from the block's shape. With split_sizes, each split block's rows
  /// are divided so (per head within each block). 2-D parameters only (not
  /// stacked experts or convolutions); the rows (of each split block) must
  /// be divisible by H.
  TORCH_ARG(int64_t, num_heads) = 0;
  /// β of weight_decay_mode spectral_clipped, finite and > 0.
  TORCH_ARG(double, spectral_wd_beta) = 1.0;
  /// Step 4: Newton–Schulz (none) or a spectral clip / hardcap of the update
  /// (Emerging-Optimizers' emerging_optimizers/orthogonalized_optimizers/
  /// spectral_clipping_utils.py at commit 319d2c6248602a81de26a2493856d29f9e1cd0eb,
  /// applied as https://leloykun.github.io/ponder/spectral-clipping/ applies
  /// it: in place of the orthogonalization). Muon's scale (step 5) still
  /// applies, so σmin = σmax = 1 is Muon's step with an exact msign. The
  /// group's `ns` options are not used by it (the spectral functions run
  /// their own Newton–Schulz). Needs whole matrices on this process.
  TORCH_ARG(SpectralUpdate, spectral_update) = SpectralUpdate::kNone;
  /// σmin of spectral_update clip (EO's default −1); <= spectral_sigma_max.
  TORCH_ARG(double, spectral_sigma_min) = -1.0;
  /// σmax of spectral_update clip (EO's default 1).
  TORCH_ARG(double, spectral_sigma_max) = 1.0;
  /// β of spectral_update hardcap, finite and > 0 (default 1).
  TORCH_ARG(double, spectral_hardcap_beta) = 1.0;

 public:
  /// momentum_style by name: "ema" | "classic".
  MuonOptions& momentum_style(const std::string& name);
  /// weight_decay_mode by name: "decoupled" | "independent" | "l2" | "palm" |
  /// "spectral_clipped" | "cautious".
  MuonOptions& weight_decay_mode(const std::string& name);
  /// spectral_update by name: "none" | "clip" | "hardcap".
  MuonOptions& spectral_update(const std::string& name);
  /// Whether a step needs whole matrices on this process beyond step 4's
  /// Newton–Schulz: a spectral_update, or spectral_clipped weight decay.
  bool needs_spectral() const;
  /// scale_mode by name: "shape_scaling" | "spectral" | "unit_rms_norm" | "match_rms_adamw".
  MuonOptions& scale_mode(const std::string& name);

  /// Shorthands for fields of `ns`, validated with messages that name them.
  /// Built-in coefficient set by name (see muon::coefficient_set_names()).
  MuonOptions& ns_coefficients(const std::string& name);
  /// Newton–Schulz steps, in [1, 100).
  MuonOptions& ns_steps(int64_t steps);
  /// Newton–Schulz normalization epsilon, > 0.
  MuonOptions& ns_eps(double eps);
  /// Where the normalization epsilon enters, by name: "add" (default) |
  /// "clamp" (muon::NsEpsMode).
  MuonOptions& ns_eps_mode(const std::string& name);
  /// Newton–Schulz compute dtype (kFloat, kBFloat16, kDouble; kHalf off CPU).
  MuonOptions& ns_compute_dtype(at::ScalarType dtype);

  /// Checks every field; raises c10::ValueError "[muon::Muon] <arg> must be ..., got <value>".
  void validate() const;

  /// Reads every field written by the other overload (modes by name, the
  /// full coefficient set, so custom sets round-trip).
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes every field.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Mixes every field that changes a step (lr aside) into `digest`.
  void mix_settings(SettingsDigest& digest) const override;
  /// Field-wise equality (ns compared with NewtonSchulzOptions::operator==).
  friend bool operator==(const MuonOptions& lhs, const MuonOptions& rhs);
  ~MuonOptions() override = default;
  /// `lr()`, for LR schedulers.
  double get_lr() const override;
  /// `lr(lr)`, for LR schedulers.
  void set_lr(double lr) override;
};

/// Raises c10::ValueError, as `who` (e.g. "[muon::distributed::ShardedMuon] "), for
/// the options of param group `group` that need whole matrices on this
/// process (muon_spectral_update other than none, muon_weight_decay_mode
/// spectral_clipped), naming the option, its value and `layout`, the layout
/// that splits them. Layouts whose processes hold parts of matrices call it
/// from Orthogonalizer::check_options.
void check_spectral_options_need_whole_matrices(const MuonOptions& options, size_t group,
                                                const std::string& who, const std::string& layout);

/// Per-parameter state of `muon::Muon`.
struct MuonParamState : public torch::optim::OptimizerCloneableParamState<MuonParamState> {
  /// Steps taken on this parameter.
  TORCH_ARG(int64_t, step) = 0;
  /// Momentum buffer: parameter's shape, dtype and device; zeros at first use.
  TORCH_ARG(at::Tensor, momentum_buffer);

 public:
  /// Reads `step` and, when present, `momentum_buffer`.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes `step` and, when defined, `momentum_buffer`.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Equal step and bit-equal buffers (both undefined counts as equal).
  friend bool operator==(const MuonParamState& lhs, const MuonParamState& rhs);
  ~MuonParamState() override = default;
};

/// The Muon optimizer: a drop-in `torch::optim::Optimizer` for matrix-shaped
/// parameters (see the top of this header for the step and the shapes).
///
///     muon::Muon opt(model->parameters(), muon::MuonOptions(0.02).weight_decay(0.01));
///     loss.backward(); opt.step(); opt.zero_grad();
///
/// Per-group options, `get_lr`/`set_lr` (so torch::optim::StepLR and any
/// LRScheduler drive it), `save`/`load` through torch::serialize archives
/// (a run saved, loaded into a fresh optimizer and continued is bit-identical
/// to one that never stopped). Validation happens at construction and again
/// at each step, for every group before any is stepped, with the checks of
/// muon/optim/step_guard.h (gradients, the non-finite policy).
///
/// Step 4 runs through the `Orthogonalizer` the optimizer holds
/// (muon/optim/orthogonalizer.h): whole matrices on this process by
/// default, tensor-parallel blocks or row shards with the strategies of
/// muon/distributed/. An optional `UpdateStage` (the NorMuon / AdaMuon second
/// moment) runs after it, in any layout.
class Muon : public torch::optim::Optimizer, public StateBytes, public StepGuard {
 public:
  /// Muon over `param_groups`; groups without options get `defaults`.
  explicit Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                MuonOptions defaults = {});
  /// Muon over one group of `params`.
  explicit Muon(std::vector<at::Tensor> params, MuonOptions defaults = {});
  /// Muon whose orthogonalization is `orthogonalizer` (e.g. a distributed
  /// layout's; its `attach` runs here, collectively for those), followed by
  /// `stage` when given.
  Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults,
       std::shared_ptr<Orthogonalizer> orthogonalizer,
       std::shared_ptr<const UpdateStage> stage = nullptr);

  /// One step on every parameter that has a gradient (others are skipped and
  /// get no state). `closure`, if given, runs first with grad mode enabled
  /// and its loss is returned. Before anything changes, the checks of
  /// muon/optim/step_guard.h run: a failure raises and a non-finite gradient
  /// raises or skips the step, under the policy.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Validates every group (options, parameters, what the strategy and the
  /// stage support); raises c10::ValueError, changing nothing.
  void check_before_step() override;
  /// Agreed through the strategy (collective for distributed ones).
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) override;

  /// Writes every group's options and every parameter's state, by position.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores options and state saved by `save` into an optimizer with the
  /// same groups (same count, parameter counts and shapes) and the same
  /// orthogonalization strategy; raises c10::ValueError otherwise.
  void load(torch::serialize::InputArchive& archive) override;

  /// Bytes held in optimizer state tensors (momentum buffers, plus what a
  /// subclass keeps).
  int64_t state_bytes() const override;

  /// The orthogonalization strategy.
  const Orthogonalizer& orthogonalizer() const { return *orthogonalizer_; }

 protected:
  /// A fresh, empty state for `param` (its momentum buffer is created at
  /// first use). Subclasses with more state return their own derived type;
  /// `load` deserializes into it.
  virtual std::unique_ptr<MuonParamState> new_state(const at::Tensor& param) const;
  /// The identifier `save` writes and `load` requires ("muon::Muon").
  virtual std::string archive_kind() const;
  /// Validates group `index`: options type and values, parameter shapes,
  /// what the strategy and the stage support.
  void check_group(size_t index) const;

 private:
  /// Steps every parameter with a gradient (after the step's checks).
  void step_parameters();
  /// The state of `param`, created at first use, with its momentum buffer
  /// (zeros of the parameter's shape, dtype, device and layout).
  MuonParamState& state_of(const at::Tensor& param);

  std::shared_ptr<Orthogonalizer> orthogonalizer_;
  std::shared_ptr<const UpdateStage> stage_;
  /// Buffers of the fused passes' Newton–Schulz, one per worker thread,
  /// reused from step to step.
  std::shared_ptr<detail::FusedScratch> scratch_;
};

}  // namespace muon
