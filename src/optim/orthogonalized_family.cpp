// PolarGrad, Scion, MOP, SPEL and MuonHyperball: Muon with its own
// orthogonalization, scale or weight update.
#include "muon/optim/orthogonalized_family.h"

#include <ATen/ops/linalg_svd.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "muon/compat.h"
#include "muon/config.h"
#include "muon/scaling.h"
#include "optim/muon_fused.h"
#include "optim/option_checks.h"
#include "optim/step_transaction.h"
#include "option_fields.h"
#include "registry_internal.h"
#include "util/fault_injection.h"
#include "util/names.h"
#include "util/scale.h"

namespace muon {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr detail::EnumName<OrthogonalizedKind> kKinds[] = {
    {OrthogonalizedKind::kPolarGrad, "polargrad"},
    {OrthogonalizedKind::kScion, "scion"},
    {OrthogonalizedKind::kMop, "mop"},
    {OrthogonalizedKind::kSpel, "spel"},
    {OrthogonalizedKind::kMuonHyperball, "muon_hyperball"}};

// The class name users know each variant by, in OrthogonalizedKind's
// order; also its archive kind.
constexpr const char* kClassNames[] = {"muon::PolarGrad", "muon::Scion", "muon::MOP", "muon::SPEL",
                                       "muon::MuonHyperball"};

std::string class_name(OrthogonalizedKind kind) { return kClassNames[static_cast<size_t>(kind)]; }

// "[muon::PolarGrad] " etc.
std::string who(OrthogonalizedKind kind) {
  return "[" + class_name(kind) + "] ";
}

// Σ over the parts of the item's matrix of `local` (one entry), as a {1} tensor.
at::Tensor summed(const at::Tensor& local, const OrthogonalizeItem& item, const Orthogonalizer& parts) {
  auto total = local.reshape({1});
  parts.sum_parts(item, total, PartSum::kWholeMatrix);
  return total;
}

// ‖x‖_F² of this process's part, in fp32 (fp64 for fp64 tensors).
at::Tensor square_sum(const at::Tensor& x) {
  const auto work = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return x.to(work).square().sum();
}

// MOP's step 4: U·Vᵀ of each whole matrix (reduced SVD), scaled from its
// shape as Muon scales Newton–Schulz's result.
class PolarOrthogonalizer final : public Orthogonalizer {
 public:
  std::string name() const override { return "local"; }
  void check_options(const MuonOptions& o, size_t group) const override {
    TORCH_CHECK_VALUE(o.split_sizes().empty(), "[muon::MOP] param group ", group,
                      " has split_sizes ", c10::IntArrayRef(o.split_sizes()),
                      "; MOP orthogonalizes plain matrices only");
    TORCH_CHECK_VALUE(o.spectral_update() == SpectralUpdate::kNone, "[muon::MOP] param group ",
                      group, ": muon_spectral_update '", to_string(o.spectral_update()),
                      "' replaces Newton–Schulz, and MOP's step 4 is the SVD polar factor; use "
                      "spectral_update none");
  }
  void orthogonalize(std::vector<OrthogonalizeItem>& items) override {
    for (auto& item : items) {
      const auto v = detail::matrix_view(item.param, *item.options);
      // SVD in the update's precision, at least fp32 (bf16 has no SVD).
      const auto work = item.update.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      const auto m = item.update.reshape({v.batch, v.rows, v.cols}).to(work);
      at::Tensor u;
      at::Tensor vh;
      detail::name_step_failure(
          "[muon::MOP] ",
          [&] { return c10::str("the SVD of a parameter of group ", item.group, " (shape ",
                                item.param.sizes(), ")"); },
          [&] {
            detail::fault_point("MOP's SVD");
            std::tie(u, std::ignore, vh) = at::linalg_svd(m, /*full_matrices=*/false);
          });
      item.orth = at::matmul(u, vh);
      item.rows = v.rows;
      item.cols = v.cols;
      item.alpha = scale_factor(v.rows, v.cols, item.options->scale_mode(),
                                item.options->extra_scale_factor());
    }
  }
};

std::shared_ptr<Orthogonalizer> checked_strategy(std::shared_ptr<Orthogonalizer> strategy,
                                                 const OrthogonalizedVariantOptions& variant) {
  TORCH_CHECK_VALUE(strategy != nullptr, who(variant.kind()), "orthogonalizer is null");
  TORCH_CHECK_VALUE(variant.kind() != OrthogonalizedKind::kMop || strategy->name() == "local",
                    "[muon::MOP] the polar factor by SVD needs whole matrices, and the '",
                    strategy->name(),
                    "' layout gives each process a part of them; run MOP on one process or in "
                    "the layerwise layout");
  return strategy;
}

}  // namespace

MUON_DEFINE_ENUM_NAMES(OrthogonalizedKind, parse_orthogonalized_kind, kKinds, "[muon::OrthogonalizedVariant] ", "kind");

void OrthogonalizedVariantOptions::validate() const {
  detail::check_finite_positive(who(kind_).c_str(), "spectral_radius", spectral_radius_);
  TORCH_CHECK_VALUE(std::isfinite(hyperball_radius_) && hyperball_radius_ >= 0, who(kind_),
                    "hyperball_radius must be finite and >= 0 (0: each parameter's norm), got ",
                    hyperball_radius_);
  detail::check_finite_positive(who(kind_).c_str(), "hyperball_eps", hyperball_eps_);
}

bool operator==(const OrthogonalizedVariantOptions& a, const OrthogonalizedVariantOptions& b) {
  return a.kind() == b.kind() && a.spectral_radius() == b.spectral_radius() &&
         a.hyperball_radius() == b.hyperball_radius() && a.hyperball_eps() == b.hyperball_eps();
}

std::shared_ptr<Orthogonalizer> make_polar_orthogonalizer() {
  return std::make_shared<PolarOrthogonalizer>();
}

// ---- the stage ---------------------------------------------------------------

OrthogonalizedVariantStage::OrthogonalizedVariantStage(OrthogonalizedVariantOptions options)
    : options_(options) {
  options_.validate();
}

void OrthogonalizedVariantStage::set_options(const OrthogonalizedVariantOptions& options) {
  options.validate();
  TORCH_CHECK_VALUE(options.kind() == options_.kind(), who(options_.kind()),
                    "the kind cannot change from ", to_string(options_.kind()), " to ",
                    to_string(options.kind()));
  options_ = options;
}

void OrthogonalizedVariantStage::check_options(const MuonOptions& o, size_t group) const {
  const auto w = who(options_.kind());
  TORCH_CHECK_VALUE(!o.stacked_experts(), w, "param group ", group,
                    " has stacked_experts on; this optimizer orthogonalizes plain matrices only");
  TORCH_CHECK_VALUE(o.split_sizes().empty(), w, "param group ", group, " has split_sizes ",
                    c10::IntArrayRef(o.split_sizes()),
                    "; this optimizer orthogonalizes plain matrices only");
  TORCH_CHECK_VALUE(o.num_heads() <= 1, w, "param group ", group, " has num_heads ", o.num_heads(),
                    "; this optimizer orthogonalizes plain matrices only");
  if (options_.kind() == OrthogonalizedKind::kScion) {
    // EO's Scion fixes these (the Frank–Wolfe step of the constrained problem).
    TORCH_CHECK_VALUE(o.weight_decay() == 1.0, w, "param group ", group,
                      ": weight_decay must be 1 (Scion's Frank–Wolfe step), got ",
                      o.weight_decay());
    TORCH_CHECK_VALUE(o.weight_decay_mode() == WeightDecayMode::kDecoupled, w, "param group ",
                      group, ": weight_decay_mode must be decoupled, got ",
                      to_string(o.weight_decay_mode()));
    TORCH_CHECK_VALUE(!o.nesterov(), w, "param group ", group,
                      ": nesterov must be false (Scion has no Nesterov step), got true");
  }
}

namespace detail {

OverrideRule scion_fixed_rule() {
  // The config's weight_decay stays the scalar optimizer's; explain and the
  // groups show the values that run.
  return OverrideRule()
      .match_optimizer("scion")
      .set("weight_decay", 1.0)
      .set("muon_nesterov", false)
      .named("scion default: weight_decay 1, muon_nesterov false (fixed by Scion)");
}

}  // namespace detail

void OrthogonalizedVariantStage::apply(OrthogonalizeItem& item, const Orthogonalizer& parts) const {
  const MuonOptions& o = *item.options;
  switch (options_.kind()) {
    case OrthogonalizedKind::kPolarGrad: {
      // ⟨O, M⟩ over the whole matrix: this part's sum, summed over the parts.
      // It stays on the device (no host sync); the layouts differ only in the
      // order of the fp32 sums.
      const auto work = item.orth.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      const auto o_part = item.orth.reshape({-1}).to(work);
      const auto m_part = item.update.reshape({-1}).to(work);
      auto inner = at::dot(o_part, m_part).reshape({1});
      parts.sum_parts(item, inner, PartSum::kWholeMatrix);
      item.orth = o_part.mul(inner).view(item.orth.sizes());
      item.alpha = o.extra_scale_factor();
      break;
    }
    case OrthogonalizedKind::kScion:
      item.alpha = scale_factor(item.rows, item.cols, ScaleMode::kUnitRmsNorm,
                                options_.spectral_radius() * o.extra_scale_factor());
      break;
    case OrthogonalizedKind::kMop:
      break;  // the SVD strategy wrote the orthogonal factor and Muon's scale
    case OrthogonalizedKind::kSpel:
      item.alpha = 1.0;  // EO's SPEL applies Newton–Schulz's result unscaled
      break;
    case OrthogonalizedKind::kMuonHyperball: {
      // R (EO's pre_weight_update_fn_inplace): the radius, or the weight's
      // norm after the decay; kept for after_update.
      const double eps = options_.hyperball_eps();
      const auto radius =
          options_.hyperball_radius() > 0
              ? at::full({1}, options_.hyperball_radius(), item.param.options().dtype(at::kDouble))
              : summed(square_sum(item.param), item, parts).sqrt_().to(at::kDouble);
      item.stage_scratch = radius;
      // The scaled update u = alpha·orth, normalized to norm R.
      const auto u_norm =
          summed(square_sum(item.orth), item, parts).sqrt_().mul_(item.alpha).clamp_min_(eps);
      const auto work = item.orth.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      item.orth = item.orth.to(work).mul(radius.to(work).mul(item.alpha).div_(u_norm));
      item.alpha = 1.0;
      break;
    }
  }
}

void OrthogonalizedVariantStage::after_update(std::vector<OrthogonalizeItem>& items,
                                              Orthogonalizer& parts) const {
  if (options_.kind() == OrthogonalizedKind::kSpel) {
    // The outer msign: Newton–Schulz of the updated weight, through the
    // layout's strategy (whole matrices, or the parts with its collectives).
    std::vector<OrthogonalizeItem> weights(items.size());
    for (const auto i : c10::irange(items.size())) {
      auto& w = weights[i];
      w.param = items[i].param;
      w.update = items[i].param.detach().clone();
      w.options = items[i].options;
      w.group = items[i].group;
      w.state = items[i].state;
    }
    parts.orthogonalize(weights);  // collective: called even with no item
    for (const auto i : c10::irange(items.size())) {
      at::Tensor p = items[i].param;  // a handle: the copy is in place
      p.copy_(weights[i].orth.reshape(p.sizes()));
    }
    return;
  }
  if (options_.kind() != OrthogonalizedKind::kMuonHyperball) return;
  // EO's post_weight_update_fn_inplace: p ← R·p / max(‖p‖_F, eps).
  for (auto& item : items) {
    const auto norm =
        summed(square_sum(item.param), item, parts).sqrt_().to(at::kDouble).clamp_min_(options_.hyperball_eps());
    at::Tensor p = item.param;
    p.mul_(item.stage_scratch.div(norm).to(p.scalar_type()));
    item.stage_scratch = at::Tensor();
  }
}

// ---- OrthogonalizedVariant ---------------------------------------------------

OrthogonalizedVariant::OrthogonalizedVariant(std::vector<OptimizerParamGroup> param_groups,
                                             MuonOptions defaults,
                                             OrthogonalizedVariantOptions variant)
    : OrthogonalizedVariant(std::move(param_groups), std::move(defaults), variant,
                            variant.kind() == OrthogonalizedKind::kMop
                                ? make_polar_orthogonalizer()
                                : make_local_orthogonalizer()) {}

OrthogonalizedVariant::OrthogonalizedVariant(std::vector<at::Tensor> params, MuonOptions defaults,
                                             OrthogonalizedVariantOptions variant)
    : OrthogonalizedVariant(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
                            std::move(defaults), variant) {}

OrthogonalizedVariant::OrthogonalizedVariant(std::vector<OptimizerParamGroup> param_groups,
                                             MuonOptions defaults,
                                             OrthogonalizedVariantOptions variant,
                                             std::shared_ptr<Orthogonalizer> orthogonalizer)
    : OrthogonalizedVariant(std::move(param_groups), std::move(defaults),
                            std::make_shared<OrthogonalizedVariantStage>(variant),
                            checked_strategy(std::move(orthogonalizer), variant)) {}

OrthogonalizedVariant::OrthogonalizedVariant(std::vector<OptimizerParamGroup> param_groups,
                                             MuonOptions defaults,
                                             std::shared_ptr<OrthogonalizedVariantStage> stage,
                                             std::shared_ptr<Orthogonalizer> orthogonalizer)
    : Muon(std::move(param_groups), std::move(defaults), std::move(orthogonalizer), stage),
      stage_(std::move(stage)) {
  if (stage_->options().kind() == OrthogonalizedKind::kMuonHyperball) rescale_to_radius();
}

void OrthogonalizedVariant::rescale_to_radius() {
  at::NoGradGuard no_grad;
  const auto& v = stage_->options();
  for (const auto gi : c10::irange(param_groups_.size())) {
    auto& group = param_groups_[gi];
    for (const auto j : c10::irange(group.params().size())) {
      at::Tensor p = group.params()[j];
      OrthogonalizeItem item;
      item.param = p;
      item.update = p;
      item.options = &static_cast<const MuonOptions&>(group.options());
      item.group = gi;
      // Collective in a layout that splits matrices: every process, every parameter.
      const double norm = summed(square_sum(p), item, orthogonalizer()).sqrt_().item<double>();
      TORCH_CHECK_VALUE(norm > 0, who(v.kind()), "parameter ", j, " of group ", gi,
                        " has zero norm; MuonHyperball keeps each weight on a sphere of its norm");
      if (v.hyperball_radius() > 0) {
        muon::detail::scale_(p, v.hyperball_radius() / std::max(norm, v.hyperball_eps()));
      }
    }
  }
}

std::string OrthogonalizedVariant::archive_kind() const {
  return class_name(stage_->options().kind());
}

void OrthogonalizedVariant::save(OutputArchive& archive) const {
  Muon::save(archive);
  const auto& v = stage_->options();
  archive.write("variant_spectral_radius", c10::IValue(v.spectral_radius()));
  archive.write("variant_hyperball_radius", c10::IValue(v.hyperball_radius()));
  archive.write("variant_hyperball_eps", c10::IValue(v.hyperball_eps()));
}

void OrthogonalizedVariant::load(InputArchive& archive) {
  const auto& current = stage_->options();
  c10::IValue radius;
  // Muon::load names a foreign archive's kind; check it first when the key is absent.
  if (!archive.try_read("variant_spectral_radius", radius)) {
    Muon::load(archive);  // raises naming the kind found
    TORCH_CHECK_VALUE(false, who(current.kind()), "the archive has no variant settings");
  }
  c10::IValue hyperball_radius;
  c10::IValue hyperball_eps;
  archive.read("variant_hyperball_radius", hyperball_radius);
  archive.read("variant_hyperball_eps", hyperball_eps);
  auto loaded = current;
  loaded.spectral_radius(radius.toDouble())
      .hyperball_radius(hyperball_radius.toDouble())
      .hyperball_eps(hyperball_eps.toDouble());
  loaded.validate();
  Muon::load(archive);  // checks the kind and everything else before changing anything
  stage_->set_options(loaded);
}

// ---- the registry entries ----------------------------------------------------
namespace {

using VariantField = detail::OptionField<OrthogonalizedVariantOptions>;
using VF = detail::OptionFields<OrthogonalizedVariantOptions>;

// The family (OrthogonalizedVariant): Muon's fields (uses_fields_of muon)
// with EO's defaults where they differ from Muon's (nesterov off), their own
// settings whole-run, Muon's routing of 1-D, embedding and head parameters,
// and the layouts' strategies.
OptimizerEntry orthogonalized_entry(OrthogonalizedKind kind, std::string doc,
                                    std::vector<VariantField> fields) {
  using torch::optim::Optimizer;
  const auto name = to_string(kind);
  auto e = detail::bare_entry(name, detail::orthogonalized_state(kind), std::move(doc));
  e.fields = detail::declared_specs(fields);
  e.uses_fields_of = {"muon"};
  // Scion's fixed weight decay and Nesterov: its default rule sets them,
  // OrthogonalizedVariant refuses other values (no silent replacement).
  e.make_options = [](const OptimizerSettings& s) {
    return std::make_unique<MuonOptions>(detail::muon_options_from(s));
  };
  const auto variant = [kind, fields = std::move(fields)](const OptimizerSettings& s) {
    auto v = OrthogonalizedVariantOptions().kind(kind);
    detail::apply_fields(v, fields, s);
    v.validate();
    return v;
  };
  e.factory = [variant](std::vector<OptimizerParamGroup> groups,
                        const std::vector<OptimizerSettings>& settings) {
    const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
    auto opt = std::make_unique<OrthogonalizedVariant>(groups, defaults, variant(settings.at(0)));
    compat::reapply_group_options(*opt, groups);
    return std::unique_ptr<Optimizer>(std::move(opt));
  };
  e.strategy_factory = [variant](std::vector<OptimizerParamGroup> groups,
                                 const std::vector<OptimizerSettings>& settings,
                                 std::shared_ptr<Orthogonalizer> strategy) {
    const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
    return std::unique_ptr<Optimizer>(std::make_unique<OrthogonalizedVariant>(
        std::move(groups), defaults, variant(settings.at(0)), std::move(strategy)));
  };
  e.default_overrides = detail::scalar_defaults(name);
  if (kind == OrthogonalizedKind::kScion) e.default_overrides.push_back(detail::scion_fixed_rule());
  if (kind == OrthogonalizedKind::kSpel) {
    return detail::not_hookable(std::move(e), "it re-orthogonalizes the weight after its update");
  }
  if (kind == OrthogonalizedKind::kMuonHyperball) {
    return detail::not_hookable(std::move(e), "it wears the hyperball hook already (muon_hyperball_radius); "
                                              "use optimizer 'muon' with weight_update_hook hyperball");
  }
  return detail::hookable<MuonOptions>(std::move(e), "decoupled");
}

// nesterov, off (EO's default): muon_options_from reads it in place of muon_nesterov.
VariantField eo_nesterov() {
  return VF::custom(FieldSpec::boolean("nesterov", false,
                                       "Nesterov look-ahead update (off, Emerging-Optimizers' "
                                       "default; replaces muon_nesterov)"));
}

}  // namespace

void detail::register_orthogonalized_family(OptimizerRegistry& registry) {
  using O = OrthogonalizedVariantOptions;
  registry.add(orthogonalized_entry(
      OrthogonalizedKind::kPolarGrad,
      "PolarGrad (muon::OrthogonalizedVariant): Newton–Schulz scaled by <O, M>, the nuclear-norm "
      "estimate; reads the muon_* fields too",
      {eo_nesterov()}));
  registry.add(orthogonalized_entry(
      OrthogonalizedKind::kScion,
      "Scion (muon::OrthogonalizedVariant): Newton–Schulz scaled by sqrt(rows/cols)·spectral_radius, "
      "weight decay fixed at 1 (decoupled), no Nesterov; reads the muon_* fields too",
      {VF::real("spectral_radius", &O::spectral_radius, 1.0,
                "radius of the spectral-norm ball (scales the update)", 0.0)
           .exclusive_min()
           .whole_run()}));
  registry.add(orthogonalized_entry(
      OrthogonalizedKind::kMop,
      "MOP (muon::OrthogonalizedVariant): the exact polar factor by SVD, Muon's scale; whole "
      "matrices only (no tensor_parallel or sharded layout); reads the muon_* fields too",
      {eo_nesterov()}));
  registry.add(orthogonalized_entry(
      OrthogonalizedKind::kSpel,
      "SPEL (muon::OrthogonalizedVariant): unscaled Newton–Schulz update, then the weight "
      "re-orthogonalized by Newton–Schulz; reads the muon_* fields too",
      {eo_nesterov()}));
  registry.add(orthogonalized_entry(
      OrthogonalizedKind::kMuonHyperball,
      "MuonHyperball (muon::OrthogonalizedVariant): Muon's update normalized to the weight's norm, "
      "the weight kept at that norm; reads the muon_* fields too",
      {eo_nesterov(),
       VF::real("radius", &O::hyperball_radius, 0.0,
                "hyperball radius R (EO's hyperball_radius); 0: each parameter's own norm", 0.0)
           .whole_run(),
       VF::real("eps", &O::hyperball_eps, 1e-8, "floor of the norms divided by (EO's hyperball_eps)",
                0.0)
           .exclusive_min()
           .whole_run()}));
}

}  // namespace muon
