// muon::Muon: the step (momentum, the strategy, the update), state and archives.
#include "muon/optim/muon.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/serialize/archive.h>

#include <numeric>
#include <utility>
#include <vector>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "muon/compat.h"
#include "muon/newton_schulz.h"
#include "muon/scaling.h"
#include "option_fields.h"
#include "optim/archive_kind.h"
#include "optim/closure.h"
#include "optim/muon_fused.h"
#include "optim/step_transaction.h"
#include "util/dtype_names.h"

namespace muon {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::Muon] ";

template <typename T>
T read_value(InputArchive& archive, const char* key) {
  c10::IValue v;
  archive.read(key, v);
  return v.to<T>();
}

}  // namespace

Muon::Muon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults)
    : Muon(std::move(param_groups), std::move(defaults), make_local_orthogonalizer()) {}

Muon::Muon(std::vector<at::Tensor> params, MuonOptions defaults)
    : Muon(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
           std::move(defaults)) {}

Muon::Muon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults,
           std::shared_ptr<Orthogonalizer> orthogonalizer, std::shared_ptr<const UpdateStage> stage)
    : Optimizer(param_groups, std::make_unique<MuonOptions>(defaults)),
      orthogonalizer_(std::move(orthogonalizer)),
      stage_(std::move(stage)) {
  TORCH_CHECK_VALUE(orthogonalizer_ != nullptr, kWho, "orthogonalizer is null");
  defaults.validate();
  compat::reapply_group_options(*this, param_groups);
  check_before_step();
  orthogonalizer_->attach(param_groups_);
}

void Muon::check_before_step() {
  for (const auto i : c10::irange(param_groups_.size())) check_group(i);
  detail::check_steppable(param_groups_, kWho);
}

std::pair<int64_t, int64_t> Muon::max_over_processes(int64_t code) {
  return orthogonalizer_->max_over_processes(code);
}

void Muon::check_group(size_t index) const {
  const auto& group = param_groups_[index];
  const auto* o = dynamic_cast<const MuonOptions*>(&group.options());
  TORCH_CHECK_VALUE(o != nullptr, kWho, "param group ", index,
                    " has options of another optimizer; give it muon::MuonOptions");
  o->validate();
  orthogonalizer_->check_options(*o, index);
  if (stage_) stage_->check_options(*o, index);
  const auto& split = o->split_sizes();
  const int64_t split_rows = o->num_query_groups() *
                             std::accumulate(split.begin(), split.end(), int64_t{0});
  for (const auto j : c10::irange(group.params().size())) {
    const auto& p = group.params()[j];
    TORCH_CHECK_VALUE(p.defined(), kWho, "parameter ", j, " of group ", index, " is undefined");
    TORCH_CHECK_VALUE(p.dim() >= 2, kWho, "parameter ", j, " of group ", index, " has shape ",
                      p.sizes(), " (ndim ", p.dim(),
                      "); Muon orthogonalizes matrices (ndim >= 2). Give vectors and scalars "
                      "(biases, norm gains) to AdamW, e.g. with muon::MuonWithAdamW "
                      "(muon/optim/hybrid.h), which routes them by shape and name");
    TORCH_CHECK_VALUE(orthogonalizer_->traits().empty_parts || p.numel() > 0, kWho, "parameter ",
                      j, " of group ", index, " has zero size (shape ", p.sizes(), ")");
    TORCH_CHECK_VALUE(at::isFloatingType(p.scalar_type()), kWho, "parameter ", j, " of group ",
                      index, " must have a floating dtype, got ", p.scalar_type());
    if (o->num_heads() > 1) {
      TORCH_CHECK_VALUE(p.dim() == 2, kWho, "num_heads ", o->num_heads(),
                        " splits 2-D matrices into heads, but parameter ", j, " of group ", index,
                        " has shape ", p.sizes(), " (ndim ", p.dim(),
                        "; stacked experts and convolutions are not split into heads)");
      // Whole matrices on this process: their rows are the matrix's. Layouts
      // that split matrices check the whole shape in check_options.
      TORCH_CHECK_VALUE(orthogonalizer_->traits().empty_parts || !split.empty() ||
                            p.size(0) % o->num_heads() == 0,
                        kWho, "num_heads ", o->num_heads(), " must divide the rows of parameter ",
                        j, " of group ", index, ", which has shape ", p.sizes());
    }
    if (!split.empty()) {
      const auto rows = (o->stacked_experts() && p.dim() >= 3) ? p.size(1) : p.size(0);
      TORCH_CHECK_VALUE(rows == split_rows, kWho, "split_sizes ", c10::IntArrayRef(split),
                        " × num_query_groups ", o->num_query_groups(), " = ", split_rows,
                        " rows, but parameter ", j, " of group ", index, " has ", rows,
                        " rows (shape ", p.sizes(), ")");
    }
  }
}

at::Tensor Muon::step(LossClosure closure) {
  return guarded_step(
      *this, closure, kWho, [this] { check_before_step(); }, [this] { step_parameters(); });
}

void Muon::step_parameters() {
  // The strategy agrees which parameters step, unless the layout did.
  if (!agreed_by_layout()) orthogonalizer_->begin_step(param_groups_);
  // Steps 1–6 are detail::muon_step's, on batches of parameters. Those its
  // fused passes take run after the loop, possibly side by side; the others
  // go to the strategy in the calls its traits ask for (a tensor is in one
  // group only: check_steppable).
  const auto& traits = orthogonalizer_->traits();
  const bool fuses = traits.fuses && stage_ == nullptr;
  const detail::MuonStepPasses tensor_ops{/*fused=*/false, orthogonalizer_.get(), stage_.get(),
                                          nullptr};
  std::vector<detail::MuonStepItem> fused;
  std::vector<detail::MuonStepItem> pending;
  int64_t pending_elements = 0;
  for (const auto gi : c10::irange(param_groups_.size())) {
    auto& group = param_groups_[gi];
    const auto& o = static_cast<const MuonOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      detail::MuonStepItem item{p, &o, &state_of(p), gi};
      if (fuses) {
        item.view = detail::matrix_view(p, o);
        if (detail::fusable(item)) {
          fused.push_back(std::move(item));
          continue;
        }
      }
      pending_elements += p.numel();
      pending.push_back(std::move(item));
      if (traits.call_elements >= 0 && pending_elements >= traits.call_elements) {
        detail::muon_step(pending, tensor_ops);
        pending.clear();
        pending_elements = 0;
      }
    }
  }
  detail::muon_step(pending, tensor_ops);  // collective: called even with no item
  if (!fused.empty()) {
    if (!scratch_) scratch_ = std::make_shared<detail::FusedScratch>();
    detail::run_fused(std::move(fused), *scratch_);
  }
}

MuonParamState& Muon::state_of(const at::Tensor& p) {
  auto& slot = state_[compat::state_key(p)];
  if (!slot) slot = new_state(p);
  auto& st = static_cast<MuonParamState&>(*slot);
  if (!st.momentum_buffer().defined()) {
    st.momentum_buffer(at::zeros_like(p, at::MemoryFormat::Preserve));
  }
  return st;
}

std::unique_ptr<MuonParamState> Muon::new_state(const at::Tensor& /*param*/) const {
  return std::make_unique<MuonParamState>();
}

std::string Muon::archive_kind() const { return "muon::Muon"; }

int64_t Muon::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& item : state_) {
    const auto& buf = static_cast<const MuonParamState&>(*item.second).momentum_buffer();
    if (buf.defined()) bytes += static_cast<int64_t>(buf.nbytes());
  }
  return bytes;
}

void Muon::save(OutputArchive& archive) const {
  archive.write("muon_format", c10::IValue(int64_t{1}));
  archive.write("muon_kind", c10::IValue(archive_kind()));
  archive.write("muon_layout", c10::IValue(orthogonalizer_->name()));
  archive.write("param_groups/size", c10::IValue(static_cast<int64_t>(param_groups_.size())));
  for (const auto i : c10::irange(param_groups_.size())) {
    const auto& group = param_groups_[i];
    OutputArchive group_archive(archive.compilation_unit());
    group_archive.write("params/size", c10::IValue(static_cast<int64_t>(group.params().size())));
    OutputArchive options_archive(archive.compilation_unit());
    static_cast<const MuonOptions&>(group.options()).serialize(options_archive);
    group_archive.write("options", options_archive);
    for (const auto j : c10::irange(group.params().size())) {
      const auto it = state_.find(compat::state_key(group.params()[j]));
      if (it == state_.end()) continue;
      OutputArchive state_archive(archive.compilation_unit());
      static_cast<const MuonParamState&>(*it->second).serialize(state_archive);
      group_archive.write("state/" + std::to_string(j), state_archive);
    }
    archive.write("param_groups/" + std::to_string(i), group_archive);
  }
}

void Muon::load(InputArchive& archive) {
  c10::IValue format;
  TORCH_CHECK_VALUE(archive.try_read("muon_format", format) && format.toInt() == 1, kWho,
                    "the archive holds ", detail::describe_archive(archive), "; this optimizer is ",
                    archive_kind(), " (layout '", orthogonalizer_->name(), "')");
  c10::IValue kind;
  const std::string expected = archive_kind();
  const std::string found = archive.try_read("muon_kind", kind) ? kind.toStringRef() : "muon::Muon";
  TORCH_CHECK_VALUE(found == expected, kWho, "the archive holds the state of ", found,
                    ", this optimizer is ", expected);
  c10::IValue layout;
  const std::string found_layout =
      archive.try_read("muon_layout", layout) ? layout.toStringRef() : "local";
  TORCH_CHECK_VALUE(found_layout == orthogonalizer_->name(), kWho, "the archive holds the state "
                    "of the '", found_layout, "' layout, this optimizer's is '",
                    orthogonalizer_->name(), "'");
  const auto groups = read_value<int64_t>(archive, "param_groups/size");
  TORCH_CHECK_VALUE(groups == static_cast<int64_t>(param_groups_.size()), kWho,
                    "the archive has ", groups, " param groups, this optimizer has ",
                    param_groups_.size());
  // Read everything first: a mismatch leaves this optimizer unchanged.
  std::vector<MuonOptions> options(param_groups_.size());
  std::vector<std::pair<at::Tensor, std::unique_ptr<MuonParamState>>> states;
  for (const auto i : c10::irange(param_groups_.size())) {
    const auto& params = param_groups_[i].params();
    InputArchive group_archive;
    archive.read("param_groups/" + std::to_string(i), group_archive);
    const auto count = read_value<int64_t>(group_archive, "params/size");
    TORCH_CHECK_VALUE(count == static_cast<int64_t>(params.size()), kWho, "param group ", i,
                      " of the archive has ", count, " parameters, this optimizer's has ",
                      params.size());
    InputArchive options_archive;
    group_archive.read("options", options_archive);
    options[i].serialize(options_archive);
    for (const auto j : c10::irange(params.size())) {
      InputArchive state_archive;
      if (!group_archive.try_read("state/" + std::to_string(j), state_archive)) continue;
      const auto& p = params[j];
      auto st = new_state(p);
      st->serialize(state_archive);
      auto& buf = st->momentum_buffer();
      if (buf.defined()) {
        TORCH_CHECK_VALUE(buf.sizes() == p.sizes(), kWho, "the archive's momentum buffer of "
                          "parameter ", j, " of group ", i, " has shape ", buf.sizes(),
                          ", the parameter has shape ", p.sizes());
        buf = buf.to(p.device(), p.scalar_type());
      }
      states.emplace_back(p, std::move(st));
    }
  }
  for (const auto i : c10::irange(param_groups_.size())) {
    param_groups_[i].set_options(std::make_unique<MuonOptions>(options[i]));
  }
  state_.clear();  // the archive holds the whole state, as Python's load_state_dict
  for (auto& [p, st] : states) state_[compat::state_key(p)] = std::move(st);
}

// ---- the registry entry ------------------------------------------------------
namespace {

using MuonField = detail::OptionField<MuonOptions>;
using MF = detail::OptionFields<MuonOptions>;

// coefficient_type custom's default tuple: Keller Jordan's (the set "simple").
constexpr NsCoefficients kCustomNs{3.4445, -4.7750, 2.0315};

// The built-in set names and "custom" (ns_coefficient_a, _b, _c).
std::vector<std::string> muon_coefficient_choices() {
  auto names = accepted_coefficient_set_names();
  names.emplace_back("custom");
  return names;
}

// momentum .. spectral_wd_beta (and the common weight_decay).
std::vector<MuonField> muon_momentum_fields(const MuonOptions& d) {
  using O = MuonOptions;
  return {
      MF::real("momentum", &O::momentum, d.momentum(), "momentum μ", 0.0, 1.0).exclusive_max(),
      MF::boolean("nesterov", &O::nesterov, d.nesterov(), "Nesterov look-ahead update"),
      MF::common("weight_decay", &O::weight_decay),
      MF::text("momentum_style", &O::momentum_style, to_string(d.momentum_style()),
               "momentum accumulation", {"ema", "classic"}),
      MF::text("weight_decay_mode", &O::weight_decay_mode, to_string(d.weight_decay_mode()),
               "how weight decay enters the step (spectral_clipped: W ← "
               "spectral_clipped_weight_decay(W, spectral_wd_beta, lr·weight_decay); "
               "cautious: decay only where the update and the weight agree in sign)",
               {"decoupled", "independent", "l2", "palm", "spectral_clipped", "cautious"}),
      MF::real("spectral_wd_beta", &O::spectral_wd_beta, d.spectral_wd_beta(),
               "β of weight_decay_mode spectral_clipped: singular values above it decay", 0.0)
          .exclusive_min(),
  };
}

// coefficient_type .. ns_compute_dtype: the Newton–Schulz iteration.
std::vector<MuonField> muon_ns_fields(const MuonOptions& d) {
  const auto coefficients = [](MuonOptions& o, const OptimizerSettings& s) {
    if (s.get_string("coefficient_type") == "custom") {
      o.ns().coefficients({{s.get_double("ns_coefficient_a"), s.get_double("ns_coefficient_b"),
                            s.get_double("ns_coefficient_c")}},
                          StepSchedule::kRepeatLast);
    } else {
      o.ns_coefficients(s.get_string("coefficient_type"));
    }
  };
  const char* custom_doc = " of coefficient_type custom (one (a, b, c) every step)";
  return {
      MF::custom(FieldSpec::text("coefficient_type", d.ns().coefficients().name,
                                 "Newton–Schulz coefficient set (names as in Megatron-Core; "
                                 "polar_express_8 = polar_express; custom: ns_coefficient_a, _b, _c)",
                                 muon_coefficient_choices()),
                 coefficients),
      MF::custom(FieldSpec::real("ns_coefficient_a", kCustomNs.a, std::string("a") + custom_doc)),
      MF::custom(FieldSpec::real("ns_coefficient_b", kCustomNs.b, std::string("b") + custom_doc)),
      MF::custom(FieldSpec::real("ns_coefficient_c", kCustomNs.c, std::string("c") + custom_doc)),
      MF::custom(FieldSpec::integer("num_ns_steps", 0, "Newton–Schulz steps (0: the set's default)",
                                    0.0, static_cast<double>(kMaxNsSteps - 1)),
                 [](MuonOptions& o, const OptimizerSettings& s) {
                   if (s.get_int("num_ns_steps") > 0) o.ns_steps(s.get_int("num_ns_steps"));
                 }),
      MF::custom(FieldSpec::real("ns_eps", d.ns().eps(), "Newton–Schulz normalization epsilon", 0.0)
                     .exclusive_min(),
                 [](MuonOptions& o, const OptimizerSettings& s) { o.ns_eps(s.get_double("ns_eps")); }),
      MF::text("ns_eps_mode", &MuonOptions::ns_eps_mode, to_string(d.ns().eps_mode()),
               "where ns_eps enters: add, X/(‖X‖+eps) (Keller Jordan's Muon); clamp, "
               "X/max(‖X‖, eps) (torch.optim.Muon, Emerging-Optimizers)",
               ns_eps_mode_names()),
      MF::custom(FieldSpec::text("ns_compute_dtype", detail::dtype_name(d.ns().compute_dtype()),
                                 "Newton–Schulz compute dtype", detail::dtype_names()),
                 [](MuonOptions& o, const OptimizerSettings& s) {
                   o.ns_compute_dtype(detail::parse_dtype(s.get_string("ns_compute_dtype"), "",
                                                          "muon_ns_compute_dtype"));
                 }),
  };
}

// scale_mode .. num_heads: the scale, step 4's alternatives and the matrices' split.
// scale_mode's default is spectral, not MuonOptions' own: the config pairs
// Muon with the common lr (3e-4, AdamW's scale, shared by every optimizer of
// a config), and spectral scaling gives the orthogonalized update RMS ~1, on
// AdamW's scale too; MuonOptions pairs kDefaultMuonLr (0.02) with
// shape_scaling (docs/config.md).
std::vector<MuonField> muon_shape_fields(const MuonOptions& d) {
  using O = MuonOptions;
  const auto split = [](MuonOptions& o, const OptimizerSettings& s) {
    if (!s.get_bool("split_qkv")) return;
    TORCH_CHECK_VALUE(!s.get_int_list("qkv_split_sizes").empty(),
                      "muon_split_qkv is true but muon_qkv_split_sizes is empty");
    o.split_sizes(s.get_int_list("qkv_split_sizes")).num_query_groups(s.get_int("num_query_groups"));
  };
  return {
      MF::text("scale_mode", &O::scale_mode, to_string(ScaleMode::kSpectral),
               "shape-dependent scale of the update", scale_mode_names()),
      MF::real("extra_scale_factor", &O::extra_scale_factor, d.extra_scale_factor(),
               "extra multiplier of the scale", 0.0)
          .exclusive_min(),
      MF::text("spectral_update", &O::spectral_update, to_string(d.spectral_update()),
               "step 4: none (Newton–Schulz) | clip (spectral_clip(M, spectral_sigma_min, "
               "spectral_sigma_max)) | hardcap (spectral_hardcap(M, spectral_hardcap_beta))",
               {"none", "clip", "hardcap"}),
      MF::real("spectral_sigma_min", &O::spectral_sigma_min, d.spectral_sigma_min(),
               "σmin of spectral_update clip"),
      MF::real("spectral_sigma_max", &O::spectral_sigma_max, d.spectral_sigma_max(),
               "σmax of spectral_update clip"),
      MF::real("spectral_hardcap_beta", &O::spectral_hardcap_beta, d.spectral_hardcap_beta(),
               "β of spectral_update hardcap", 0.0)
          .exclusive_min(),
      MF::boolean("stacked_experts", &O::stacked_experts, d.stacked_experts(),
                  "treat ndim >= 3 parameters as stacks of expert matrices"),
      MF::custom(FieldSpec::boolean("split_qkv", false,
                                    "split fused QKV matrices into qkv_split_sizes blocks (set it "
                                    "per parameter with an override rule)"),
                 split),
      MF::custom(FieldSpec::int_list("qkv_split_sizes", d.split_sizes(),
                                     "rows of each QKV block per query group", 1.0)),
      MF::custom(FieldSpec::integer("num_query_groups", d.num_query_groups(),
                                    "query groups of a split QKV matrix", 1.0)),
      MF::integer("num_heads", &O::num_heads, d.num_heads(),
                  "per-head Newton–Schulz: rows split into this many equal blocks of "
                  "consecutive rows, each orthogonalized and scaled alone (0, 1: off)",
                  0.0),
  };
}

// Every muon_* field, in the config's order. Their defaults are MuonOptions'
// own, except scale_mode (muon_shape_fields).
const std::vector<MuonField>& muon_fields() {
  static const auto fields = [] {
    const MuonOptions d;
    auto all = muon_momentum_fields(d);
    for (auto part : {muon_ns_fields(d), muon_shape_fields(d)}) {
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }();
  return fields;
}

}  // namespace

MuonOptions detail::muon_options_from(const OptimizerSettings& settings) {
  return options_from(muon_fields(), settings);
}

void detail::register_muon(OptimizerRegistry& registry) {
  auto e = options_entry<Muon, MuonOptions>(
      "muon", muon_state(),
      "Muon (muon::Muon): momentum orthogonalized by Newton–Schulz; 1-D, embedding and head "
      "parameters go to scalar_optimizer",
      muon_fields());
  e.default_overrides = scalar_defaults("muon");
  registry.add(detail::hookable<MuonOptions>(std::move(e), "decoupled"));
}

}  // namespace muon
