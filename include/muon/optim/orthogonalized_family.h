#pragma once

/// Emerging-Optimizers' orthogonalized family beside Muon: PolarGrad, Scion,
/// MOP, SPEL and MuonHyperball, each a `muon::Muon` (steps 1–3: weight decay, EMA momentum,
/// optional Nesterov, see muon/optim/muon.h) with its own orthogonalization
/// or scale. For the m×n matrix of a parameter (conv weights flattened to
/// (out, in·kh·kw)), M its momentum (or Nesterov) update:
///
/// polargrad (Lau et al. 2025, "PolarGrad: A Class of Matrix-Gradient
/// Optimizers from a Unifying Preconditioning Perspective", arXiv:2505.21799;
/// EO emerging_optimizers/orthogonalized_optimizers/polargrad.py at
/// 21842b46073b778878c615211296d69e5757ac94):
///
///   O = newton_schulz(M)
///   update = O · ⟨O, M⟩ · extra_scale_factor      (⟨O, M⟩ ≈ ‖M‖_*, the nuclear norm)
///
/// scion (Pethick et al. 2025, "Training Deep Learning Models with
/// Norm-Constrained LMOs", arXiv:2502.07529; EO scion.py at
/// 05af9b90da99c3a10f654c52e6ff7b7292208adf):
///
///   update = newton_schulz(M) · √(m/n) · spectral_radius · extra_scale_factor
///
///   with weight decay fixed at 1, decoupled (p ← p·(1 − lr), the Frank–Wolfe
///   step) and no Nesterov, as EO fixes them: groups must say so.
///
/// mop (Momentum Orthogonalized by Polar decomposition; EO mop.py at
/// 024537490aff5996607da7e438517d450b6cee95):
///
///   U Σ Vᵀ = svd(M);  update = U·Vᵀ · scale_factor(m, n, scale_mode) · extra_scale_factor
///
///   The exact polar factor by SVD replaces Newton–Schulz, so MOP needs whole
///   matrices: it runs on one process and in the layerwise layout (each
///   owner holds whole matrices); tensor-parallel blocks and row shards
///   raise c10::ValueError naming the layout.
///
/// spel (SPectral steepest descent on the stiEfeL manifold, "Manifold
/// Constrained Steepest Descent", arXiv:2601.21487; EO spel.py at
/// 2d25b60cae465aa66124485d77addc7b5943bf46):
///
///   update = newton_schulz(M)  (no scale);  after the update p ← newton_schulz(p)
///
///   (the outer msign re-projects the weight onto the Stiefel manifold, with
///   the same Newton–Schulz options).
///
/// muon_hyperball (EO muon_hyperball.py at
/// 0186c40cb5e39ea460a17f8764a46d31a3f91ced, Muon's update on a sphere):
///
///   R = hyperball_radius, or ‖p‖_F after the weight decay when it is 0 (EO's None)
///   u = newton_schulz(M)·scale_factor(m, n, scale_mode)·extra_scale_factor
///   p ← p − lr·R·u / max(‖u‖_F, eps);  p ← R·p / max(‖p‖_F, eps)
///
///   With a radius, construction rescales every parameter to norm R (EO
///   does the same) and raises for a parameter of zero norm.
///
/// Then p ← p − lr·update for all. PolarGrad, Scion and SPEL do not read
/// `scale_mode` (their scale is their own; SPEL's is 1, extra_scale_factor
/// not read either). Stacked experts and fused-QKV
/// splits are not supported (groups must leave `stacked_experts` off and
/// `split_sizes` empty), as in EO, whose step orthogonalizes each parameter
/// as one matrix.
///
/// PolarGrad's ⟨O, M⟩ and MuonHyperball's norms are whole-matrix sums: in a
/// distributed layout each process sums its part and the strategy sums the
/// parts (`sum_parts`); SPEL's Newton–Schulz of the weight runs through the
/// layout's strategy, as the update's does. So all but MOP give the
/// single-process result in every layout.
#include <ATen/ATen.h>
#include <torch/arg.h>

#include <memory>
#include <string>
#include <vector>

#include "muon/enum_names.h"
#include "muon/optim/muon.h"
#include "muon/optim/orthogonalizer.h"

namespace muon {

/// Which member of the family an `OrthogonalizedVariant` is.
enum class OrthogonalizedKind {
  /// Newton–Schulz scaled by ⟨O, M⟩ (PolarGrad).
  kPolarGrad,
  /// Newton–Schulz scaled by √(m/n)·spectral_radius, weight decay 1 (Scion).
  kScion,
  /// Exact polar factor by SVD, Muon's scale (MOP).
  kMop,
  /// Newton–Schulz, no scale, the weight re-orthogonalized after the update (SPEL).
  kSpel,
  /// Muon's update normalized to the weight's sphere, the weight kept on it (MuonHyperball).
  kMuonHyperball,
};

/// "polargrad" | "scion" | "mop" | "spel" | "muon_hyperball" (the registry names).
MUON_ENUM_NAMES(OrthogonalizedKind, parse_orthogonalized_kind);

/// The variant's own settings, shared by all its groups.
struct OrthogonalizedVariantOptions {
  /// Which variant.
  TORCH_ARG(OrthogonalizedKind, kind) = OrthogonalizedKind::kPolarGrad;
  /// Scion's spectral radius (the LMO's radius), finite and > 0; EO's default 1.
  TORCH_ARG(double, spectral_radius) = 1.0;
  /// MuonHyperball's radius R, >= 0; 0 (EO's None): each parameter's norm
  /// after the weight decay, every step.
  TORCH_ARG(double, hyperball_radius) = 0.0;
  /// MuonHyperball's floor of the norms it divides by, > 0; EO's default 1e-8.
  TORCH_ARG(double, hyperball_eps) = 1e-8;

 public:
  /// Raises c10::ValueError "[muon::<Name>] <arg> must be ..., got <value>".
  void validate() const;
  /// Field-wise equality.
  friend bool operator==(const OrthogonalizedVariantOptions& lhs,
                         const OrthogonalizedVariantOptions& rhs);
};

/// The variant's stage (muon/optim/orthogonalizer.h): PolarGrad's ⟨O, M⟩
/// scale (summed over the parts of the matrix), Scion's and MOP's scales,
/// on a process's part of each matrix.
class OrthogonalizedVariantStage final : public UpdateStage {
 public:
  /// A stage with `options` (validated).
  explicit OrthogonalizedVariantStage(OrthogonalizedVariantOptions options);

  /// Stacked experts and fused-QKV splits are not supported; Scion needs
  /// weight_decay 1 (decoupled) and nesterov off.
  void check_options(const MuonOptions& options, size_t group) const override;
  void apply(OrthogonalizeItem& item, const Orthogonalizer& parts) const override;
  /// SPEL: p ← newton_schulz(p) through `parts`; MuonHyperball: p ← R·p/‖p‖.
  void after_update(std::vector<OrthogonalizeItem>& items, Orthogonalizer& parts) const override;

  /// The settings in force.
  const OrthogonalizedVariantOptions& options() const { return options_; }
  /// Replaces the settings (validated; the kind must stay the same).
  void set_options(const OrthogonalizedVariantOptions& options);

 private:
  OrthogonalizedVariantOptions options_;
};

/// Whole matrices on this process, orthogonalized by their exact polar
/// factor U·Vᵀ (SVD), scaled from their shape as Muon's are: MOP's
/// strategy. Named "local" (it is the single-process strategy of MOP).
std::shared_ptr<Orthogonalizer> make_polar_orthogonalizer();

/// A member of the family (see the top of this header): a `muon::Muon`
/// holding an `OrthogonalizedVariantStage` (and, for MOP, the SVD strategy).
///
///     muon::OrthogonalizedVariant opt(params, muon::MuonOptions(3e-4).nesterov(false),
///         muon::OrthogonalizedVariantOptions().kind(muon::OrthogonalizedKind::kPolarGrad));
///
/// save/load write and check the kind ("muon::PolarGrad", "muon::Scion",
/// "muon::MOP", "muon::SPEL", "muon::MuonHyperball") and the variant's settings.
class OrthogonalizedVariant : public Muon {
 public:
  /// The variant over `param_groups` on one process; groups without options get `defaults`.
  OrthogonalizedVariant(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                        MuonOptions defaults, OrthogonalizedVariantOptions variant);
  /// The variant over one group of `params`.
  OrthogonalizedVariant(std::vector<at::Tensor> params, MuonOptions defaults,
                        OrthogonalizedVariantOptions variant);
  /// The variant with a distributed layout's strategy (collective as that
  /// strategy says). MOP raises c10::ValueError for any strategy but a
  /// whole-matrix one ("local").
  OrthogonalizedVariant(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                        MuonOptions defaults, OrthogonalizedVariantOptions variant,
                        std::shared_ptr<Orthogonalizer> orthogonalizer);

  /// The variant's settings.
  const OrthogonalizedVariantOptions& variant_options() const { return stage_->options(); }

  /// Muon's archive plus the variant's settings.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores what `save` wrote; the archive's kind must be this optimizer's.
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  /// "muon::PolarGrad" | "muon::Scion" | "muon::MOP" | "muon::SPEL" | "muon::MuonHyperball".
  std::string archive_kind() const override;

 private:
  OrthogonalizedVariant(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                        MuonOptions defaults, std::shared_ptr<OrthogonalizedVariantStage> stage,
                        std::shared_ptr<Orthogonalizer> orthogonalizer);
  /// MuonHyperball with a radius: every parameter rescaled to it (its norm
  /// summed over the parts); a zero norm raises.
  void rescale_to_radius();

  std::shared_ptr<OrthogonalizedVariantStage> stage_;
};

}  // namespace muon
