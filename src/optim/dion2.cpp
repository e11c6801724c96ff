// Dion2 and NorDion2: options, state, the whole-parameter step, save/load.
#include "muon/optim/dion2.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <array>
#include <cmath>
#include <memory>
#include <tuple>
#include <utility>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "option_fields.h"
#include "muon/compat.h"
#include "muon/newton_schulz.h"
#include "optim/closure.h"
#include "optim/elementwise_optimizer.h"
#include "optim/step_transaction.h"
#include "util/fault_injection.h"
#include "util/dtype_names.h"
#include "util/names.h"
#include "util/scale.h"

namespace muon {

// The archive's name of the options' enum field (muon/optim/listed_fields.h).
template <>
Dion2AdjustLr detail::parse_listed_enum<Dion2AdjustLr>(const std::string& name) {
  return parse_dion2_adjust_lr(name);
}

template struct ListedOptions<Dion2Options>;
template struct ListedParamState<Dion2ParamState, 2>;

namespace {

using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::Dion2] ";
constexpr detail::EnumName<Dion2AdjustLr> kAdjustLrModes[] = {
    {Dion2AdjustLr::kSpectralNorm, "spectral_norm"},
    {Dion2AdjustLr::kRmsNorm, "rms_norm"},
    {Dion2AdjustLr::kNone, "none"}};
constexpr const char* kWhoNor = "[muon::NorDion2] ";
// NorMuon's normalization constants (dion/normuon.py).
constexpr double kNorMuonEps = 1e-8;
constexpr double kNorMuonMinNorm = 1e-8;
// The fixed point of the selection's norms: 2^40 units per the matrix's largest |M|.
constexpr double kFixedPointOne = 1099511627776.0;

// NorMuon's normalization of O (B × k × c) with the selected rows' variance
// v (B × k × 1, updated in place): dion/normuon.py _normuon_normalization_core.
at::Tensor normuon_normalize(const at::Tensor& o, at::Tensor& v, double beta2) {
  const auto u = o.to(v.scalar_type());
  const auto norm_u = at::linalg_vector_norm(u, 2, {-2, -1}, /*keepdim=*/true);
  const auto neuron = (u * u).mean(-1, /*keepdim=*/true);
  v = at::lerp(v, neuron, 1 - beta2);
  auto normalized = u / (v.sqrt() + kNorMuonEps);
  const auto norm_new =
      at::linalg_vector_norm(normalized, 2, {-2, -1}, /*keepdim=*/true).clamp_min(kNorMuonMinNorm);
  return normalized * (norm_u / norm_new);
}

}  // namespace

MUON_DEFINE_ENUM_NAMES(Dion2AdjustLr, parse_dion2_adjust_lr, kAdjustLrModes, kWho, "adjust_lr");

namespace detail {

std::array<int64_t, 3> dion2_matrix_dims(at::IntArrayRef shape, const bool flatten) {
  TORCH_INTERNAL_ASSERT(shape.size() >= 2);
  if (flatten) {
    int64_t cols = 1;
    for (size_t d = 1; d < shape.size(); ++d) cols *= shape[d];
    return {1, shape[0], cols};
  }
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < shape.size(); ++d) batch *= shape[d];
  return {batch, shape[shape.size() - 2], shape[shape.size() - 1]};
}

std::vector<int64_t> dion2_variance_shape(at::IntArrayRef shape, const bool flatten) {
  if (flatten) return {shape[0], 1};
  std::vector<int64_t> out(shape.begin(), shape.end());
  out.back() = 1;
  return out;
}

double dion2_adjusted_lr(at::IntArrayRef shape, const Dion2Options& o) {
  const auto dims = dion2_matrix_dims(shape, o.flatten());
  const double fan_out = static_cast<double>(dims[1]);
  const double fan_in = static_cast<double>(dims[2]);
  switch (o.adjust_lr()) {
    case Dion2AdjustLr::kSpectralNorm:
      return o.lr() * std::sqrt(fan_out / fan_in);
    case Dion2AdjustLr::kRmsNorm:
      return o.lr() * (0.2 * std::sqrt(std::max(fan_out, fan_in)));
    case Dion2AdjustLr::kNone:
      return o.lr();
  }
  return o.lr();
}

int64_t dion2_k(const double fraction, const int64_t n) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(fraction * static_cast<double>(n))));
}

at::Tensor dion2_fixed_point_norms(const at::Tensor& mv, const at::Tensor& max,
                                   const bool by_rows) {
  const auto m = max.to(at::kDouble);
  const auto scale =
      at::where(m.gt(0).logical_and(m.isfinite()), kFixedPointOne / m, at::zeros_like(m));
  const auto q = (mv.to(at::kDouble).abs() * scale.view({-1, 1, 1})).round().to(at::kLong);
  return q.sum(by_rows ? 2 : 1);
}

at::Tensor dion2_top_k(const at::Tensor& norms, const int64_t k) {
  const auto order = std::get<1>(norms.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true));
  return std::get<0>(order.narrow(-1, 0, k).sort(/*dim=*/-1));
}

at::Tensor dion2_orthogonalize(const at::Tensor& selected, at::Tensor* v_sel,
                               const Dion2Options& o) {
  fault_point("Dion2's Newton-Schulz");
  auto orth = newton_schulz(selected, o.ns());
  if (v_sel != nullptr) orth = normuon_normalize(orth, *v_sel, o.muon_beta2());
  return orth.to(selected.scalar_type());
}

at::Tensor dion2_update(const at::Tensor& grad, Dion2ParamState& st, const Dion2Options& o) {
  const auto dims = dion2_matrix_dims(grad.sizes(), o.flatten());
  const int64_t batch = dims[0];
  const int64_t rows = dims[1];
  const int64_t cols = dims[2];
  if (!st.momentum().defined()) st.momentum(at::zeros_like(grad, at::MemoryFormat::Contiguous));
  if (o.nordion2() && !st.variance().defined()) {
    st.variance(at::zeros(dion2_variance_shape(grad.sizes(), o.flatten()), grad.options()));
  }
  st.step(st.step() + 1);
  auto& m = st.momentum();
  m.add_(grad.to(m.scalar_type()));
  if (batch == 0) return at::zeros_like(grad);  // an empty shard of stacked matrices
  const auto mv = m.view({batch, rows, cols});

  // The selection: rows when rows <= cols (NorDion2: always), else columns,
  // by fixed-point L1 norms; ties to the lower index.
  const bool by_rows = o.nordion2() || rows <= cols;
  const int64_t select_dim = by_rows ? 1 : 2;
  const int64_t k = dion2_k(o.fraction(), by_rows ? rows : cols);
  const auto idx = dion2_top_k(dion2_fixed_point_norms(mv, mv.abs().amax({1, 2}), by_rows), k);
  const auto idx_exp = by_rows ? idx.unsqueeze(-1).expand({batch, k, cols})
                               : idx.unsqueeze(1).expand({batch, rows, k});
  const auto selected = mv.gather(select_dim, idx_exp);
  // Error feedback: the selected slices of M decay.
  mv.scatter_(select_dim, idx_exp, selected * o.ef_decay());

  at::Tensor orth;
  if (o.nordion2()) {
    const auto vv = st.variance().view({batch, rows, 1});
    const auto vidx = idx.unsqueeze(-1);
    auto v_sel = vv.gather(1, vidx);
    orth = dion2_orthogonalize(selected, &v_sel, o);
    vv.scatter_(1, vidx, v_sel);
  } else {
    orth = dion2_orthogonalize(selected, nullptr, o);
  }
  auto update = at::zeros({batch, rows, cols}, grad.options());
  update.scatter_(select_dim, idx_exp, orth.to(grad.scalar_type()));
  return update.view(grad.sizes());
}

}  // namespace detail

// ---- Dion2Options ------------------------------------------------------------

Dion2Options NorDion2Options(double lr) { return Dion2Options(lr).nordion2(true); }

Dion2Options& Dion2Options::adjust_lr(const std::string& name) {
  adjust_lr_ = parse_dion2_adjust_lr(name);
  return *this;
}

NewtonSchulzOptions Dion2Options::ns() const {
  NewtonSchulzOptions ns;
  ns.coefficients(ns_coefficients_).eps(epsilon_).compute_dtype(ns_compute_dtype_);
  if (ns_steps_ > 0) ns.steps(ns_steps_);
  return ns;
}

void Dion2Options::validate() const {
  const char* who = nordion2_ ? kWhoNor : kWho;
  detail::check_non_negative(who, {{"lr", lr_}, {"weight_decay", weight_decay_}});
  TORCH_CHECK_VALUE(fraction_ > 0 && fraction_ <= 1, who, "fraction must be in (0, 1], got ",
                    fraction_);
  // The selected slices of M are multiplied by it at every selection: above 1 they overflow.
  TORCH_CHECK_VALUE(ef_decay_ >= 0 && ef_decay_ <= 1, who, nordion2_ ? "mu" : "ef_decay",
                    " must be in [0, 1], got ", ef_decay_);
  detail::check_positive(who, "epsilon", epsilon_);
  // v ← β·v + (1 − β)·u²: above 1 v turns negative and its square root NaN.
  detail::check_decay(who, "muon_beta2", muon_beta2_);
  detail::check_name(ns_coefficients_, accepted_coefficient_set_names(), who, "ns_coefficients");
  TORCH_CHECK_VALUE(ns_steps_ == 0 || (ns_steps_ >= kMinNsSteps && ns_steps_ < kMaxNsSteps), who,
                    "ns_steps must be 0 (the set's default) or in [", kMinNsSteps, ", ",
                    kMaxNsSteps, "), got ", ns_steps_);
  TORCH_CHECK_VALUE(ns_compute_dtype_ == at::kFloat || ns_compute_dtype_ == at::kBFloat16 ||
                        ns_compute_dtype_ == at::kDouble,
                    who, "ns_compute_dtype must be float32, bfloat16 or float64, got ",
                    detail::dtype_name(ns_compute_dtype_));
}

// ---- Dion2ParamState ---------------------------------------------------------

// ---- Dion2 -------------------------------------------------------------------

Dion2::Dion2(std::vector<OptimizerParamGroup> param_groups, Dion2Options defaults, bool check)
    : Optimizer(param_groups, std::make_unique<Dion2Options>(defaults)) {
  defaults.validate();
  compat::reapply_group_options(*this, param_groups);
  if (check) check_before_step();
}

Dion2::Dion2(std::vector<OptimizerParamGroup> param_groups, Dion2Options defaults)
    : Dion2(std::move(param_groups), std::move(defaults), true) {}

Dion2::Dion2(std::vector<at::Tensor> params, Dion2Options defaults)
    : Dion2(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
            std::move(defaults)) {}

bool Dion2::is_nordion2() const { return static_cast<const Dion2Options&>(defaults()).nordion2(); }

const char* Dion2::who() const { return is_nordion2() ? kWhoNor : kWho; }

void Dion2::check_before_step() {
  detail::check_group_options<Dion2Options>(param_groups_, who(), "muon::Dion2Options");
  const bool nor = is_nordion2();
  for (const auto g : c10::irange(param_groups_.size())) {
    const auto& o = static_cast<const Dion2Options&>(param_groups_[g].options());
    TORCH_CHECK_VALUE(o.nordion2() == nor, who(), "param group ", g, " has nordion2 ",
                      o.nordion2() ? "true" : "false", ", the defaults ", nor ? "true" : "false",
                      "; one optimizer runs one algorithm");
    TORCH_CHECK_VALUE(!nor || o.flatten() == static_cast<const Dion2Options&>(defaults()).flatten(),
                      who(), "param group ", g, " has flatten ", o.flatten() ? "true" : "false",
                      ", the defaults the other; NorDion2's variance has one shape per optimizer");
    for (const auto& p : param_groups_[g].params()) {
      TORCH_CHECK_VALUE(p.dim() >= 2, who(), "parameter of group ", g, " has ", p.dim(), " dims; ",
                        o.algorithm(),
                        " steps matrices (give 0-d and 1-d parameters to another optimizer)");
    }
  }
}

std::vector<int64_t> Dion2::whole_shape(const at::Tensor& param) const {
  return param.sizes().vec();
}

void Dion2::step_parameters() {
  auto& states = state();
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const Dion2Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<Dion2ParamState>();
      auto& st = static_cast<Dion2ParamState&>(*slot);
      const auto u = detail::dion2_update(p.grad(), st, o);
      muon::detail::scale_(p, 1 - o.lr() * o.weight_decay());
      p.add_(u, -detail::dion2_adjusted_lr(p.sizes(), o));
    }
  }
}

at::Tensor Dion2::step(LossClosure closure) {
  return guarded_step(
      *this, closure, who(), [this] { check_before_step(); }, [this] { step_parameters(); });
}

int64_t Dion2::state_bytes() const {
  return detail::buffer_bytes<Dion2ParamState>(*this, [](const Dion2ParamState& s) {
    return std::array<const at::Tensor*, 2>{&s.momentum(), &s.variance()};
  });
}

void Dion2::save(OutputArchive& archive) const {
  if (is_nordion2()) {
    detail::save_with_options<Dion2ParamState, Dion2Options>(*this, archive, "nordion2",
                                                             "muon::NorDion2");
  } else {
    detail::save_with_options<Dion2ParamState, Dion2Options>(*this, archive, "dion2",
                                                             "muon::Dion2");
  }
}

void Dion2::load(InputArchive& archive) {
  if (is_nordion2()) {
    detail::load_with_options<Dion2ParamState, Dion2Options>(*this, archive, "nordion2", kWhoNor,
                                                             "muon::NorDion2");
  } else {
    detail::load_with_options<Dion2ParamState, Dion2Options>(*this, archive, "dion2", kWho,
                                                             "muon::Dion2");
  }
}

namespace {

// Dion2's or NorDion2's entry (muon::Dion2): defaults are Dion's
// (Dion2Options), lr and weight_decay aside (the common fields). They
// orthogonalize matrices: 1-D, embedding and head parameters go to scalar_optimizer.
OptimizerEntry dion2_entry(const bool nordion2) {
  using O = Dion2Options;
  using F = detail::OptionFields<O>;
  const std::string name = nordion2 ? "nordion2" : "dion2";
  const O d = nordion2 ? NorDion2Options() : Dion2Options();
  const auto dtype = [](O& o, const OptimizerSettings& s) {
    o.ns_compute_dtype(detail::parse_dtype(s.get_string("ns_compute_dtype"), "", "ns_compute_dtype"));
  };
  std::vector<detail::OptionField<O>> fields{
      F::real("fraction", &O::fraction, "fraction of rows (or columns) orthogonalized per step", 0.0, 1.0)
          .exclusive_min(),
      F::real(nordion2 ? "mu" : "ef_decay", &O::ef_decay, d.ef_decay(),
              "error-feedback decay of the selected slices of the momentum", 0.0, 1.0),
      F::common("weight_decay", &O::weight_decay),
      F::real("epsilon", &O::epsilon, "Newton–Schulz normalization epsilon", 0.0).exclusive_min(),
      F::text("adjust_lr", &O::adjust_lr, to_string(d.adjust_lr()),
              "lr scale: spectral_norm sqrt(fan_out/fan_in), rms_norm 0.2·sqrt(max), none",
              {"spectral_norm", "rms_norm", "none"}),
      F::boolean("flatten", &O::flatten, "3-D+ parameters as one matrix (dim 0 × rest), else a batch"),
      F::text("coefficient_type", &O::ns_coefficients, d.ns_coefficients(), "Newton–Schulz coefficient set",
              accepted_coefficient_set_names()),
      F::integer("num_ns_steps", &O::ns_steps, 0, "Newton–Schulz steps (0: the set's default)", 0.0,
                 static_cast<double>(kMaxNsSteps - 1)),
      F::custom(FieldSpec::text("ns_compute_dtype", "float32", "Newton–Schulz compute dtype",
                                {"float32", "bfloat16", "float64"}),
                dtype),
  };
  if (nordion2) {
    fields.push_back(F::real("muon_beta2", &O::muon_beta2, "decay of the per-row variance", 0.0, 1.0).exclusive_max());
  }
  auto e = detail::options_entry<Dion2, O>(
      name, detail::dion2_state(nordion2),
      nordion2 ? "NorDion2 (muon::Dion2 with nordion2): Dion2 on rows with NorMuon's per-row "
                 "normalization; 1-D, embedding and head parameters go to scalar_optimizer"
               : "Dion2 (muon::Dion2): Newton–Schulz on the top fraction of rows or columns of "
                 "the momentum, with error feedback; 1-D, embedding and head parameters go to "
                 "scalar_optimizer",
      std::move(fields), [nordion2](O& o, const OptimizerSettings&) { o.nordion2(nordion2); });
  e.default_overrides = detail::scalar_defaults(name);
  return e;
}

}  // namespace

void detail::register_dion2(OptimizerRegistry& registry) {
  registry.add(detail::hookable<Dion2Options>(dion2_entry(/*nordion2=*/false), "decoupled"));
  registry.add(detail::hookable<Dion2Options>(dion2_entry(/*nordion2=*/true), "decoupled"));
}

}  // namespace muon
