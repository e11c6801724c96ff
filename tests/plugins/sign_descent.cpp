// A user optimizer in one file, loaded as a plugin (muon/plugin.h): sign
// descent with momentum (m ← β·m + (1 − β)·g; p ← p·(1 − lr·wd) − lr·sign(m)).
// Its registry entry declares options, a factory and a state schema, and
// nothing else: checkpoints, layouts, Python and the main job take it from
// there (tests/test_plugin.cpp, tests/python/test_plugin.py, test_train_gpt).
#include <ATen/core/grad_mode.h>
#include <muon/compat.h>
#include <muon/registry.h>

namespace {

struct SignDescentOptions : torch::optim::OptimizerCloneableOptions<SignDescentOptions> {
  double lr = 0.01, beta = 0.9, weight_decay = 0.0;
  double get_lr() const override { return lr; }
  void set_lr(const double value) override { lr = value; }
};

struct SignDescentState : torch::optim::OptimizerCloneableParamState<SignDescentState> {
  int64_t step = 0;
  at::Tensor momentum;
};

class SignDescent : public torch::optim::Optimizer {
 public:
  using Optimizer::Optimizer;
  at::Tensor step(LossClosure /*closure*/ = nullptr) override {
    at::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
      const auto& o = static_cast<const SignDescentOptions&>(group.options());
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = state()[muon::compat::state_key(p)];
        if (!slot) slot = muon::OptimizerRegistry::global().at("sign_descent")->state.initial(*this, o, p);
        auto& s = static_cast<SignDescentState&>(*slot);
        s.step += 1;
        s.momentum.mul_(o.beta).add_(p.grad(), 1 - o.beta);
        p.mul_(1 - o.lr * o.weight_decay).add_(s.momentum.sign(), -o.lr);
      }
    }
    return {};
  }
};

muon::OptimizerEntry sign_descent_entry() {
  muon::OptimizerEntry e;
  e.name = "sign_descent";
  e.doc = "SignDescent: the sign of momentum (a plugin, tests/plugins/sign_descent.cpp)";
  e.fields = {muon::FieldSpec::real("beta", 0.9, "momentum decay", 0.0, 1.0).exclusive_max()};
  e.make_options = [](const muon::OptimizerSettings& s) {
    auto o = std::make_unique<SignDescentOptions>();
    o->lr = s.get_double("lr");
    o->beta = s.get_double("beta");
    o->weight_decay = s.get_double("weight_decay");
    return o;
  };
  e.factory = [](std::vector<torch::optim::OptimizerParamGroup> groups, const std::vector<muon::OptimizerSettings>&) {
    auto defaults = groups.at(0).options().clone();
    return std::make_unique<SignDescent>(std::move(groups), std::move(defaults));
  };
  e.state = muon::StateSchema::of<SignDescentState>();
  e.state.is_kind = muon::StateSchema::is_a<SignDescent>();
  using S = SignDescentState;
  e.state.add(muon::StateField::counter_of<S>("step", [](S& s) -> int64_t& { return s.step; }));
  e.state.add(muon::StateField::tensor_of<S>("momentum", [](S& s) -> at::Tensor& { return s.momentum; }));
  return e;
}

const bool registered = [] {
  muon::OptimizerRegistry::global().add(sign_descent_entry());
  return true;
}();

}  // namespace
