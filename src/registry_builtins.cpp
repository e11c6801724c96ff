// The built-in registry entries (muon, adaptive_muon, adam, adamw, sgd,
// lion, laprop, signum, sim_ademamix, soap, dion2, nordion2, polargrad, scion,
// mop, spel, muon_hyperball), registered explicitly here, and the global registry.
#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "builtin_states.h"
#include "muon/compat.h"
#include "muon/newton_schulz.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/dion2.h"
#include "muon/optim/laprop.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"
#include "muon/optim/orthogonalized_family.h"
#include "muon/optim/routing.h"
#include "muon/optim/signum.h"
#include "muon/optim/sim_ademamix.h"
#include "muon/optim/soap.h"
#include "muon/registry.h"
#include "muon/scaling.h"
#include "optim/elementwise_optimizer.h"
#include "registry_internal.h"
#include "util/dtype_names.h"

namespace muon {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamGroup;

// Builds an optimizer of type Opt over groups whose options are Options;
// the first group's options are the defaults (every group carries its own).
template <typename Opt, typename Options>
std::unique_ptr<Optimizer> build(std::vector<OptimizerParamGroup> groups) {
  const auto defaults = static_cast<const Options&>(groups.at(0).options());
  auto opt = std::make_unique<Opt>(groups, defaults);
  compat::reapply_group_options(*opt, groups);
  return opt;
}

// An entry's factory that builds an Opt with `build`.
template <typename Opt, typename Options>
decltype(OptimizerEntry::factory) build_factory() {
  return [](std::vector<OptimizerParamGroup> groups, const std::vector<OptimizerSettings>&) {
    return build<Opt, Options>(std::move(groups));
  };
}

// An entry with its name, state schema and doc line; the rest to fill in.
OptimizerEntry entry(std::string name, StateSchema state, std::string doc) {
  OptimizerEntry e;
  e.name = std::move(name);
  e.state = std::move(state);
  e.doc = std::move(doc);
  return e;
}

// Adam's and AdamW's options (Options: torch::optim::AdamOptions or
// AdamWOptions) from the adam_* fields and the common ones.
template <typename Options>
std::unique_ptr<Options> adam_options(const OptimizerSettings& s) {
  return std::make_unique<Options>(
      Options(s.get_double("lr"))
          .betas(std::make_tuple(s.get_double("beta1"), s.get_double("beta2")))
          .eps(s.get_double("eps"))
          .weight_decay(s.get_double("weight_decay")));
}

// ---- built-in entries ----------------------------------------------------------

// The hybrid's routing rules (muon::default_routing_rules), as config rules
// that send those parameters to the scalar optimizer.
std::vector<OverrideRule> scalar_defaults(const std::string& who) {
  std::vector<OverrideRule> rules;
  for (const auto rule : default_routing_rules()) {
    OverrideRule r;
    switch (rule) {
      case DefaultRule::kNdimBelow2:
        r.match_max_ndim(1);
        break;
      case DefaultRule::kEmbedding:
        r.match_embedding();
        break;
      case DefaultRule::kOutputHead:
        r.match_head();
        break;
    }
    rules.push_back(r.set("optimizer", "${scalar_optimizer}").named(who + " default: " + to_string(rule)));
  }
  return rules;
}

// coefficient_type custom's default tuple: Keller Jordan's (the set "simple").
constexpr NsCoefficients kCustomNs{3.4445, -4.7750, 2.0315};

// The built-in set names and "custom" (ns_coefficient_a, _b, _c).
std::vector<std::string> muon_coefficient_choices() {
  auto names = accepted_coefficient_set_names();
  names.emplace_back("custom");
  return names;
}

// The muon_* fields. Their defaults are MuonOptions' own, except
// scale_mode: the config pairs Muon with the common lr (3e-4, AdamW's scale,
// shared by every optimizer of a config), and spectral scaling gives the
// orthogonalized update RMS ~1, on AdamW's scale too; MuonOptions pairs
// kDefaultMuonLr (0.02) with shape_scaling (docs/config.md).
std::vector<FieldSpec> muon_fields() {
  const MuonOptions d;
  return {
      FieldSpec::real("momentum", d.momentum(), "momentum μ", 0.0, 1.0).exclusive_max(),
      FieldSpec::boolean("nesterov", d.nesterov(), "Nesterov look-ahead update"),
      FieldSpec::text("momentum_style", to_string(d.momentum_style()), "momentum accumulation",
                      {"ema", "classic"}),
      FieldSpec::text("weight_decay_mode", to_string(d.weight_decay_mode()),
                      "how weight decay enters the step (spectral_clipped: W ← "
                      "spectral_clipped_weight_decay(W, spectral_wd_beta, lr·weight_decay); "
                      "cautious: decay only where the update and the weight agree in sign)",
                      {"decoupled", "independent", "l2", "palm", "spectral_clipped", "cautious"}),
      FieldSpec::real("spectral_wd_beta", d.spectral_wd_beta(),
                      "β of weight_decay_mode spectral_clipped: singular values above it decay",
                      0.0)
          .exclusive_min(),
      FieldSpec::text("coefficient_type", d.ns().coefficients().name,
                      "Newton–Schulz coefficient set (names as in Megatron-Core; "
                      "polar_express_8 = polar_express; custom: ns_coefficient_a, _b, _c)",
                      muon_coefficient_choices()),
      FieldSpec::real("ns_coefficient_a", kCustomNs.a,
                      "a of coefficient_type custom (one (a, b, c) every step)"),
      FieldSpec::real("ns_coefficient_b", kCustomNs.b,
                      "b of coefficient_type custom (one (a, b, c) every step)"),
      FieldSpec::real("ns_coefficient_c", kCustomNs.c,
                      "c of coefficient_type custom (one (a, b, c) every step)"),
      FieldSpec::integer("num_ns_steps", 0, "Newton–Schulz steps (0: the set's default)", 0.0,
                         static_cast<double>(kMaxNsSteps - 1)),
      FieldSpec::real("ns_eps", d.ns().eps(), "Newton–Schulz normalization epsilon", 0.0)
          .exclusive_min(),
      FieldSpec::text("ns_eps_mode", to_string(d.ns().eps_mode()),
                      "where ns_eps enters: add, X/(‖X‖+eps) (Keller Jordan's Muon); clamp, "
                      "X/max(‖X‖, eps) (torch.optim.Muon, Emerging-Optimizers)",
                      ns_eps_mode_names()),
      FieldSpec::text("ns_compute_dtype", detail::dtype_name(d.ns().compute_dtype()),
                      "Newton–Schulz compute dtype", detail::dtype_names()),
      FieldSpec::text("scale_mode", to_string(ScaleMode::kSpectral),
                      "shape-dependent scale of the update", scale_mode_names()),
      FieldSpec::real("extra_scale_factor", d.extra_scale_factor(), "extra multiplier of the scale",
                      0.0)
          .exclusive_min(),
      FieldSpec::text("spectral_update", to_string(d.spectral_update()),
                      "step 4: none (Newton–Schulz) | clip (spectral_clip(M, spectral_sigma_min, "
                      "spectral_sigma_max)) | hardcap (spectral_hardcap(M, spectral_hardcap_beta))",
                      {"none", "clip", "hardcap"}),
      FieldSpec::real("spectral_sigma_min", d.spectral_sigma_min(),
                      "σmin of spectral_update clip"),
      FieldSpec::real("spectral_sigma_max", d.spectral_sigma_max(),
                      "σmax of spectral_update clip"),
      FieldSpec::real("spectral_hardcap_beta", d.spectral_hardcap_beta(),
                      "β of spectral_update hardcap", 0.0)
          .exclusive_min(),
      FieldSpec::boolean("stacked_experts", d.stacked_experts(),
                         "treat ndim >= 3 parameters as stacks of expert matrices"),
      FieldSpec::boolean("split_qkv", false,
                         "split fused QKV matrices into qkv_split_sizes blocks (set it per "
                         "parameter with an override rule)"),
      FieldSpec::int_list("qkv_split_sizes", d.split_sizes(),
                          "rows of each QKV block per query group", 1.0),
      FieldSpec::integer("num_query_groups", d.num_query_groups(),
                         "query groups of a split QKV matrix", 1.0),
      FieldSpec::integer("num_heads", d.num_heads(),
                         "per-head Newton–Schulz: rows split into this many equal blocks of "
                         "consecutive rows, each orthogonalized and scaled alone (0, 1: off)",
                         0.0),
  };
}

MuonOptions muon_options(const OptimizerSettings& s) {
  MuonOptions o(s.get_double("lr"));
  o.momentum(s.get_double("momentum"))
      .nesterov(s.get_bool("nesterov"))
      .weight_decay(s.get_double("weight_decay"))
      .extra_scale_factor(s.get_double("extra_scale_factor"))
      .stacked_experts(s.get_bool("stacked_experts"));
  o.momentum_style(s.get_string("momentum_style"));
  o.weight_decay_mode(s.get_string("weight_decay_mode"));
  o.num_heads(s.get_int("num_heads"));
  o.scale_mode(s.get_string("scale_mode"));
  if (s.get_string("coefficient_type") == "custom") {
    o.ns().coefficients({{s.get_double("ns_coefficient_a"), s.get_double("ns_coefficient_b"),
                          s.get_double("ns_coefficient_c")}},
                        StepSchedule::kRepeatLast);
  } else {
    o.ns_coefficients(s.get_string("coefficient_type"));
  }
  if (s.get_int("num_ns_steps") > 0) o.ns_steps(s.get_int("num_ns_steps"));
  o.ns_eps(s.get_double("ns_eps"));
  o.ns_eps_mode(s.get_string("ns_eps_mode"));
  o.ns_compute_dtype(
      detail::parse_dtype(s.get_string("ns_compute_dtype"), "", "muon_ns_compute_dtype"));
  if (s.get_bool("split_qkv")) {
    TORCH_CHECK_VALUE(!s.get_int_list("qkv_split_sizes").empty(),
                      "muon_split_qkv is true but muon_qkv_split_sizes is empty");
    o.split_sizes(s.get_int_list("qkv_split_sizes")).num_query_groups(s.get_int("num_query_groups"));
  }
  o.spectral_wd_beta(s.get_double("spectral_wd_beta"));
  o.spectral_update(s.get_string("spectral_update"));
  o.spectral_sigma_min(s.get_double("spectral_sigma_min"))
      .spectral_sigma_max(s.get_double("spectral_sigma_max"))
      .spectral_hardcap_beta(s.get_double("spectral_hardcap_beta"));
  o.validate();
  return o;
}

OptimizerEntry muon_entry() {
  OptimizerEntry e =
      entry("muon", detail::muon_state(),
            "Muon (muon::Muon): momentum orthogonalized by Newton–Schulz; 1-D, embedding and "
            "head parameters go to scalar_optimizer");
  e.fields = muon_fields();
  e.make_options = [](const OptimizerSettings& s) { return std::make_unique<MuonOptions>(muon_options(s)); };
  e.factory = build_factory<Muon, MuonOptions>();
  e.default_overrides = scalar_defaults("muon");
  return e;
}

OptimizerEntry adaptive_muon_entry() {
  OptimizerEntry e = entry("adaptive_muon", detail::adaptive_muon_state(),
                           "Muon with a NorMuon (per row), AdaMuon (per element) or NAMO (per matrix) "
                           "second moment "
                           "(muon::AdaptiveMuon); reads the muon_* fields too");
  e.fields = {
      FieldSpec::text("mode", "normuon",
                      "second moment: normuon (per row) | adamuon (per element) | namo (one "
                      "scalar per matrix, of the gradient norm)",
                      {"normuon", "adamuon", "namo"})
          .whole_run(),
      FieldSpec::real("beta2", 0.95, "decay of the second moment", 0.0, 1.0).exclusive_max().whole_run(),
      FieldSpec::real("eps", 1e-8, "added to the square root of the second moment", 0.0)
          .exclusive_min()
          .whole_run(),
  };
  e.uses_fields_of = {"muon"};
  e.make_options = [](const OptimizerSettings& s) { return std::make_unique<MuonOptions>(muon_options(s)); };
  e.factory = [](std::vector<OptimizerParamGroup> groups, const std::vector<OptimizerSettings>& settings) {
    // Whole-run fields: equal in every group.
    const auto adaptive = detail::adaptive_muon_options(settings.at(0));
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
        std::move(groups), defaults, detail::adaptive_muon_options(settings.at(0)),
        std::move(strategy)));
  };
  e.default_overrides = scalar_defaults("adaptive_muon");
  return e;
}

OptimizerEntry adam_entry() {
  OptimizerEntry e =
      entry("adam", detail::adam_state(), "Adam (torch::optim::Adam; weight_decay is L2)");
  e.fields = {
      FieldSpec::real("beta1", 0.9, "first-moment decay (adam and adamw)", 0.0, 1.0).exclusive_max(),
      FieldSpec::real("beta2", 0.95, "second-moment decay (adam and adamw)", 0.0, 1.0).exclusive_max(),
      FieldSpec::real("eps", 1e-8, "denominator epsilon (adam and adamw)", 0.0).exclusive_min(),
  };
  e.make_options = adam_options<torch::optim::AdamOptions>;
  e.factory = build_factory<torch::optim::Adam, torch::optim::AdamOptions>();
  return e;
}

OptimizerEntry adamw_entry() {
  OptimizerEntry e =
      entry("adamw", detail::adamw_state(),
            "AdamW (torch::optim::AdamW; decoupled weight decay); reads the adam_* fields");
  e.uses_fields_of = {"adam"};
  e.make_options = adam_options<torch::optim::AdamWOptions>;
  e.factory = build_factory<torch::optim::AdamW, torch::optim::AdamWOptions>();
  return e;
}

OptimizerEntry sgd_entry() {
  OptimizerEntry e =
      entry("sgd", detail::sgd_state(), "SGD with momentum (torch::optim::SGD; weight_decay is L2)");
  e.fields = {
      FieldSpec::real("momentum", 0.9, "momentum", 0.0, 1.0).exclusive_max(),
      FieldSpec::boolean("nesterov", false, "Nesterov momentum (needs momentum > 0, dampening 0)"),
      FieldSpec::real("dampening", 0.0, "dampening of the momentum", 0.0, 1.0),
  };
  e.make_options = [](const OptimizerSettings& s) {
    const bool nesterov = s.get_bool("nesterov");
    TORCH_CHECK_VALUE(!nesterov || (s.get_double("momentum") > 0 && s.get_double("dampening") == 0),
                      "sgd_nesterov needs sgd_momentum > 0 and sgd_dampening 0, got momentum ",
                      s.get_double("momentum"), ", dampening ", s.get_double("dampening"));
    return std::make_unique<torch::optim::SGDOptions>(
        torch::optim::SGDOptions(s.get_double("lr"))
            .momentum(s.get_double("momentum"))
            .nesterov(nesterov)
            .dampening(s.get_double("dampening"))
            .weight_decay(s.get_double("weight_decay")));
  };
  e.factory = build_factory<torch::optim::SGD, torch::optim::SGDOptions>();
  return e;
}

OptimizerEntry lion_entry() {
  OptimizerEntry e = entry("lion", detail::lion_state(),
                           "Lion (muon::Lion): sign of interpolated momentum, decoupled weight decay");
  e.fields = {
      FieldSpec::real("beta1", 0.9, "interpolation weight of the momentum in the update", 0.0, 1.0)
          .exclusive_max(),
      FieldSpec::real("beta2", 0.99, "momentum decay", 0.0, 1.0).exclusive_max(),
  };
  e.make_options = [](const OptimizerSettings& s) {
    auto o = std::make_unique<LionOptions>(s.get_double("lr"));
    o->beta1(s.get_double("beta1")).beta2(s.get_double("beta2")).weight_decay(s.get_double("weight_decay"));
    o->validate();
    return o;
  };
  e.factory = build_factory<Lion, LionOptions>();
  return e;
}

// Defaults are muon::LaPropOptions' own (Emerging-Optimizers'), lr aside (the common field).
OptimizerEntry laprop_entry() {
  OptimizerEntry e = entry("laprop", detail::laprop_state(),
                           "LaProp (muon::LaProp): momentum of gradients normalized by the second "
                           "moment, decoupled weight decay");
  const LaPropOptions d;
  e.fields = {
      FieldSpec::real("beta1", d.beta1(), "decay of the momentum of normalized gradients", 0.0, 1.0)
          .exclusive_max(),
      FieldSpec::real("beta2", d.beta2(), "second-moment decay", 0.0, 1.0).exclusive_max(),
      FieldSpec::real("eps", d.eps(), "added to the square root of the second moment", 0.0).exclusive_min(),
      FieldSpec::boolean("correct_bias", d.correct_bias(), "Adam-style bias correction of both moments"),
  };
  e.make_options = [](const OptimizerSettings& s) {
    auto o = std::make_unique<LaPropOptions>(s.get_double("lr"));
    o->beta1(s.get_double("beta1"))
        .beta2(s.get_double("beta2"))
        .eps(s.get_double("eps"))
        .weight_decay(s.get_double("weight_decay"))
        .correct_bias(s.get_bool("correct_bias"));
    o->validate();
    return o;
  };
  e.factory = build_factory<LaProp, LaPropOptions>();
  return e;
}

// The orthogonalized family (muon::OrthogonalizedVariant): Muon's fields
// (uses_fields_of muon) with EO's defaults where they differ from Muon's
// (nesterov off), their own settings whole-run, Muon's routing of 1-D,
// embedding and head parameters, and the layouts' strategies.
OptimizerEntry orthogonalized_entry(OrthogonalizedKind kind, std::string doc,
                                    std::vector<FieldSpec> fields) {
  const auto name = to_string(kind);
  OptimizerEntry e = entry(name, detail::orthogonalized_state(kind), std::move(doc));
  e.fields = std::move(fields);
  e.uses_fields_of = {"muon"};
  e.make_options = [kind](const OptimizerSettings& s) {
    // Scion's fixed weight decay and Nesterov: its default rule sets them,
    // OrthogonalizedVariant refuses other values (no silent replacement).
    return std::make_unique<MuonOptions>(muon_options(s));
  };
  const auto variant = [kind](const OptimizerSettings& s) {
    auto v = OrthogonalizedVariantOptions().kind(kind);
    if (kind == OrthogonalizedKind::kScion) v.spectral_radius(s.get_double("spectral_radius"));
    if (kind == OrthogonalizedKind::kMuonHyperball) {
      v.hyperball_radius(s.get_double("radius")).hyperball_eps(s.get_double("eps"));
    }
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
  e.default_overrides = scalar_defaults(name);
  if (kind == OrthogonalizedKind::kScion) e.default_overrides.push_back(detail::scion_fixed_rule());
  return e;
}

FieldSpec eo_nesterov() {
  return FieldSpec::boolean("nesterov", false,
                            "Nesterov look-ahead update (off, Emerging-Optimizers' default; "
                            "replaces muon_nesterov)");
}

// Defaults are muon::SignumOptions' own (Emerging-Optimizers'), lr aside (the common field).
OptimizerEntry signum_entry() {
  OptimizerEntry e = entry("signum", detail::signum_state(),
                           "Signum (muon::Signum): the sign of a momentum, optionally Nesterov");
  const SignumOptions d;
  e.fields = {
      FieldSpec::real("momentum", d.momentum(), "momentum decay β (0: signSGD)", 0.0, 1.0)
          .exclusive_max(),
      FieldSpec::boolean("nesterov", d.nesterov(), "Nesterov look-ahead update"),
      FieldSpec::boolean("correct_bias", d.correct_bias(),
                         "Adam-style bias correction of the momentum"),
      FieldSpec::text("weight_decay_method", d.weight_decay_method(),
                      "how weight decay enters the step", detail::weight_decay_method_names()),
  };
  e.make_options = [](const OptimizerSettings& s) {
    auto o = std::make_unique<SignumOptions>(s.get_double("lr"));
    o->momentum(s.get_double("momentum"))
        .nesterov(s.get_bool("nesterov"))
        .correct_bias(s.get_bool("correct_bias"))
        .weight_decay(s.get_double("weight_decay"))
        .weight_decay_method(s.get_string("weight_decay_method"));
    o->validate();
    return o;
  };
  e.factory = build_factory<Signum, SignumOptions>();
  return e;
}

// Defaults are muon::SimAdEMAMixOptions' own (Emerging-Optimizers'), lr aside (the common field).
OptimizerEntry sim_ademamix_entry() {
  OptimizerEntry e = entry("sim_ademamix", detail::sim_ademamix_state(),
                           "Simplified AdEMAMix (muon::SimAdEMAMix): a theory-style momentum "
                           "plus alpha times the gradient, over Adam's second moment");
  const SimAdEMAMixOptions d;
  e.fields = {
      FieldSpec::real("beta1", d.beta1(), "momentum decay (final value of the warmup)", 0.0, 1.0)
          .exclusive_max(),
      FieldSpec::real("beta2", d.beta2(), "second-moment decay", 0.0, 1.0).exclusive_max(),
      FieldSpec::real("eps", d.eps(), "added to the square root of the second moment", 0.0).exclusive_min(),
      FieldSpec::boolean("correct_bias", d.correct_bias(), "bias correction of both moments"),
      FieldSpec::integer("num_beta_fast_warmup_steps", d.num_beta_fast_warmup_steps(),
                         "steps of the half-life warmup of beta1 from min_beta_fast (0: none)",
                         0.0),
      FieldSpec::real("min_beta_fast", d.min_beta_fast(), "momentum decay at the start of the warmup",
                      0.0, 1.0)
          .exclusive_max(),
      FieldSpec::real("alpha", d.alpha(), "weight of the current gradient in the update"),
      FieldSpec::text("weight_decay_method", d.weight_decay_method(),
                      "how weight decay enters the step", detail::weight_decay_method_names()),
  };
  e.make_options = [](const OptimizerSettings& s) {
    auto o = std::make_unique<SimAdEMAMixOptions>(s.get_double("lr"));
    o->beta1(s.get_double("beta1"))
        .beta2(s.get_double("beta2"))
        .eps(s.get_double("eps"))
        .correct_bias(s.get_bool("correct_bias"))
        .num_beta_fast_warmup_steps(s.get_int("num_beta_fast_warmup_steps"))
        .min_beta_fast(s.get_double("min_beta_fast"))
        .alpha(s.get_double("alpha"))
        .weight_decay(s.get_double("weight_decay"))
        .weight_decay_method(s.get_string("weight_decay_method"));
    o->validate();
    return o;
  };
  e.factory = build_factory<SimAdEMAMix, SimAdEMAMixOptions>();
  return e;
}

// Defaults are muon::SoapOptions' own (Emerging-Optimizers'), lr and
// weight_decay aside (the common fields). Like Muon, SOAP preconditions
// matrices: 1-D, embedding and head parameters go to scalar_optimizer.
OptimizerEntry soap_entry() {
  OptimizerEntry e = entry("soap", detail::soap_state(),
                           "SOAP (muon::Soap): Adam in the eigenbasis of Shampoo's Kronecker factors; "
                           "1-D, embedding and head parameters go to scalar_optimizer");
  const SoapOptions d;
  e.fields = {
      FieldSpec::real("beta1", d.beta1(), "Adam's first-moment decay", 0.0, 1.0).exclusive_max(),
      FieldSpec::real("beta2", d.beta2(), "Adam's second-moment decay", 0.0, 1.0).exclusive_max(),
      FieldSpec::real("shampoo_beta", d.shampoo_beta(), "decay of the Kronecker factors L and R", 0.0, 1.0)
          .exclusive_max(),
      FieldSpec::real("eps", d.eps(), "added to the square root of Adam's second moment", 0.0).exclusive_min(),
      FieldSpec::text("weight_decay_method", to_string(d.weight_decay_method()), "how weight decay enters the step",
                      {"decoupled", "independent", "l2"}),
      FieldSpec::boolean("use_nesterov", d.use_nesterov(), "Nesterov momentum in the inner Adam"),
      FieldSpec::integer("precondition_frequency", d.precondition_frequency(), "steps between eigenbasis refreshes",
                         1.0),
      FieldSpec::integer("adam_warmup_steps", d.adam_warmup_steps(), "steps of plain Adam before the first eigenbasis",
                         0.0),
      FieldSpec::boolean("precondition_1d", d.precondition_1d(), "precondition 1-D parameters with one factor"),
      FieldSpec::boolean("correct_bias", d.correct_bias(), "Adam-style bias correction of both moments"),
      FieldSpec::text("correct_shampoo_beta_bias", "auto",
                      "bias correction of the factors' EMA (auto: as correct_bias)", {"auto", "true", "false"}),
      FieldSpec::boolean("use_eigh", d.use_eigh(), "refresh the eigenbases by eigh (else orthogonal iteration)"),
      FieldSpec::boolean("use_adaptive_criteria", d.use_adaptive_criteria(),
                         "refresh an eigenbasis only when it no longer diagonalizes its factor"),
      FieldSpec::real("adaptive_update_tolerance", d.adaptive_update_tolerance(),
                      "tolerance of use_adaptive_criteria", 0.0, 1.0)
          .exclusive_max(),
      FieldSpec::integer("power_iter_steps", d.power_iter_steps(), "orthogonal-iteration steps per refresh", 1.0),
      FieldSpec::real("max_update_rms", d.max_update_rms(), "clip the update's RMS to this (0: no clipping)", 0.0),
  };
  e.make_options = [](const OptimizerSettings& s) {
    auto o = std::make_unique<SoapOptions>(s.get_double("lr"));
    const auto& bias = s.get_string("correct_shampoo_beta_bias");
    o->beta1(s.get_double("beta1"))
        .beta2(s.get_double("beta2"))
        .shampoo_beta(s.get_double("shampoo_beta"))
        .eps(s.get_double("eps"))
        .weight_decay(s.get_double("weight_decay"))
        .weight_decay_method(s.get_string("weight_decay_method"))
        .use_nesterov(s.get_bool("use_nesterov"))
        .precondition_frequency(s.get_int("precondition_frequency"))
        .adam_warmup_steps(s.get_int("adam_warmup_steps"))
        .precondition_1d(s.get_bool("precondition_1d"))
        .correct_bias(s.get_bool("correct_bias"))
        .correct_shampoo_beta_bias(bias == "auto" ? -1 : bias == "true" ? 1 : 0)
        .use_eigh(s.get_bool("use_eigh"))
        .use_adaptive_criteria(s.get_bool("use_adaptive_criteria"))
        .adaptive_update_tolerance(s.get_double("adaptive_update_tolerance"))
        .power_iter_steps(s.get_int("power_iter_steps"))
        .max_update_rms(s.get_double("max_update_rms"));
    o->validate();
    return o;
  };
  e.factory = build_factory<Soap, SoapOptions>();
  e.default_overrides = scalar_defaults("soap");
  return e;
}

// Dion2 and NorDion2 (muon::Dion2): defaults are Dion's (muon::Dion2Options),
// lr and weight_decay aside (the common fields). They orthogonalize
// matrices: 1-D, embedding and head parameters go to scalar_optimizer.
OptimizerEntry dion2_entry(const bool nordion2) {
  const std::string name = nordion2 ? "nordion2" : "dion2";
  OptimizerEntry e = entry(name, detail::dion2_state(nordion2),
                           nordion2 ? "NorDion2 (muon::Dion2 with nordion2): Dion2 on rows with NorMuon's per-row "
                                      "normalization; 1-D, embedding and head parameters go to scalar_optimizer"
                                    : "Dion2 (muon::Dion2): Newton–Schulz on the top fraction of rows or columns of "
                                      "the momentum, with error feedback; 1-D, embedding and head parameters go to "
                                      "scalar_optimizer");
  const Dion2Options d = nordion2 ? NorDion2Options() : Dion2Options();
  e.fields = {
      FieldSpec::real("fraction", d.fraction(), "fraction of rows (or columns) orthogonalized per step", 0.0, 1.0)
          .exclusive_min(),
      FieldSpec::real(nordion2 ? "mu" : "ef_decay", d.ef_decay(),
                      "error-feedback decay of the selected slices of the momentum", 0.0, 1.0),
      FieldSpec::real("epsilon", d.epsilon(), "Newton–Schulz normalization epsilon", 0.0).exclusive_min(),
      FieldSpec::text("adjust_lr", to_string(d.adjust_lr()),
                      "lr scale: spectral_norm sqrt(fan_out/fan_in), rms_norm 0.2·sqrt(max), none",
                      {"spectral_norm", "rms_norm", "none"}),
      FieldSpec::boolean("flatten", d.flatten(), "3-D+ parameters as one matrix (dim 0 × rest), else a batch"),
      FieldSpec::text("coefficient_type", d.ns_coefficients(), "Newton–Schulz coefficient set",
                      accepted_coefficient_set_names()),
      FieldSpec::integer("num_ns_steps", 0, "Newton–Schulz steps (0: the set's default)", 0.0,
                         static_cast<double>(kMaxNsSteps - 1)),
      FieldSpec::text("ns_compute_dtype", "float32", "Newton–Schulz compute dtype", {"float32", "bfloat16", "float64"}),
  };
  if (nordion2) {
    e.fields.push_back(FieldSpec::real("muon_beta2", d.muon_beta2(), "decay of the per-row variance", 0.0, 1.0).exclusive_max());
  }
  e.make_options = [nordion2](const OptimizerSettings& s) {
    auto o = std::make_unique<Dion2Options>(s.get_double("lr"));
    o->nordion2(nordion2)
        .fraction(s.get_double("fraction"))
        .ef_decay(s.get_double(nordion2 ? "mu" : "ef_decay"))
        .weight_decay(s.get_double("weight_decay"))
        .epsilon(s.get_double("epsilon"))
        .adjust_lr(s.get_string("adjust_lr"))
        .flatten(s.get_bool("flatten"))
        .ns_coefficients(s.get_string("coefficient_type"))
        .ns_steps(s.get_int("num_ns_steps"))
        .ns_compute_dtype(detail::parse_dtype(s.get_string("ns_compute_dtype"), "", "ns_compute_dtype"));
    if (nordion2) o->muon_beta2(s.get_double("muon_beta2"));
    o->validate();
    return o;
  };
  e.factory = build_factory<Dion2, Dion2Options>();
  e.default_overrides = scalar_defaults(name);
  return e;
}

}  // namespace

OptimizerRegistry& OptimizerRegistry::global() {
  static OptimizerRegistry* registry = [] {
    auto* r = new OptimizerRegistry();  // never destroyed: usable from static destructors
    register_builtins(*r);
    detail::run_global_extensions(*r);
    return r;
  }();
  return *registry;
}

void OptimizerRegistry::register_builtins(OptimizerRegistry& registry) {
  registry.add(muon_entry());
  registry.add(adaptive_muon_entry());
  registry.add(adam_entry());  // before adamw, which reads its fields
  registry.add(adamw_entry());
  registry.add(sgd_entry());
  registry.add(lion_entry());
  registry.add(laprop_entry());
  registry.add(signum_entry());
  registry.add(sim_ademamix_entry());
  registry.add(soap_entry());
  registry.add(dion2_entry(/*nordion2=*/false));
  registry.add(dion2_entry(/*nordion2=*/true));
  registry.add(orthogonalized_entry(
      OrthogonalizedKind::kPolarGrad,
      "PolarGrad (muon::OrthogonalizedVariant): Newton–Schulz scaled by <O, M>, the nuclear-norm "
      "estimate; reads the muon_* fields too",
      {eo_nesterov()}));
  registry.add(orthogonalized_entry(
      OrthogonalizedKind::kScion,
      "Scion (muon::OrthogonalizedVariant): Newton–Schulz scaled by sqrt(rows/cols)·spectral_radius, "
      "weight decay fixed at 1 (decoupled), no Nesterov; reads the muon_* fields too",
      {FieldSpec::real("spectral_radius", 1.0, "radius of the spectral-norm ball (scales the update)",
                       0.0)
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
       FieldSpec::real("radius", 0.0,
                       "hyperball radius R (EO's hyperball_radius); 0: each parameter's own norm",
                       0.0)
           .whole_run(),
       FieldSpec::real("eps", 1e-8, "floor of the norms divided by (EO's hyperball_eps)", 0.0)
           .exclusive_min()
           .whole_run()}));
}

namespace detail {

AdaptiveMuonOptions adaptive_muon_options(const OptimizerSettings& s) {
  return AdaptiveMuonOptions().mode(s.get_string("mode")).beta2(s.get_double("beta2")).eps(s.get_double("eps"));
}

}  // namespace detail
}  // namespace muon
