// Muon with a NorMuon / AdaMuon second moment.
#include "muon/optim/adaptive_muon.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "muon/newton_schulz.h"
#include "muon/compat.h"
#include "muon/scaling.h"
#include "option_fields.h"
#include "registry_internal.h"
#include "util/names.h"
#include "optim/option_checks.h"

namespace muon {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::AdaptiveMuon] ";

constexpr detail::EnumName<AdaptiveMode> kModes[] = {{AdaptiveMode::kNorMuon, "normuon"},
                                                     {AdaptiveMode::kAdaMuon, "adamuon"},
                                                     {AdaptiveMode::kNamo, "namo"}};

// Σ of a statistic over the parts of the item's matrix: one entry.
at::Tensor summed(const at::Tensor& local, const OrthogonalizeItem& item,
                  const Orthogonalizer& parts) {
  auto total = local.reshape({1});
  parts.sum_parts(item, total, PartSum::kWholeMatrix);
  return total;
}

// NAMO (see the header): v ← β2·v + (1 − β2)·‖g‖², orth ← O·‖u‖ / (√v + ε),
// with both norms summed over the parts of the matrix. v holds one copy of
// the scalar per local row; a part with no rows only joins the sums.
void apply_namo(OrthogonalizeItem& item, const Orthogonalizer& parts, const at::Tensor& o,
                at::Tensor& v, double beta2, double eps) {
  const auto work = o.scalar_type();
  const auto g = item.param.grad().to(work);
  const auto u = item.update.to(work);
  const auto grad_sq = summed(g.square().sum(), item, parts);
  const auto update_norm = summed(u.square().sum(), item, parts).sqrt_();
  v.lerp_(grad_sq.reshape({1, 1}).expand_as(v), 1 - beta2);
  if (v.size(0) > 0) {
    const auto ratio = update_norm.div_(v.narrow(0, 0, 1).reshape({1}).sqrt().add_(eps));
    item.orth = o * ratio;
  } else {
    item.orth = o.clone();
  }
  item.alpha = scale_factor(item.rows, item.cols, item.options->scale_mode(),
                            item.options->extra_scale_factor());
}

}  // namespace

MUON_DEFINE_ENUM_NAMES(AdaptiveMode, parse_adaptive_mode, kModes, kWho, "mode");

AdaptiveMuonOptions& AdaptiveMuonOptions::mode(const std::string& name) {
  mode_ = parse_adaptive_mode(name);
  return *this;
}

void AdaptiveMuonOptions::validate() const {
  detail::check_decay(kWho, "beta2", beta2_);
  detail::check_positive(kWho, "eps", eps_);
}

bool operator==(const AdaptiveMuonOptions& a, const AdaptiveMuonOptions& b) {
  return a.mode() == b.mode() && a.beta2() == b.beta2() && a.eps() == b.eps();
}

std::unique_ptr<torch::optim::OptimizerParamState> AdaptiveMuonParamState::clone() const {
  return std::make_unique<AdaptiveMuonParamState>(*this);
}

void AdaptiveMuonParamState::serialize(OutputArchive& archive) const {
  MuonParamState::serialize(archive);
  if (second_moment_.defined()) archive.write("second_moment", second_moment_, /*is_buffer=*/true);
}

void AdaptiveMuonParamState::serialize(InputArchive& archive) {
  MuonParamState::serialize(archive);
  at::Tensor v;
  if (archive.try_read("second_moment", v, /*is_buffer=*/true)) second_moment_ = v;
}

// ---- the stage ---------------------------------------------------------------

SecondMomentStage::SecondMomentStage(AdaptiveMuonOptions options) : options_(options) {
  options_.validate();
}

void SecondMomentStage::set_options(const AdaptiveMuonOptions& options) {
  options.validate();
  TORCH_CHECK_VALUE(options.mode() == options_.mode(), kWho, "the mode cannot change from ",
                    to_string(options_.mode()), " to ", to_string(options.mode()));
  options_ = options;
}

void SecondMomentStage::check_options(const MuonOptions& o, size_t group) const {
  TORCH_CHECK_VALUE(!o.stacked_experts(), kWho, "param group ", group,
                    " has stacked_experts on; AdaptiveMuon supports plain matrices only");
  TORCH_CHECK_VALUE(o.split_sizes().empty(), kWho, "param group ", group, " has split_sizes ",
                    c10::IntArrayRef(o.split_sizes()),
                    "; AdaptiveMuon supports plain matrices only");
  TORCH_CHECK_VALUE(o.num_heads() <= 1, kWho, "param group ", group, " has num_heads ",
                    o.num_heads(), "; AdaptiveMuon supports plain matrices only");
  TORCH_CHECK_VALUE(options_.mode() != AdaptiveMode::kNamo ||
                        o.weight_decay_mode() != WeightDecayMode::kL2,
                    kWho, "param group ", group,
                    " has weight_decay_mode l2, which mode namo does not support (its second "
                    "moment is of the raw gradient); use decoupled, independent or palm");
}

void SecondMomentStage::apply(OrthogonalizeItem& item, const Orthogonalizer& parts) const {
  // This process's part of the matrix: its rows × columns as it holds them.
  const auto [rows, cols] = matrix_dims(item.param.sizes());
  const auto work = item.param.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto o = item.orth.reshape({rows, cols}).to(work);
  auto& st = static_cast<AdaptiveMuonParamState&>(*item.state);
  const double beta2 = options_.beta2();
  const double eps = options_.eps();
  const bool per_row = options_.mode() != AdaptiveMode::kAdaMuon;
  if (!st.second_moment().defined()) {
    st.second_moment(per_row ? at::zeros({rows, 1}, o.options()) : at::zeros({rows, cols}, o.options()));
  }
  auto& v = st.second_moment();
  TORCH_CHECK_VALUE(v.size(0) == rows && v.size(1) == (per_row ? 1 : cols), kWho,
                    "second moment of shape ", v.sizes(), " does not fit mode ",
                    to_string(options_.mode()), " for a ", rows, "x", cols, " matrix");
  if (options_.mode() == AdaptiveMode::kNamo) {
    apply_namo(item, parts, o, v, beta2, eps);
    return;
  }
  const auto sq = o.square();
  if (per_row) {
    // Row means over the whole matrix's columns (summed over column blocks).
    auto row_sums = sq.sum(1, /*keepdim=*/true);
    parts.sum_parts(item, row_sums, PartSum::kRows);
    v.lerp_(row_sums.div_(static_cast<double>(item.cols)), 1 - beta2);
  } else {
    v.lerp_(sq, 1 - beta2);
  }
  auto normalized = o / (v.sqrt() + eps);
  // The norm ratios stay on the device (no host sync); the shape scale goes to alpha.
  const auto out_norm = summed(normalized.square().sum(), item, parts).sqrt_().clamp_min_(eps);
  if (per_row) {
    normalized.mul_(summed(sq.sum(), item, parts).sqrt_().div_(out_norm));
    item.alpha = scale_factor(item.rows, item.cols, item.options->scale_mode(),
                              item.options->extra_scale_factor());
  } else {
    normalized.mul_(out_norm.reciprocal());
    item.alpha = 0.2 * std::sqrt(static_cast<double>(item.rows) * static_cast<double>(item.cols)) *
                 item.options->extra_scale_factor();
  }
  item.orth = normalized;
}

// ---- AdaptiveMuon ------------------------------------------------------------

AdaptiveMuon::AdaptiveMuon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults,
                           AdaptiveMuonOptions adaptive)
    : AdaptiveMuon(std::move(param_groups), std::move(defaults), adaptive,
                   make_local_orthogonalizer()) {}

AdaptiveMuon::AdaptiveMuon(std::vector<at::Tensor> params, MuonOptions defaults,
                           AdaptiveMuonOptions adaptive)
    : AdaptiveMuon(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
                   std::move(defaults), adaptive) {}

AdaptiveMuon::AdaptiveMuon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults,
                           AdaptiveMuonOptions adaptive,
                           std::shared_ptr<Orthogonalizer> orthogonalizer)
    : AdaptiveMuon(std::move(param_groups), std::move(defaults),
                   std::make_shared<SecondMomentStage>(adaptive), std::move(orthogonalizer)) {}

AdaptiveMuon::AdaptiveMuon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults,
                           std::shared_ptr<SecondMomentStage> stage,
                           std::shared_ptr<Orthogonalizer> orthogonalizer)
    : Muon(std::move(param_groups), std::move(defaults), std::move(orthogonalizer), stage),
      stage_(std::move(stage)) {}

std::unique_ptr<MuonParamState> AdaptiveMuon::new_state(const at::Tensor& /*param*/) const {
  return std::make_unique<AdaptiveMuonParamState>();
}

std::string AdaptiveMuon::archive_kind() const { return "muon::AdaptiveMuon"; }

int64_t AdaptiveMuon::state_bytes() const {
  int64_t bytes = Muon::state_bytes();
  for (const auto& item : state_) {
    const auto& v = static_cast<const AdaptiveMuonParamState&>(*item.second).second_moment();
    if (v.defined()) bytes += static_cast<int64_t>(v.nbytes());
  }
  return bytes;
}

void AdaptiveMuon::save(OutputArchive& archive) const {
  Muon::save(archive);
  const auto& adaptive = stage_->options();
  archive.write("adaptive_mode", c10::IValue(to_string(adaptive.mode())));
  archive.write("adaptive_beta2", c10::IValue(adaptive.beta2()));
  archive.write("adaptive_eps", c10::IValue(adaptive.eps()));
}

void AdaptiveMuon::load(InputArchive& archive) {
  c10::IValue mode;
  TORCH_CHECK_VALUE(archive.try_read("adaptive_mode", mode), kWho,
                    "the archive was not written by muon::AdaptiveMuon::save");
  const auto& adaptive = stage_->options();
  TORCH_CHECK_VALUE(mode.toStringRef() == to_string(adaptive.mode()), kWho,
                    "the archive holds mode ", mode.toStringRef(), ", this optimizer's is ",
                    to_string(adaptive.mode()));
  c10::IValue beta2;
  c10::IValue eps;
  archive.read("adaptive_beta2", beta2);
  archive.read("adaptive_eps", eps);
  auto loaded = adaptive;
  loaded.beta2(beta2.toDouble()).eps(eps.toDouble());
  loaded.validate();
  Muon::load(archive);  // checks everything else before changing anything
  stage_->set_options(loaded);
}

// ---- the registry entry ------------------------------------------------------
namespace {

// The second-moment fields, whole-run (equal in every group).
std::vector<detail::OptionField<AdaptiveMuonOptions>> adaptive_fields() {
  using O = AdaptiveMuonOptions;
  using F = detail::OptionFields<O>;
  return {
      F::text("mode", &O::mode, "normuon",
              "second moment: normuon (per row) | adamuon (per element) | namo (one "
              "scalar per matrix, of the gradient norm)",
              {"normuon", "adamuon", "namo"})
          .whole_run(),
      F::real("beta2", &O::beta2, 0.95, "decay of the second moment", 0.0, 1.0)
          .exclusive_max()
          .whole_run(),
      F::real("eps", &O::eps, 1e-8, "added to the square root of the second moment", 0.0)
          .exclusive_min()
          .whole_run(),
  };
}

}  // namespace

AdaptiveMuonOptions detail::adaptive_muon_options(const OptimizerSettings& settings) {
  AdaptiveMuonOptions o;
  apply_fields(o, adaptive_fields(), settings);
  return o;
}

void detail::register_adaptive_muon(OptimizerRegistry& registry) {
  using torch::optim::Optimizer;
  auto e = bare_entry("adaptive_muon", adaptive_muon_state(),
                      "Muon with a NorMuon (per row), AdaMuon (per element) or NAMO (per matrix) "
                      "second moment (muon::AdaptiveMuon); reads the muon_* fields too");
  e.fields = declared_specs(adaptive_fields());
  e.uses_fields_of = {"muon"};
  e.make_options = [](const OptimizerSettings& s) {
    return std::make_unique<MuonOptions>(muon_options_from(s));
  };
  e.factory = [](std::vector<OptimizerParamGroup> groups,
                 const std::vector<OptimizerSettings>& settings) {
    // Whole-run fields: equal in every group.
    const auto adaptive = adaptive_muon_options(settings.at(0));
    const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
    auto opt = std::make_unique<AdaptiveMuon>(groups, defaults, adaptive);
    compat::reapply_group_options(*opt, groups);
    return std::unique_ptr<Optimizer>(std::move(opt));
  };
  e.strategy_factory = [](std::vector<OptimizerParamGroup> groups,
                          const std::vector<OptimizerSettings>& settings,
                          std::shared_ptr<Orthogonalizer> strategy) {
    const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
    return std::unique_ptr<Optimizer>(std::make_unique<AdaptiveMuon>(
        std::move(groups), defaults, adaptive_muon_options(settings.at(0)), std::move(strategy)));
  };
  e.default_overrides = scalar_defaults("adaptive_muon");
  registry.add(detail::hookable<MuonOptions>(std::move(e), "decoupled"));
}

}  // namespace muon
