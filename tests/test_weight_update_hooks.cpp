// The weight-update hooks (muon/optim/weight_update_hook.h): Muon and AdamW
// wearing each hook against an fp64 reference written from
// Emerging-Optimizers' emerging_optimizers/weight_update_hooks/
// {hyperball,radial_brake,relative_update}.py and the loop that calls them
// (orthogonalized_optimizers/orthogonalized_optimizer.py) at fd77292; every
// entry of the registry that takes them against its own step taken apart;
// the refusals; and every layout equal to one process.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "checkpoint_model.h"
#include "expect_util.h"
#include "muon/optim/composite.h"
#include "muon/optim/muon.h"
#include "muon/optim/weight_update_hook.h"
#include "muon/registry.h"
#include "muon_reference.h"

namespace {

using muon::OptimizerConfig;
using muon::OptimizerRegistry;
using muon::test::expect_value_error;
using Named = torch::OrderedDict<std::string, at::Tensor>;

const std::vector<std::string> kHooks{"hyperball", "radial_brake", "relative_update"};

// A hook's parameters in the reference: Emerging-Optimizers' defaults but
// the radius (none there) and inward_scale (1 there, which leaves a step
// that shrinks the weight unchanged: these tests want every step braked).
struct RefHook {
  std::string kind;
  double radius = 2.0;
  double outward = 0.5;
  double inward = 0.25;
  double eps = 1e-15;
};

double norm_of(const at::Tensor& t) { return t.norm().item<double>(); }

// The weight after `p_wd` (the decayed weight) steps by `u` at `lr` under
// hook `h`: pre_weight_update_inplace, p.add_(u, alpha=-lr),
// post_weight_update_inplace, written from the three hooks' code (fp64).
at::Tensor ref_hooked(const at::Tensor& p_wd, at::Tensor u, double lr, const RefHook& h) {
  if (h.kind == "hyperball") {
    const double n = norm_of(u);
    u = n < h.eps ? u * 0 : u * (h.radius / std::max(n, h.eps));
    const auto p = p_wd - lr * u;
    const double pn = norm_of(p);
    return pn < h.eps ? p * 0 : p * (h.radius / std::max(pn, h.eps));
  }
  if (h.kind == "relative_update") {
    const double wn = norm_of(p_wd);
    const double un = norm_of(u);
    const double s = (wn < h.eps || un < h.eps) ? 0.0 : wn / std::max(un, h.eps);
    return p_wd - lr * s * u;
  }
  double pre = norm_of(p_wd);
  pre = pre < h.eps ? 0.0 : pre;
  const auto p = p_wd - lr * u;
  double post = norm_of(p);
  post = post < h.eps ? 0.0 : post;
  const double delta = post - pre;
  const double scale = delta >= h.eps ? h.outward : (delta <= -h.eps ? h.inward : 0.0);
  const double projection = post < h.eps ? 0.0 : (pre + scale * delta) / std::max(post, h.eps);
  return p * projection;
}

OptimizerConfig hooked_config(const std::string& optimizer, const std::string& hook) {
  OptimizerConfig c;
  c.set("optimizer", optimizer).set("lr", 0.02).set("weight_decay", 0.1).set("weight_update_hook", hook);
  c.set("weight_update_hook_radius", 2.0).set("weight_update_hook_inward_scale", 0.25);
  return c;
}

// fp64 leaves of `shapes`, drawn from seeds 70, 71, ...
Named fp64_params(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  Named named;
  for (size_t k = 0; k < shapes.size(); ++k) {
    named.insert(shapes[k].first, muon::test::seeded_randn(shapes[k].second, 70 + k).to(at::kDouble).requires_grad_(true));
  }
  return named;
}

void set_grads(Named& named, int step) {
  int k = 0;
  for (auto& item : named) {
    item.value().mutable_grad() = muon::test::seeded_randn(item.value().sizes().vec(), 300 + 11 * step + k++).to(at::kDouble);
  }
}

// fp64 AdamW's update U (torch.optim.AdamW, β2 0.95: (m/c1)/(√v/√c2 + eps)) at step t.
struct RefAdamW {
  at::Tensor m, v;
  at::Tensor update(const at::Tensor& g, int t) {
    if (!m.defined()) m = at::zeros_like(g), v = at::zeros_like(g);
    m = 0.9 * m + 0.1 * g;
    v = 0.95 * v + 0.05 * g * g;  // adam_beta2's default
    const double c1 = 1 - std::pow(0.9, t);
    const double c2 = 1 - std::pow(0.95, t);
    return (m / c1) / (v.sqrt() / std::sqrt(c2) + 1e-8);
  }
};

// The whole-matrix parameters go to Muon (2-D, tall, conv), the bias to
// AdamW (Muon's default routing): 5 steps of each hook against the reference.
TEST(WeightUpdateHooks, MuonAndAdamWWithEachHookMatchTheFp64Reference) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes{
      {"w", {16, 24}}, {"tall", {40, 12}}, {"conv", {8, 4, 3, 3}}, {"b", {16}}};
  for (const auto& hook : kHooks) {
    auto named = fp64_params(shapes);
    auto config = hooked_config("muon", hook);
    config.set("muon_ns_compute_dtype", "float64").set("muon_scale_mode", "shape_scaling");
    config.set("muon_momentum", 0.95).set("muon_nesterov", true).set("muon_num_ns_steps", 5);
    auto opt = muon::make_optimizer(named, config);
    muon::test::RefOptions o;  // Muon's defaults: EMA momentum 0.95, Nesterov, quintic, shape scaling
    o.lr = 0.02;
    std::map<std::string, at::Tensor> ref;
    std::map<std::string, muon::test::RefParam> ref_muon;
    RefAdamW ref_adamw;
    for (const auto& item : named) ref[item.key()] = item.value().detach().clone();
    const RefHook h{hook};
    for (int t = 1; t <= 5; ++t) {
      set_grads(named, t);
      for (const auto& item : named) {
        const auto& name = item.key();
        const auto g = item.value().grad();
        const auto p_wd = ref[name] * (1 - o.lr * 0.1);
        at::Tensor u;
        if (name == "b") {
          u = ref_adamw.update(g, t);
        } else {
          // Muon's update alone: a step at lr 1 from zero, no decay (the
          // momentum does not depend on the weight under decoupled decay).
          auto& s = ref_muon[name];
          s.p = at::zeros_like(ref[name]);
          auto unit = o;
          unit.lr = 1.0;
          muon::test::ref_step(s, g, unit);
          u = -s.p;
        }
        ref[name] = ref_hooked(p_wd, u, o.lr, h);
      }
      opt->step();
    }
    // fp64 throughout (Newton–Schulz as Muon's tests bound it, kFp64Tol);
    // the hooks add a few roundings of 1e-16 scaled by R/‖U‖ or ‖p‖/‖U‖,
    // O(1) here, so Muon's bound holds for the hooked step too.
    for (const auto& item : named) {
      const double err = muon::test::max_diff(item.value(), ref[item.key()]) / ref[item.key()].abs().max().item<double>();
      EXPECT_LE(err, muon::test::kFp64Tol) << hook << " " << item.key();
    }
    if (hook == "hyperball") {
      for (const auto& item : named) EXPECT_NEAR(norm_of(item.value()), 2.0, 1e-12) << item.key();
    }
  }
}

// The weight decay of an entry's step, stated here apart from the
// registry's declarations: c of p ← c·p − lr·U at lr 0.02.
double decay_of(const std::string& optimizer, double wd) {
  if (optimizer == "adam" || optimizer == "sgd") return 1.0;  // L2: in the gradient
  return 1 - 0.02 * wd;
}

// Every entry that takes the hooks: one step from the same weights, with
// and without each hook; the hooked weight is the hook applied to the plain
// step taken apart (U = (c·p − p_plain)/lr), in fp64. A wrong decay
// declared for an entry, a hook applied twice, to the wrong part or not at
// all moves the weight by ~lr·‖U‖, far above the 1e-12 (fp64 roundings
// amplified by the hook's scale, at most ~10 here).
TEST(WeightUpdateHooks, EveryEntryThatTakesThemIsItsOwnStepTakenApart) {
  const std::vector<std::string> refused{"iso", "oblique_sgd", "oblique_adam", "spel", "muon_hyperball"};
  int checked = 0;
  for (const auto& optimizer : OptimizerRegistry::global().keys()) {
    if (std::find(refused.begin(), refused.end(), optimizer) != refused.end()) continue;
    const double wd = optimizer == "scion" ? 1.0 : 0.1;  // Scion fixes its decay at 1
    for (const auto& hook : kHooks) {
      auto config = hooked_config(optimizer, hook);
      config.set("weight_decay", wd);
      auto plain_config = config;
      plain_config.set("weight_update_hook", "none");
      auto hooked = fp64_params({{"w", {12, 8}}, {"b", {12}}});
      auto plain = fp64_params({{"w", {12, 8}}, {"b", {12}}});
      auto opt = muon::make_optimizer(hooked, config);
      auto plain_opt = muon::make_optimizer(plain, plain_config);
      set_grads(hooked, 1);
      set_grads(plain, 1);
      std::map<std::string, at::Tensor> before;
      for (const auto& item : hooked) before[item.key()] = item.value().detach().clone();
      opt->step();
      plain_opt->step();
      for (size_t g = 0; g < opt->param_groups().size(); ++g) {
        const auto& part = opt->part_name(opt->part_of_group(g));
        const auto& names = opt->group_names(g);
        for (const auto& name : names) {
          const double c = decay_of(part, wd);
          const auto p_wd = before[name] * c;
          const auto u = (p_wd - plain[name].detach()) / 0.02;
          const auto want = ref_hooked(p_wd, u, 0.02, RefHook{hook});
          const double err = muon::test::max_diff(hooked[name], want) / want.abs().max().item<double>();
          EXPECT_LE(err, 1e-12) << optimizer << " (" << part << ") " << hook << " " << name;
          EXPECT_GT(muon::test::max_diff(hooked[name], plain[name]), 1e-6) << optimizer << " " << hook << " " << name;
        }
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 3 * 20);
}

TEST(WeightUpdateHooks, OptimizersWhoseStepIsNotAnUpdateAddedRefuseThemByName) {
  const std::map<std::string, std::string> why{{"iso", "rebuilds the weight"},
                                               {"oblique_sgd", "renormalizes"},
                                               {"oblique_adam", "renormalizes"},
                                               {"spel", "re-orthogonalizes"},
                                               {"muon_hyperball", "hyperball hook already"}};
  for (const auto& [optimizer, reason] : why) {
    auto named = fp64_params({{"w", {12, 8}}});
    auto config = hooked_config(optimizer, "relative_update");
    config.set("weight_decay", 0.0);
    expect_value_error([&] { muon::make_optimizer(named, config); },
                       {"weight_update_hook 'relative_update'", "'" + optimizer + "'", reason});
  }
  // A decay that is not a factor of the weight (spectral clipping) with
  // weight decay on; with none, how it would decay does not matter.
  auto named = fp64_params({{"w", {12, 8}}});
  auto config = hooked_config("muon", "hyperball");
  config.set("muon_weight_decay_mode", "spectral_clipped");
  expect_value_error([&] { muon::make_optimizer(named, config); },
                     {"weight_decay_mode", "'spectral_clipped'", "decoupled, independent, l2 or palm"});
  config.set("weight_decay", 0.0);
  EXPECT_NO_THROW(muon::make_optimizer(named, config));
}

// The weight decay edited after construction (a schedule, a Python param
// group) is the one the hooks take the step apart with: the hooked weight is
// the hook applied to the plain twin's step (edited alike) taken apart with
// c = 1 − lr·0.3, to fp64 rounding (as above). Taken apart with the old
// coefficient, the decayed weight would be off by lr·0.2·|p| = 4e-3·|p|.
TEST(WeightUpdateHooks, AWeightDecayEditedAfterConstructionIsTheOneTheHookReads) {
  for (const std::string optimizer : {"muon", "adamw"}) {
    auto config = hooked_config(optimizer, "relative_update");
    config.set("weight_decay", 0.1);
    auto plain_config = config;
    plain_config.set("weight_update_hook", "none");
    auto hooked = fp64_params({{"w", {12, 8}}});
    auto plain = fp64_params({{"w", {12, 8}}});
    auto opt = muon::make_optimizer(hooked, config);
    auto plain_opt = muon::make_optimizer(plain, plain_config);
    for (int t = 1; t <= 2; ++t) {
      if (t == 2) {
        for (auto* o : {opt.get(), plain_opt.get()}) {
          auto& options = o->param_groups()[0].options();
          if (optimizer == "muon") {
            static_cast<muon::MuonOptions&>(options).weight_decay(0.3);
          } else {
            static_cast<torch::optim::AdamWOptions&>(options).weight_decay(0.3);
          }
        }
      }
      set_grads(hooked, t);
      set_grads(plain, t);
      const auto before = hooked["w"].detach().clone();
      plain["w"].detach().copy_(before);  // the plain step from the hooked weight (its state follows the same grads)
      opt->step();
      plain_opt->step();
      const double c = 1 - 0.02 * (t == 1 ? 0.1 : 0.3);
      const auto p_wd = before * c;
      const auto want = ref_hooked(p_wd, (p_wd - plain["w"].detach()) / 0.02, 0.02, RefHook{"relative_update"});
      EXPECT_LE(muon::test::max_diff(hooked["w"], want) / want.abs().max().item<double>(), 1e-12)
          << optimizer << " step " << t;
    }
  }
  // A decay that is not a factor, built at weight decay 0, then given one:
  // the step raises before anything moves.
  auto named = fp64_params({{"w", {12, 8}}});
  auto config = hooked_config("muon", "hyperball");
  config.set("muon_weight_decay_mode", "spectral_clipped").set("weight_decay", 0.0);
  auto opt = muon::make_optimizer(named, config);
  static_cast<muon::MuonOptions&>(opt->param_groups()[0].options()).weight_decay(0.1);
  set_grads(named, 1);
  const auto kept = named["w"].detach().clone();
  expect_value_error([&] { opt->step(); }, {"[muon::WeightUpdateHook]", "weight_decay 0.1", "'spectral_clipped'"});
  EXPECT_TRUE(at::equal(named["w"].detach(), kept));
}

TEST(WeightUpdateHooks, BadValuesNameTheFieldAndTheValue) {
  auto named = fp64_params({{"w", {12, 8}}});
  expect_value_error([&] { hooked_config("muon", "sphere"); }, {"weight_update_hook", "sphere", "relative_update"});
  expect_value_error([&] { hooked_config("muon", "hyperball").set("weight_update_hook_radius", 0.0); },
                     {"weight_update_hook_radius", "0"});
  expect_value_error([&] { hooked_config("muon", "radial_brake").set("weight_update_hook_outward_scale", 1.5); },
                     {"weight_update_hook_outward_scale", "1.5"});
  expect_value_error([&] { muon::WeightUpdateHookOptions().radius(1e-20).eps(1e-15).validate(); },
                     {"[muon::WeightUpdateHook]", "radius", "1e-20"});
  // A rule per parameter: a hook on the matrix only, the bias untouched.
  auto both = fp64_params({{"w", {12, 8}}, {"b", {12}}});
  OptimizerConfig c;
  c.set("optimizer", "adamw").set("lr", 0.02);
  c.add_override(muon::OverrideRule().match_name("w").set("weight_update_hook", "hyperball").named("w on a sphere"));
  auto opt = muon::make_optimizer(both, c);
  set_grads(both, 1);
  const auto b0 = both["b"].detach().clone();
  opt->step();
  EXPECT_NEAR(norm_of(both["w"]), 1.0, 1e-12);
  EXPECT_GT(std::abs(norm_of(both["b"]) - norm_of(b0)), 0.0);
  EXPECT_GT(std::abs(norm_of(both["b"]) - 1.0), 1e-3);
}

// A plugin's entry says nothing of its step: a hook on it raises with the
// registry's default reason.
TEST(WeightUpdateHooks, AnEntryThatDoesNotDescribeItsStepIsRefused) {
  OptimizerRegistry registry;
  OptimizerRegistry::register_builtins(registry);
  auto entry = *registry.at("adamw");
  entry.name = "my_adamw";
  entry.uses_fields_of = {"adam"};
  entry.hook_weight_decay.clear();
  entry.hook_refusal = muon::OptimizerEntry().hook_refusal;
  registry.add(entry);
  auto named = fp64_params({{"w", {12, 8}}});
  OptimizerConfig c(registry);
  c.set("optimizer", "my_adamw").set("weight_update_hook", "relative_update");
  expect_value_error([&] { muon::make_optimizer(named, c, registry); },
                     {"'my_adamw'", "does not say how it decays the weight"});
}

// Each hook through every layout equals one process: the norms are of the
// whole parameter, its parts' sums added over the ranks that hold them.
// Layer-wise steps whole parameters: bit for bit. Elsewhere the sums come
// in another order (double), which may move a scale by 1e-16 and so a
// weight by one fp32 rounding a step (2^-24 of it), 3 steps; TP's
// distributed Newton–Schulz and the 2-D layout's add their own rounding
// (their tests' 1e-6): 2e-6 of the largest |value| covers both.
TEST(WeightUpdateHooks, EveryLayoutEqualsOneProcess) {
  namespace ckpt = muon::test::checkpoint;
  for (const auto& optimizer : {"muon", "adamw"}) {
    for (const auto& hook : kHooks) {
      const std::string spec = std::string(optimizer) + "@" + hook;
      const auto single = ckpt::one_process_after(spec, {3}).at(3);
      ckpt::expect_layouts_equal(spec, 3, single,
                                 {{"layerwise", 2}, {"sharded", 2}, {"padded", 3}, {"tp", 2}, {"2d", 4}}, spec,
                                 nullptr, [](const std::string& kind) { return kind == "layerwise" ? 0.0 : 2e-6; });
    }
  }
}

}  // namespace
