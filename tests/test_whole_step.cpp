// A step happens whole or changes nothing: for every optimizer of the
// registry, a failure injected at each fault point of a step (its matrix
// function: Newton–Schulz, SVD, eigh, QR; an element-wise update; the end of
// a part) leaves the parameters, every state tensor and every step count
// bit-identical to before the step, and the next step equals that of an
// optimizer that never failed. Also the two failures the library met in
// use: SOAP's eigh on gradients of 1e20, MOP's SVD on a NaN gradient under
// nonfinite=propagate.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "expect_util.h"
#include "muon/compat.h"
#include "muon/optim/dion.h"
#include "muon/optim/dion2.h"
#include "muon/optim/iso.h"
#include "muon/optim/laprop.h"
#include "muon/optim/muon.h"
#include "muon/optim/soap.h"
#include "muon/optim/step_guard.h"
#include "muon/registry.h"
#include "tensor_util.h"
#include "util/fault_injection.h"

namespace muon::test {
namespace {

using torch::OrderedDict;

// Matrices for the matrix optimizer, a bias for the scalar one.
OrderedDict<std::string, at::Tensor> make_params() {
  at::manual_seed(3);
  OrderedDict<std::string, at::Tensor> named;
  named.insert("fc.weight", leaf(at::randn({8, 6})));
  named.insert("fc.bias", leaf(at::randn({8})));
  named.insert("fc_out.weight", leaf(at::randn({6, 8})));
  return named;
}

void set_grads(const OrderedDict<std::string, at::Tensor>& named, int64_t seed, double scale = 1.0) {
  at::manual_seed(static_cast<uint64_t>(seed));
  for (const auto& item : named) {
    item.value().mutable_grad() = at::randn(item.value().sizes()).mul_(scale);
  }
}

// Everything a step may change, in a fixed order: the parameters, then every
// field (tensor or counter) of every state, by the registry's schemas.
struct Values {
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> counters;
  std::vector<std::string> absent;  // parameters without state
};

Values values_of(torch::optim::Optimizer& opt) {
  Values out;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) out.tensors.push_back(p.detach().clone());
  }
  for (const auto& holder : muon::state_holders(opt, "[test] ")) {
    auto& states = holder.optimizer->state();
    for (const auto& group : holder.optimizer->param_groups()) {
      for (const auto& p : group.params()) {
        const auto it = states.find(compat::state_key(p));
        if (it == states.end()) {
          out.absent.push_back(holder.entry->name + " " + c10::str(p.sizes()));
          continue;
        }
        for (const auto& v : holder.entry->state.values(*it->second)) {
          if (v.counter != nullptr) out.counters.push_back(*v.counter);
          if (v.tensor != nullptr) {
            out.tensors.push_back(v.tensor->defined() ? v.tensor->detach().clone() : at::Tensor());
          }
        }
      }
    }
  }
  return out;
}

void expect_same(const Values& a, const Values& b, const std::string& what) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
  EXPECT_EQ(a.counters, b.counters) << what;
  EXPECT_EQ(a.absent, b.absent) << what;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    ASSERT_EQ(x.defined(), y.defined()) << what << ": tensor " << i;
    if (!x.defined()) continue;
    ASSERT_EQ(x.scalar_type(), y.scalar_type()) << what << ": tensor " << i;
    ASSERT_EQ(x.sizes(), y.sizes()) << what << ": tensor " << i;
    // Bit for bit (NaN included): compare the bytes (of a 0-dim tensor, e.g.
    // PSGD-Pro's Lipschitz constants, too: flattened first).
    EXPECT_TRUE(at::equal(x.reshape({-1}).contiguous().view(at::kByte), y.reshape({-1}).contiguous().view(at::kByte)))
        << what << ": tensor " << i;
  }
}

struct Disarm {
  ~Disarm() { detail::inject_fault_at(-1); }
};

// Steps `a` with a failure at every fault point of its second step in turn
// (checking each failed step changed nothing), then without one; `b` steps
// the same gradients and never fails: both must end bit-identical.
template <typename Opt>
void fail_at_every_point(Opt& a, Opt& b, const OrderedDict<std::string, at::Tensor>& pa,
                         const OrderedDict<std::string, at::Tensor>& pb, const std::string& name) {
  Disarm disarm;
  set_grads(pa, 11);
  set_grads(pb, 11);
  a.step();
  b.step();
  set_grads(pa, 12);
  set_grads(pb, 12);
  const auto before = values_of(a);
  int64_t failures = 0;
  for (int64_t k = 0;; ++k) {
    ASSERT_LT(k, 200) << name << ": the step never ran out of fault points";
    detail::inject_fault_at(k);
    bool raised = false;
    try {
      a.step();
    } catch (const c10::ValueError& e) {
      raised = true;
      const std::string message = e.what_without_backtrace();
      EXPECT_NE(message.find("injected fault at"), std::string::npos) << name << ": " << message;
      EXPECT_NE(message.find("nothing of this step was applied"), std::string::npos)
          << name << ": " << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << name << ": " << message;
    }
    const auto reached = detail::fault_points_reached();
    detail::inject_fault_at(-1);
    if (!raised) {
      EXPECT_LE(reached, k) << name;
      break;
    }
    ++failures;
    expect_same(before, values_of(a), name + ", fault at point " + std::to_string(k));
  }
  EXPECT_GE(failures, 1) << name << ": no fault point in its step";
  b.step();
  expect_same(values_of(b), values_of(a), name + ": the step after the failures");
  set_grads(pa, 13);
  set_grads(pb, 13);
  a.step();
  b.step();
  expect_same(values_of(b), values_of(a), name + ": the step after that");
}

TEST(WholeStep, EveryRegisteredOptimizerChangesNothingWhenItsStepFails) {
  const auto names = OptimizerRegistry::global().keys();
  ASSERT_GE(names.size(), 17u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    OptimizerConfig config;
    config.set("optimizer", name).set("lr", 0.01);
    const auto pa = make_params();
    const auto pb = make_params();
    auto a = make_optimizer(pa, config);
    auto b = make_optimizer(pb, config);
    fail_at_every_point(*a, *b, pa, pb, name);
  }
}

// fail_at_every_point on two `Opt`s built alike with `options` over the
// matrices (and, with `bias`, the bias) of make_params().
template <typename Opt, typename Options>
void fail_standalone(const Options& options, bool bias, const std::string& name) {
  const auto params = [bias] {
    auto named = make_params();
    if (!bias) named.erase("fc.bias");
    return named;
  };
  const auto pa = params();
  const auto pb = params();
  Opt a(pa.values(), options);
  Opt b(pb.values(), options);
  fail_at_every_point(a, b, pa, pb, name);
}

TEST(WholeStep, StandaloneOptimizersChangeNothingWhenTheirStepFails) {
  fail_standalone<Muon>(MuonOptions(0.02), false, "muon::Muon");
  fail_standalone<Soap>(SoapOptions(0.01), true, "muon::Soap");
  fail_standalone<Dion2>(NorDion2Options(0.01), false, "muon::Dion2");
  fail_standalone<LaProp>(LaPropOptions(0.01), true, "muon::LaProp");
}

// A whole-matrix optimizer's step that fails in its update names the
// parameter it failed on, and what failed (detail::step_each_parameter).
TEST(WholeStep, WholeMatrixStepsNameTheParameterTheyFailedOn) {
  Disarm disarm;
  auto named = make_params();
  named.erase("fc.bias");
  const auto failure_of = [&named](torch::optim::Optimizer& opt) {
    set_grads(named, 11);
    detail::inject_fault_at(0);
    auto message = error_of([&] { opt.step(); });
    detail::inject_fault_at(-1);
    return message;
  };
  Iso iso(named.values(), IsoOptions(0.01));
  Dion dion(named.values(), DionOptions(0.01));
  for (const auto& [opt, words] : std::vector<std::pair<torch::optim::Optimizer*, std::vector<std::string>>>{
           {&iso, {"[muon::Iso] ", "Iso's retraction"}}, {&dion, {"[muon::Dion] ", "Dion's orthogonalization"}}}) {
    const auto message = failure_of(*opt);
    for (const auto& word : words) EXPECT_NE(message.find(word), std::string::npos) << message;
    EXPECT_NE(message.find("parameter 0 of group 0 (shape [8, 6])"), std::string::npos) << message;
  }
}

// muon::set_whole_steps(false) trades the transaction for its memory: no
// copy is made, a failed step still raises ValueError, now saying that
// parts of it may be applied (the momentum was updated before
// Newton–Schulz failed); on again, a failed step changes nothing.
TEST(WholeStep, WholeStepsOffMakesNoCopyAndSaysSo) {
  struct On {
    ~On() { muon::set_whole_steps(true); }
  } on;
  Disarm disarm;
  ASSERT_TRUE(muon::whole_steps());
  auto named = make_params();
  named.erase("fc.bias");
  Muon opt(named.values(), MuonOptions(0.02));
  set_grads(named, 11);
  opt.step();
  set_grads(named, 12);
  const auto before = values_of(opt);
  const auto fail_once = [&]() -> std::string {
    detail::inject_fault_at(0);
    std::string message;
    try {
      opt.step();
    } catch (const c10::ValueError& e) {
      message = e.what_without_backtrace();
    }
    detail::inject_fault_at(-1);
    return message;
  };
  muon::set_whole_steps(false);
  EXPECT_FALSE(muon::whole_steps());
  const auto off = fail_once();
  EXPECT_NE(off.find("injected fault at"), std::string::npos) << off;
  EXPECT_NE(off.find("parts of this step may be applied (muon::set_whole_steps is off)"), std::string::npos)
      << off;
  const auto after = values_of(opt);
  ASSERT_EQ(before.tensors.size(), after.tensors.size());
  bool changed = false;
  for (size_t i = 0; i < before.tensors.size(); ++i) {
    changed = changed || !at::equal(before.tensors[i], after.tensors[i]);
  }
  EXPECT_TRUE(changed) << "no state changed before the fault: the test no longer shows what 'off' means";
  muon::set_whole_steps(true);
  const auto again = values_of(opt);
  const auto on_message = fail_once();
  EXPECT_NE(on_message.find("nothing of this step was applied"), std::string::npos) << on_message;
  expect_same(again, values_of(opt), "whole steps on again");
}

// The SOAP: gradients of 1e20 make Kronecker factors fp32 cannot
// hold, and eigh fails. The AdamW part had stepped the bias and L, R had
// changed; now the step raises ValueError naming the parameter and nothing
// changes.
TEST(WholeStep, SoapWhoseEighFailsOnHugeGradientsChangesNothing) {
  OptimizerConfig config;
  config.set("optimizer", "soap").set("lr", 0.01);
  const auto named = make_params();
  auto opt = make_optimizer(named, config);
  set_grads(named, 5);
  opt->step();
  set_grads(named, 6, 1e20);
  const auto before = values_of(*opt);
  expect_value_error([&] { opt->step(); }, {"[muon::Soap]", "shape [8, 6]", "nothing of this step was applied"});
  expect_same(before, values_of(*opt), "soap");
  set_grads(named, 7);
  opt->step();  // a later step with sane gradients works
  for (const auto& item : named) EXPECT_TRUE(at::isfinite(item.value()).all().item<bool>()) << item.key();
}

// The MOP: under nonfinite=propagate a NaN gradient reaches the SVD,
// which raises; AdamW and MOP's momentum had changed. Now nothing changes.
TEST(WholeStep, MopWhoseSvdFailsOnANanGradientChangesNothing) {
  OptimizerConfig config;
  config.set("optimizer", "mop").set("lr", 0.01).set("nonfinite", "propagate");
  const auto named = make_params();
  auto opt = make_optimizer(named, config);
  set_grads(named, 5);
  opt->step();
  set_grads(named, 6);
  named["fc.weight"].mutable_grad()[0][0] = std::nan("");
  const auto before = values_of(*opt);
  expect_value_error([&] { opt->step(); },
                     {"[muon::MOP]", "SVD", "shape [8, 6]", "nothing of this step was applied"});
  expect_same(before, values_of(*opt), "mop");
}

}  // namespace
}  // namespace muon::test
