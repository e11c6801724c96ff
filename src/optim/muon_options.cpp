// muon::Muon's options and per-parameter state: names, validation, archives.
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "muon/optim/muon.h"
#include "optim/muon_fused.h"
#include "util/dtype_names.h"
#include "util/names.h"
#include "optim/option_checks.h"

namespace muon {
namespace {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::Muon] ";

constexpr detail::EnumName<MomentumStyle> kMomentumStyles[] = {{MomentumStyle::kEma, "ema"},
                                                              {MomentumStyle::kClassic, "classic"}};
constexpr detail::EnumName<WeightDecayMode> kWeightDecayModes[] = {
    {WeightDecayMode::kDecoupled, "decoupled"},
    {WeightDecayMode::kIndependent, "independent"},
    {WeightDecayMode::kL2, "l2"},
    {WeightDecayMode::kPalm, "palm"},
    {WeightDecayMode::kSpectralClipped, "spectral_clipped"},
    {WeightDecayMode::kCautious, "cautious"}};
constexpr detail::EnumName<SpectralUpdate> kSpectralUpdates[] = {
    {SpectralUpdate::kNone, "none"}, {SpectralUpdate::kClip, "clip"}, {SpectralUpdate::kHardcap, "hardcap"}};

// ---- serialization helpers ---------------------------------------------------

template <typename T>
T read_value(InputArchive& archive, const char* key) {
  c10::IValue v;
  archive.read(key, v);
  return v.to<T>();
}

std::string schedule_name(StepSchedule s) {
  return s == StepSchedule::kCycle ? "cycle" : "repeat_last";
}

void write_ns(OutputArchive& archive, const NewtonSchulzOptions& ns) {
  const auto& set = ns.coefficients();
  std::vector<double> flat;
  for (const auto& k : set.coefficients) flat.insert(flat.end(), {k.a, k.b, k.c});
  archive.write("ns_set_name", c10::IValue(set.name));
  archive.write("ns_set_coefficients", c10::IValue(flat));
  archive.write("ns_set_schedule", c10::IValue(schedule_name(set.schedule)));
  archive.write("ns_set_safety_factor", c10::IValue(set.safety_factor));
  archive.write("ns_set_default_steps", c10::IValue(set.default_steps));
  archive.write("ns_set_description", c10::IValue(set.description));
  archive.write("ns_steps", c10::IValue(ns.steps_is_set() ? ns.steps() : int64_t{0}));
  archive.write("ns_eps", c10::IValue(ns.eps()));
  archive.write("ns_eps_mode", c10::IValue(to_string(ns.eps_mode())));
  archive.write("ns_compute_dtype", c10::IValue(std::string(c10::toString(ns.compute_dtype()))));
  archive.write("ns_method", c10::IValue(to_string(ns.method())));
  archive.write("ns_symmetric", c10::IValue(ns.symmetric()));
}

bool same_values(const CoefficientSet& x, const CoefficientSet& y) {
  if (x.schedule != y.schedule || x.safety_factor != y.safety_factor ||
      x.coefficients.size() != y.coefficients.size()) {
    return false;
  }
  for (size_t i = 0; i < x.coefficients.size(); ++i) {
    const auto& p = x.coefficients[i];
    const auto& q = y.coefficients[i];
    if (p.a != q.a || p.b != q.b || p.c != q.c) return false;
  }
  return true;
}

// An archive stores a built-in set with the name it had when written. A
// name the library has since given to another set (`polar_express` was the
// 5-step set, now `polar_express_5`), or an alias, is resolved by the stored
// values: the built-in set holding them, under its current name. The stored
// coefficients are what the run used, so they always win; a set no built-in
// holds keeps its stored name (a custom set).
CoefficientSet builtin_or_stored(CoefficientSet stored) {
  const auto names = accepted_coefficient_set_names();
  if (std::find(names.begin(), names.end(), stored.name) == names.end()) return stored;
  if (same_values(coefficient_set(stored.name), stored)) return coefficient_set(stored.name);
  for (const auto& name : coefficient_set_names()) {
    if (same_values(coefficient_set(name), stored)) return coefficient_set(name);
  }
  return stored;
}

NewtonSchulzOptions read_ns(InputArchive& archive) {
  CoefficientSet set;
  set.name = read_value<std::string>(archive, "ns_set_name");
  c10::IValue flat_value;
  archive.read("ns_set_coefficients", flat_value);
  const auto flat = flat_value.toDoubleVector();
  TORCH_CHECK_VALUE(flat.size() % 3 == 0 && !flat.empty(), kWho,
                    "archive holds a malformed coefficient list of length ", flat.size());
  for (size_t i = 0; i < flat.size(); i += 3) set.coefficients.push_back({flat[i], flat[i + 1], flat[i + 2]});
  set.schedule = read_value<std::string>(archive, "ns_set_schedule") == "cycle"
                     ? StepSchedule::kCycle
                     : StepSchedule::kRepeatLast;
  set.safety_factor = read_value<double>(archive, "ns_set_safety_factor");
  set.default_steps = read_value<int64_t>(archive, "ns_set_default_steps");
  set.description = read_value<std::string>(archive, "ns_set_description");

  NewtonSchulzOptions ns;
  ns.coefficient_set(builtin_or_stored(std::move(set)));
  const auto steps = read_value<int64_t>(archive, "ns_steps");
  if (steps > 0) ns.steps(steps);
  ns.eps(read_value<double>(archive, "ns_eps"));
  // Archives written before the eps mode existed normalized by adding eps.
  c10::IValue eps_mode;
  ns.eps_mode(archive.try_read("ns_eps_mode", eps_mode) ? parse_ns_eps_mode(eps_mode.toStringRef())
                                                         : NsEpsMode::kAdd);
  ns.compute_dtype(
      detail::parse_dtype(read_value<std::string>(archive, "ns_compute_dtype"), kWho, "the archive's ns_compute_dtype"));
  ns.method(read_value<std::string>(archive, "ns_method"));
  ns.symmetric(read_value<bool>(archive, "ns_symmetric"));
  return ns;
}

}  // namespace

// ---- enums -------------------------------------------------------------------

MUON_DEFINE_ENUM_NAMES(MomentumStyle, parse_momentum_style, kMomentumStyles, kWho, "momentum_style");

MUON_DEFINE_ENUM_NAMES(WeightDecayMode, parse_weight_decay_mode, kWeightDecayModes, kWho, "weight_decay_mode");

MUON_DEFINE_ENUM_NAMES(SpectralUpdate, parse_spectral_update, kSpectralUpdates, kWho, "spectral_update");

// ---- MuonOptions -------------------------------------------------------------

MuonOptions& MuonOptions::momentum_style(const std::string& name) {
  momentum_style_ = parse_momentum_style(name);
  return *this;
}

MuonOptions& MuonOptions::weight_decay_mode(const std::string& name) {
  weight_decay_mode_ = parse_weight_decay_mode(name);
  return *this;
}

MuonOptions& MuonOptions::spectral_update(const std::string& name) {
  spectral_update_ = parse_spectral_update(name);
  return *this;
}

bool MuonOptions::needs_spectral() const {
  return spectral_update_ != SpectralUpdate::kNone ||
         weight_decay_mode_ == WeightDecayMode::kSpectralClipped;
}

MuonOptions& MuonOptions::scale_mode(const std::string& name) {
  detail::check_name(name, scale_mode_names(), kWho, "scale_mode");
  scale_mode_ = parse_scale_mode(name);
  return *this;
}

MuonOptions& MuonOptions::ns_coefficients(const std::string& name) {
  detail::check_name(name, accepted_coefficient_set_names(), kWho, "ns_coefficients");
  ns_.coefficients(name);
  return *this;
}

MuonOptions& MuonOptions::ns_steps(int64_t steps) {
  TORCH_CHECK_VALUE(steps >= kMinNsSteps && steps < kMaxNsSteps, kWho, "ns_steps must be in [",
                    kMinNsSteps, ", ", kMaxNsSteps, "), got ", steps);
  ns_.steps(steps);
  return *this;
}

MuonOptions& MuonOptions::ns_eps(double eps) {
  detail::check_positive(kWho, "ns_eps", eps);
  ns_.eps(eps);
  return *this;
}

MuonOptions& MuonOptions::ns_eps_mode(const std::string& name) {
  detail::check_name(name, ns_eps_mode_names(), kWho, "ns_eps_mode");
  ns_.eps_mode(parse_ns_eps_mode(name));
  return *this;
}

MuonOptions& MuonOptions::ns_compute_dtype(at::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble ||
                        dtype == at::kHalf,
                    kWho, "ns_compute_dtype must be Float, BFloat16, Double or Half, got ", dtype);
  ns_.compute_dtype(dtype);
  return *this;
}

void MuonOptions::validate() const {
  detail::check_non_negative(kWho, {{"lr", lr_}, {"weight_decay", weight_decay_}});
  detail::check_decay(kWho, "momentum", momentum_);
  detail::check_finite_positive(kWho, "extra_scale_factor", extra_scale_factor_);
  TORCH_CHECK_VALUE(ns_.steps() >= kMinNsSteps && ns_.steps() < kMaxNsSteps, kWho,
                    "ns_steps must be in [", kMinNsSteps, ", ", kMaxNsSteps, "), got ", ns_.steps());
  detail::check_positive(kWho, "ns_eps", ns_.eps());
  ns_.validate();
  TORCH_CHECK_VALUE(num_query_groups_ >= 1, kWho, "num_query_groups must be >= 1, got ",
                    num_query_groups_);
  for (size_t i = 0; i < split_sizes_.size(); ++i) {
    TORCH_CHECK_VALUE(split_sizes_[i] >= 1, kWho, "split_sizes[", i, "] must be >= 1, got ",
                      split_sizes_[i], " (split_sizes ", c10::IntArrayRef(split_sizes_), ")");
  }
  TORCH_CHECK_VALUE(split_sizes_.empty() ? num_query_groups_ == 1 : true, kWho,
                    "num_query_groups must be 1 when split_sizes is empty, got ",
                    num_query_groups_);
  TORCH_CHECK_VALUE(num_heads_ >= 0, kWho, "num_heads must be >= 0 (0 or 1: off), got ",
                    num_heads_);
  for (size_t i = 0; i < split_sizes_.size() && num_heads_ > 1; ++i) {
    const int64_t block = num_query_groups_ * split_sizes_[i];
    TORCH_CHECK_VALUE(block % num_heads_ == 0, kWho, "num_heads ", num_heads_,
                      " must divide the rows of every split block; block ", i, " has ",
                      num_query_groups_, " × ", split_sizes_[i], " = ", block,
                      " rows (split_sizes ", c10::IntArrayRef(split_sizes_), ")");
  }
  detail::check_finite_positive(kWho, "spectral_wd_beta", spectral_wd_beta_);
  if (weight_decay_mode_ == WeightDecayMode::kSpectralClipped) {
    // The decoupled form: each step moves a fraction c = lr·wd of the way.
    const double c = lr_ * weight_decay_;
    TORCH_CHECK_VALUE(c <= 1, kWho, "weight_decay_mode spectral_clipped needs lr·weight_decay "
                      "in [0, 1], got lr·weight_decay = ", c, " (lr ", lr_, ", weight_decay ",
                      weight_decay_, ")");
  }
  TORCH_CHECK_VALUE(std::isfinite(spectral_sigma_min_) && std::isfinite(spectral_sigma_max_) &&
                        spectral_sigma_min_ <= spectral_sigma_max_,
                    kWho, "spectral_sigma_min must be <= spectral_sigma_max (both finite), got "
                    "spectral_sigma_min ", spectral_sigma_min_, ", spectral_sigma_max ",
                    spectral_sigma_max_);
  detail::check_finite_positive(kWho, "spectral_hardcap_beta", spectral_hardcap_beta_);
}

double MuonOptions::get_lr() const { return lr(); }

void MuonOptions::set_lr(const double lr) { this->lr(lr); }

void MuonOptions::serialize(OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr_));
  archive.write("momentum", c10::IValue(momentum_));
  archive.write("nesterov", c10::IValue(nesterov_));
  archive.write("momentum_style", c10::IValue(to_string(momentum_style_)));
  archive.write("weight_decay", c10::IValue(weight_decay_));
  archive.write("weight_decay_mode", c10::IValue(to_string(weight_decay_mode_)));
  write_ns(archive, ns_);
  archive.write("scale_mode", c10::IValue(to_string(scale_mode_)));
  archive.write("extra_scale_factor", c10::IValue(extra_scale_factor_));
  archive.write("stacked_experts", c10::IValue(stacked_experts_));
  archive.write("split_sizes", c10::IValue(split_sizes_));
  archive.write("num_query_groups", c10::IValue(num_query_groups_));
  archive.write("num_heads", c10::IValue(num_heads_));
  archive.write("spectral_wd_beta", c10::IValue(spectral_wd_beta_));
  archive.write("spectral_update", c10::IValue(to_string(spectral_update_)));
  archive.write("spectral_sigma_min", c10::IValue(spectral_sigma_min_));
  archive.write("spectral_sigma_max", c10::IValue(spectral_sigma_max_));
  archive.write("spectral_hardcap_beta", c10::IValue(spectral_hardcap_beta_));
}

void MuonOptions::mix_settings(SettingsDigest& mix) const {
  mix(momentum_, nesterov_, momentum_style_, weight_decay_, weight_decay_mode_, scale_mode_,
      extra_scale_factor_, stacked_experts_, num_query_groups_, num_heads_);
  for (const auto s : split_sizes_) mix(s);
  mix(ns_.steps(), ns_.eps(), ns_.eps_mode(), ns_.compute_dtype(), ns_.method(), ns_.symmetric());
  for (const auto& c : ns_.schedule()) mix(c.a, c.b, c.c);
  mix(spectral_wd_beta_, spectral_update_, spectral_sigma_min_, spectral_sigma_max_,
      spectral_hardcap_beta_);
}

void MuonOptions::serialize(InputArchive& archive) {
  lr_ = read_value<double>(archive, "lr");
  momentum_ = read_value<double>(archive, "momentum");
  nesterov_ = read_value<bool>(archive, "nesterov");
  momentum_style_ = parse_momentum_style(read_value<std::string>(archive, "momentum_style"));
  weight_decay_ = read_value<double>(archive, "weight_decay");
  weight_decay_mode_ =
      parse_weight_decay_mode(read_value<std::string>(archive, "weight_decay_mode"));
  ns_ = read_ns(archive);
  scale_mode_ = parse_scale_mode(read_value<std::string>(archive, "scale_mode"));
  extra_scale_factor_ = read_value<double>(archive, "extra_scale_factor");
  stacked_experts_ = read_value<bool>(archive, "stacked_experts");
  c10::IValue split;
  archive.read("split_sizes", split);
  split_sizes_ = split.toIntVector();
  num_query_groups_ = read_value<int64_t>(archive, "num_query_groups");
  // Archives written before the spectral options existed read as their
  // defaults (Newton–Schulz, no spectral decay: what those runs did).
  const MuonOptions defaults;
  c10::IValue v;
  spectral_wd_beta_ = archive.try_read("spectral_wd_beta", v) ? v.toDouble() : defaults.spectral_wd_beta();
  spectral_update_ = archive.try_read("spectral_update", v) ? parse_spectral_update(v.toStringRef())
                                                            : defaults.spectral_update();
  spectral_sigma_min_ =
      archive.try_read("spectral_sigma_min", v) ? v.toDouble() : defaults.spectral_sigma_min();
  spectral_sigma_max_ =
      archive.try_read("spectral_sigma_max", v) ? v.toDouble() : defaults.spectral_sigma_max();
  spectral_hardcap_beta_ =
      archive.try_read("spectral_hardcap_beta", v) ? v.toDouble() : defaults.spectral_hardcap_beta();
  // Archives written before num_heads existed: off.
  num_heads_ = archive.try_read("num_heads", v) ? v.toInt() : defaults.num_heads();
}

bool operator==(const MuonOptions& a, const MuonOptions& b) {
  return a.lr() == b.lr() && a.momentum() == b.momentum() && a.nesterov() == b.nesterov() &&
         a.momentum_style() == b.momentum_style() && a.weight_decay() == b.weight_decay() &&
         a.weight_decay_mode() == b.weight_decay_mode() && a.ns() == b.ns() &&
         a.scale_mode() == b.scale_mode() && a.extra_scale_factor() == b.extra_scale_factor() &&
         a.stacked_experts() == b.stacked_experts() && a.split_sizes() == b.split_sizes() &&
         a.num_query_groups() == b.num_query_groups() && a.num_heads() == b.num_heads() &&
         a.spectral_wd_beta() == b.spectral_wd_beta() &&
         a.spectral_update() == b.spectral_update() &&
         a.spectral_sigma_min() == b.spectral_sigma_min() &&
         a.spectral_sigma_max() == b.spectral_sigma_max() &&
         a.spectral_hardcap_beta() == b.spectral_hardcap_beta();
}

void check_spectral_options_need_whole_matrices(const MuonOptions& o, size_t group,
                                                const std::string& who, const std::string& layout) {
  TORCH_CHECK_VALUE(o.spectral_update() == SpectralUpdate::kNone, who, "param group ", group,
                    ": muon_spectral_update '", to_string(o.spectral_update()),
                    "' needs whole matrices on one process, and the '", layout,
                    "' layout gives each process a part of them; use spectral_update none, or "
                    "run on one process or in the layerwise layout");
  TORCH_CHECK_VALUE(o.weight_decay_mode() != WeightDecayMode::kSpectralClipped, who,
                    "param group ", group,
                    ": muon_weight_decay_mode 'spectral_clipped' needs whole matrices on one "
                    "process, and the '", layout, "' layout gives each process a part of them; "
                    "use another weight_decay_mode, or run on one process or in the layerwise "
                    "layout");
}

// ---- MuonParamState ----------------------------------------------------------

void MuonParamState::serialize(OutputArchive& archive) const {
  archive.write("step", c10::IValue(step_));
  if (momentum_buffer_.defined()) archive.write("momentum_buffer", momentum_buffer_, /*is_buffer=*/true);
}

void MuonParamState::serialize(InputArchive& archive) {
  step_ = read_value<int64_t>(archive, "step");
  at::Tensor buf;
  if (archive.try_read("momentum_buffer", buf, /*is_buffer=*/true)) momentum_buffer_ = buf;
}

bool operator==(const MuonParamState& a, const MuonParamState& b) {
  if (a.step() != b.step()) return false;
  const auto& x = a.momentum_buffer();
  const auto& y = b.momentum_buffer();
  if (x.defined() != y.defined()) return false;
  return !x.defined() || (x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
                          at::equal(x, y));
}

namespace detail {

double decay_factor(const MuonOptions& o) {
  if (o.weight_decay() == 0) return 1.0;
  switch (o.weight_decay_mode()) {
    case WeightDecayMode::kDecoupled:
      return 1 - o.lr() * o.weight_decay();
    case WeightDecayMode::kIndependent:
      return 1 - o.weight_decay();
    case WeightDecayMode::kPalm:
      return 1 - o.lr() * o.lr() * o.weight_decay();
    case WeightDecayMode::kL2:
    case WeightDecayMode::kSpectralClipped:
    case WeightDecayMode::kCautious:  // at step 6, with the update's mask
      break;
  }
  return 1.0;
}

}  // namespace detail

}  // namespace muon
