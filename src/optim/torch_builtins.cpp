// The registry entries of LibTorch's own optimizers: adam, adamw (reads the
// adam_* fields) and sgd.
#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <tuple>
#include <utility>
#include <vector>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "option_fields.h"

namespace muon::detail {
namespace {

// Adam's and AdamW's fields (Options: torch::optim::AdamOptions or
// AdamWOptions): beta1 and beta2 (betas), eps, and the common weight_decay.
template <typename Options>
std::vector<OptionField<Options>> adam_fields() {
  using F = OptionFields<Options>;
  return {
      F::custom(FieldSpec::real("beta1", 0.9, "first-moment decay (adam and adamw)", 0.0, 1.0)
                    .exclusive_max(),
                [](Options& o, const OptimizerSettings& s) {
                  o.betas(std::make_tuple(s.get_double("beta1"), std::get<1>(o.betas())));
                }),
      F::custom(FieldSpec::real("beta2", 0.95, "second-moment decay (adam and adamw)", 0.0, 1.0)
                    .exclusive_max(),
                [](Options& o, const OptimizerSettings& s) {
                  o.betas(std::make_tuple(std::get<0>(o.betas()), s.get_double("beta2")));
                }),
      F::real("eps", &Options::eps, 1e-8, "denominator epsilon (adam and adamw)", 0.0)
          .exclusive_min(),
      F::common("weight_decay", &Options::weight_decay),
  };
}

OptimizerEntry sgd_entry() {
  using O = torch::optim::SGDOptions;
  using F = OptionFields<O>;
  return options_entry<torch::optim::SGD, O>(
      "sgd", sgd_state(), "SGD with momentum (torch::optim::SGD; weight_decay is L2)",
      {
          F::real("momentum", &O::momentum, 0.9, "momentum", 0.0, 1.0).exclusive_max(),
          F::boolean("nesterov", &O::nesterov, false,
                     "Nesterov momentum (needs momentum > 0, dampening 0)"),
          F::real("dampening", &O::dampening, 0.0, "dampening of the momentum", 0.0, 1.0),
          F::common("weight_decay", &O::weight_decay),
      },
      [](O& o, const OptimizerSettings&) {
        TORCH_CHECK_VALUE(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0),
                          "sgd_nesterov needs sgd_momentum > 0 and sgd_dampening 0, got momentum ",
                          o.momentum(), ", dampening ", o.dampening());
      });
}

}  // namespace

void register_torch_builtins(OptimizerRegistry& registry) {
  using torch::optim::AdamOptions;
  using torch::optim::AdamWOptions;
  registry.add(detail::hookable<AdamOptions>(options_entry<torch::optim::Adam, AdamOptions>(
      "adam", adam_state(), "Adam (torch::optim::Adam; weight_decay is L2)",
      adam_fields<AdamOptions>()), "l2"));
  // Before it: adam, whose fields it reads.
  auto adamw_fields = adam_fields<AdamWOptions>();
  for (auto& f : adamw_fields) f.read_only();
  auto adamw = options_entry<torch::optim::AdamW, AdamWOptions>(
      "adamw", adamw_state(),
      "AdamW (torch::optim::AdamW; decoupled weight decay); reads the adam_* fields",
      std::move(adamw_fields));
  adamw.uses_fields_of = {"adam"};
  registry.add(detail::hookable<AdamWOptions>(std::move(adamw), "decoupled"));
  registry.add(detail::hookable<torch::optim::SGDOptions>(sgd_entry(), "l2"));
}

}  // namespace muon::detail
