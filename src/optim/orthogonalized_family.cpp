// PolarGrad, Scion and MOP: Muon with its own orthogonalization or scale.
#include "muon/optim/orthogonalized_family.h"

#include <ATen/ops/linalg_svd.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <tuple>
#include <utility>

#include "muon/scaling.h"
#include "optim/muon_fused.h"
#include "util/names.h"

namespace muon {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr detail::EnumName<OrthogonalizedKind> kKinds[] = {
    {OrthogonalizedKind::kPolarGrad, "polargrad"},
    {OrthogonalizedKind::kScion, "scion"},
    {OrthogonalizedKind::kMop, "mop"}};

// "[muon::PolarGrad] " etc.: the class name users know each variant by.
std::string who(OrthogonalizedKind kind) {
  switch (kind) {
    case OrthogonalizedKind::kPolarGrad:
      return "[muon::PolarGrad] ";
    case OrthogonalizedKind::kScion:
      return "[muon::Scion] ";
    case OrthogonalizedKind::kMop:
      return "[muon::MOP] ";
  }
  return "[muon::OrthogonalizedVariant] ";
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
  }
  void orthogonalize(std::vector<OrthogonalizeItem>& items) override {
    for (auto& item : items) {
      const auto v = detail::matrix_view(item.param, *item.options);
      // SVD in the update's precision, at least fp32 (bf16 has no SVD).
      const auto work = item.update.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      const auto m = item.update.reshape({v.batch, v.rows, v.cols}).to(work);
      auto [u, s, vh] = at::linalg_svd(m, /*full_matrices=*/false);
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

std::string to_string(OrthogonalizedKind kind) { return detail::name_of(kind, kKinds); }

OrthogonalizedKind parse_orthogonalized_kind(const std::string& name) {
  return detail::parse_name(name, kKinds, "[muon::OrthogonalizedVariant] ", "kind");
}

void OrthogonalizedVariantOptions::validate() const {
  TORCH_CHECK_VALUE(std::isfinite(spectral_radius_) && spectral_radius_ > 0, who(kind_),
                    "spectral_radius must be finite and > 0, got ", spectral_radius_);
}

bool operator==(const OrthogonalizedVariantOptions& a, const OrthogonalizedVariantOptions& b) {
  return a.kind() == b.kind() && a.spectral_radius() == b.spectral_radius();
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
      stage_(std::move(stage)) {}

std::string OrthogonalizedVariant::archive_kind() const {
  switch (stage_->options().kind()) {
    case OrthogonalizedKind::kPolarGrad:
      return "muon::PolarGrad";
    case OrthogonalizedKind::kScion:
      return "muon::Scion";
    case OrthogonalizedKind::kMop:
      return "muon::MOP";
  }
  return "muon::OrthogonalizedVariant";
}

void OrthogonalizedVariant::save(OutputArchive& archive) const {
  Muon::save(archive);
  archive.write("variant_spectral_radius", c10::IValue(stage_->options().spectral_radius()));
}

void OrthogonalizedVariant::load(InputArchive& archive) {
  const auto& current = stage_->options();
  c10::IValue radius;
  // Muon::load names a foreign archive's kind; check it first when the key is absent.
  if (!archive.try_read("variant_spectral_radius", radius)) {
    Muon::load(archive);  // raises naming the kind found
    TORCH_CHECK_VALUE(false, who(current.kind()), "the archive has no variant settings");
  }
  auto loaded = current;
  loaded.spectral_radius(radius.toDouble());
  loaded.validate();
  Muon::load(archive);  // checks the kind and everything else before changing anything
  stage_->set_options(loaded);
}

}  // namespace muon
