// The tests every element-wise optimizer (muon::ElementwiseOptimizer: Lion,
// LaProp, Signum, SimAdEMAMix) passes, written once and run by each
// optimizer's test file with a case struct describing it:
//
//   struct Case : CaseOf<Optimizer, Other> {  // Other: another element-wise optimizer
//     static constexpr const char* kName;   // its registry entry, e.g. "laprop"
//     static Options resumed();             // non-default options of the resumed run
//     static Options replaced();            // other options the loader must replace
//     static void bad_edit(Options& o);     // makes `o` invalid ...
//     static std::vector<std::string> bad_edit_words();  // ... and the error names it so
//     static constexpr const char* kConfig; // JSON config building kName with its fields
//     static void check_config(const Options& o);  // the options that config gives
//   };
//
// The shared tests are function templates named as the tests they are
// (MUON_ELEMENTWISE_CASES at the end defines them for a case).
//
// Each file keeps its own independent fp64 reference of the published
// arithmetic and the tests of options only it has; the helpers below check
// its defaults (expect_fields), its invalid options (expect_invalid_options)
// and its steps against the reference (expect_steps_equal_reference).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <torch/optim/schedulers/step_lr.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "archive_util.h"
#include "checkpoint_model.h"
#include "distributed/checkpoints/checkpoint_state.h"
#include "expect_util.h"
#include "muon/compat.h"
#include "muon/optim/elementwise.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test::elementwise {

namespace ckpt = muon::test::checkpoint;

/// The values of `x` as doubles (a copy).
inline std::vector<double> doubles(const at::Tensor& x) {
  const auto d = x.detach().to(at::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

/// Largest |got − want| relative to the largest |want|.
inline double relative(const at::Tensor& got, const std::vector<double>& want) {
  const auto g = doubles(got);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(g[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

/// The fp64 run of one parameter by a two-moment optimizer's published
/// update (each file's Reference adds its step): the values from `init`, the
/// moments m and v from zero, the step count.
struct TwoMoments {
  std::vector<double> p, m, v;
  int64_t t = 0;

  explicit TwoMoments(const at::Tensor& init) : p(doubles(init)), m(p.size(), 0.0), v(p.size(), 0.0) {}

  /// The moments, in the order of the state's buffers (exp_avg, exp_avg_sq).
  std::vector<const std::vector<double>*> moments() const { return {&m, &v}; }
};

/// What a case's Optimizer, Options, State and Other are: `Optimizer` is a
/// muon::ElementwiseOptimizer<Optimizer, Options, State>, `Other` another one.
template <typename Optimizer_, typename Other_>
struct CaseOf {
 private:
  template <typename D, typename O, typename S>
  static std::tuple<O, S> parts(const ElementwiseOptimizer<D, O, S>*);
  using Parts = decltype(parts(static_cast<const Optimizer_*>(nullptr)));

 public:
  using Optimizer = Optimizer_;
  using Options = std::tuple_element_t<0, Parts>;
  using State = std::tuple_element_t<1, Parts>;
  using Other = Other_;
};

/// The state of `p` in `opt`, as the case's State.
template <typename C>
const typename C::State& state_of(const typename C::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const typename C::State&>(*opt.state().at(compat::state_key(p)));
}

/// Clones of every buffer of `st` (an undefined one stays undefined).
template <typename State>
std::vector<at::Tensor> buffer_copies(const State& st) {
  std::vector<at::Tensor> out;
  for (const at::Tensor* b : st.const_buffers()) out.push_back(b->defined() ? b->clone() : at::Tensor());
  return out;
}

/// Every buffer of `st` bit for bit equal to `before` (buffer_copies of it
/// earlier; undefined where it was undefined), a failure naming the buffer.
template <typename State>
void expect_same_buffers(const State& st, const std::vector<at::Tensor>& before) {
  const auto after = buffer_copies(st);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].defined(), before[i].defined()) << State::kBuffers[i];
    if (before[i].defined()) {
      EXPECT_TRUE(at::equal(after[i], before[i])) << State::kBuffers[i];
    }
  }
}

/// A check that building Opt over `params` with the options it is given
/// raises c10::ValueError whose message holds each of the words.
template <typename Opt, typename Options>
auto refused_with(std::vector<at::Tensor> params) {
  return [params](const Options& o, const std::vector<std::string>& words) {
    expect_value_error([&] { Opt opt(params, o); }, words);
  };
}

/// One step of `opt` on `p` with gradient `grad`; then `spoil()` (an edit
/// of the options, a gradient out of range) makes the next step raise
/// c10::ValueError with `words`, and that step changes nothing: p, every
/// buffer of p's State bit for bit, and its step count of 1.
template <typename State, typename Opt>
void expect_spoiled_step_changes_nothing(Opt& opt, at::Tensor& p, const at::Tensor& grad,
                                         const std::function<void()>& spoil, const std::vector<std::string>& words) {
  p.mutable_grad() = grad;
  opt.step();
  const auto state = [&]() -> const State& { return static_cast<const State&>(*opt.state().at(compat::state_key(p))); };
  const auto before = p.detach().clone();
  const auto buffers_before = buffer_copies(state());
  spoil();
  expect_value_error([&] { opt.step(); }, words);
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_EQ(state().step(), 1);
  expect_same_buffers(state(), buffers_before);
}

/// expect_fields, over the field indices I.
template <typename Options, typename Want, size_t... I>
void expect_fields_at(const Options& o, const Want& want, std::index_sequence<I...>) {
  const auto got = Options::fields(o);
  const auto one = [](const auto& g, const auto& w, const char* name) { EXPECT_EQ(g, w) << name; };
  (one(std::get<I>(got), std::get<I>(want), Options::kFields[I]), ...);
}

/// Expects the fields of `o`, in Options::fields' order, to equal `want`
/// (a failure names the field by Options::kFields).
template <typename Options, typename... V>
void expect_fields(const Options& o, const V&... want) {
  static_assert(sizeof...(V) == Options::kFields.size(), "one value a field");
  expect_fields_at(o, std::forward_as_tuple(want...), std::index_sequence_for<V...>{});
}

/// Building C::Optimizer with lr -1 raises c10::ValueError naming the
/// optimizer, "lr" and "-1"; with the options of each row of `invalid`, one
/// whose message holds the row's words.
template <typename C>
void expect_invalid_options(
    const std::vector<std::pair<typename C::Options, std::vector<std::string>>>& invalid) {
  auto p = leaf(at::randn({3}));
  expect_value_error([&] { typename C::Optimizer opt({p}, typename C::Options(-1)); },
                     {std::string("[") + C::Optimizer::kNames.kind + "]", "lr", "-1"});
  for (const auto& [options, words] : invalid)
    expect_value_error([&] { typename C::Optimizer opt({p}, options); }, words);
}

/// For options with a weight_decay_method: building C::Optimizer with
/// method "palm" raises c10::ValueError naming the methods, and so does
/// setting the config field <kName>_weight_decay_method to it.
template <typename C>
void expect_weight_decay_method_checked() {
  auto p = leaf(at::randn({3}));
  const auto options = typename C::Options().weight_decay_method("palm");
  expect_value_error([&] { typename C::Optimizer opt({p}, options); },
                     {"weight_decay_method", "decoupled, independent, l2", "'palm'"});
  OptimizerConfig c;
  const auto field = std::string(C::kName) + "_weight_decay_method";
  expect_value_error([&] { c.set(field, std::string("palm")); }, {field, "palm"});
}

/// `steps` steps of C::Optimizer over the fp32 parameters of `run` beside
/// their fp64 references, with the options of `h` (`h.fields()`, in
/// C::Options::fields' order). Expects every parameter and every buffer
/// (C::State::kBuffers, matched with the reference's moments() in order)
/// within `tol` of the reference, relative to its largest value, and the
/// step count at `steps`; `what` names the setting in failures. Returns the
/// optimizer's state_bytes().
template <typename C, typename Reference, typename Hyper>
int64_t expect_steps_equal_reference(ReferenceRun<Reference>& run, const Hyper& h, int steps,
                                     double tol, const std::string& what) {
  typename C::Options options;
  C::Options::fields(options) = h.fields();
  typename C::Optimizer opt(run.params, options);
  run.run(opt, h, steps);
  for (size_t k = 0; k < run.params.size(); ++k) {
    const auto& st = state_of<C>(opt, run.params[k]);
    EXPECT_EQ(st.step(), steps);
    EXPECT_LE(relative(run.params[k], run.refs[k].p), tol) << what << " param " << k;
    const auto buffers = st.const_buffers();
    const auto moments = run.refs[k].moments();
    EXPECT_EQ(moments.size(), buffers.size());
    for (size_t i = 0; i < buffers.size() && i < moments.size(); ++i)
      EXPECT_LE(relative(*buffers[i], *moments[i]), tol)
          << what << " " << C::State::kBuffers[i] << " " << k;
  }
  return opt.state_bytes();
}

/// Six steps straight equal three, save, load into an optimizer built with
/// other options (the archive's options replace them, field for field, lr
/// included) and three more, bit for bit.
template <typename C>
void ResumedRunIsBitIdentical() {
  const auto data = gradient_run(1, {6, 4}, 6);
  const auto options = C::resumed();
  auto a = leaf(data.init);
  typename C::Optimizer straight({a}, options);
  data.run(a, straight, 0, 6);

  auto b = leaf(data.init);
  typename C::Optimizer first({b}, options);
  data.run(b, first, 0, 3);
  first.param_groups()[0].options().set_lr(options.lr());  // unchanged value, exercised path
  const auto bytes = save_to_string(first);
  auto c = leaf(b.detach());
  typename C::Optimizer second({c}, C::replaced());  // options come from the archive
  load_from_string(second, bytes);
  const auto& o = static_cast<const typename C::Options&>(second.param_groups()[0].options());
  EXPECT_TRUE(o == options);
  EXPECT_DOUBLE_EQ(second.param_groups()[0].options().get_lr(), options.lr());
  EXPECT_TRUE(state_of<C>(second, c) == state_of<C>(first, b));
  data.run(c, second, 3, 6);
  EXPECT_TRUE(at::equal(a.detach(), c.detach()));
}

/// Loading C::Other's archive raises c10::ValueError naming both optimizers
/// and changes neither options nor state.
template <typename C>
void LoadRejectsAnotherOptimizersArchiveAndChangesNothing() {
  auto p = leaf(at::randn({3}));
  const auto bytes = archive_after_a_step<typename C::Other>(p);
  typename C::Optimizer opt({p}, typename C::Options(0.2));
  expect_value_error([&] { load_from_string(opt, bytes); },
                     {std::string("[") + C::Optimizer::kNames.kind + "]", C::Other::kNames.kind});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_TRUE(opt.state().empty());
}

/// Loading an archive of another group structure raises c10::ValueError
/// and changes nothing.
template <typename C>
void LoadRejectsOtherGroupsAndChangesNothing() {
  const auto bytes = archive_after_a_step<typename C::Optimizer>(leaf(at::randn({3})));
  auto q = leaf(at::randn({3}));
  auto r = leaf(at::randn({3}));
  typename C::Optimizer two({q, r}, typename C::Options(0.2));
  expect_value_error([&] { load_from_string(two, bytes); }, {"1 parameters", "has 2"});
  EXPECT_DOUBLE_EQ(two.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_TRUE(two.state().empty());
}

/// A parameter without a gradient keeps its value and gets no state.
template <typename C>
void ParametersWithoutGradientAreSkipped() {
  auto p = leaf(at::randn({3}));
  const auto before = p.detach().clone();
  typename C::Optimizer opt({p});
  opt.step();
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_TRUE(opt.state().empty());
  EXPECT_EQ(opt.state_bytes(), 0);
}

/// LibTorch's StepLR drives the lr through get_lr/set_lr.
template <typename C>
void SchedulerDrivesLr() {
  auto p = leaf(at::randn({3}));
  typename C::Optimizer opt({p}, typename C::Options(1.0));
  torch::optim::StepLR sched(opt, 1, 0.5);
  step_with_ones(opt, p);
  sched.step();  // LibTorch 1.13's StepLR changes nothing on its first call
  sched.step();
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.5);
}

/// A bad edit of the options between steps (C::bad_edit, then an lr < 0) is
/// caught by the next step, which changes neither the parameter nor its state.
template <typename C>
void BadEditBetweenStepsChangesNothing() {
  auto p = leaf(at::randn({3}));
  typename C::Optimizer opt({p});
  step_with_ones(opt, p);
  const auto& st = state_of<C>(opt, p);
  const auto buffers_before = buffer_copies(st);
  const auto before = p.detach().clone();
  auto& o = static_cast<typename C::Options&>(opt.param_groups()[0].options());
  const auto good = o;
  C::bad_edit(o);
  expect_value_error([&] { opt.step(); }, C::bad_edit_words());
  o = good;
  o.set_lr(-0.5);
  expect_value_error([&] { opt.step(); }, {std::string("[") + C::Optimizer::kNames.kind + "]", "lr", "-0.5"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_EQ(st.step(), 1);
  expect_same_buffers(st, buffers_before);
}

/// muon::make_optimizer builds the optimizer from C::kConfig with its
/// fields (C::check_config), one step fills every buffer, and muon::explain
/// lists the state schema: step and each buffer, of the parameter's shape.
template <typename C>
void BuiltFromAConfigWithItsFieldsAndExplained() {
  auto named = ckpt::matrix_and_bias();
  OptimizerConfig config;
  apply_config_json(config, C::kConfig);
  auto opt = muon::make_optimizer(named, config);
  ASSERT_EQ(opt->num_parts(), 1u);
  EXPECT_EQ(opt->part_name(0), C::kName);
  auto* part = dynamic_cast<typename C::Optimizer*>(opt->find_part(C::kName));
  ASSERT_NE(part, nullptr);
  C::check_config(static_cast<const typename C::Options&>(part->param_groups()[0].options()));
  for (auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
  opt->step();
  const auto buffers = static_cast<int64_t>(C::State::kBuffers.size());
  EXPECT_EQ(muon::optimizer_state_bytes(*opt), buffers * (32 + 8) * 4);
  std::string schema = std::string("state of ") + C::kName + ": step [counter]";
  for (const char* key : C::State::kBuffers)
    schema += std::string(", ") + key + " [param, zeros, rows]";
  const auto text = muon::explain(named, config);
  EXPECT_NE(text.find(schema), std::string::npos) << schema << "\n" << text;
}

/// One process trains C::kName for 8 steps; then a chain of checkpointed
/// runs of a step each, each resuming from the last one's checkpoint at
/// another world size or layout — sharded at 2 ranks → layer-wise at 3 →
/// one process → tensor-parallel at 2 → a (dp 2, tp 2) mesh → sharded at 2
/// → one process → sharded at 3 — equals it
/// bit for bit after every step. The optimizer is element-wise, so every
/// layout computes each element with the same operations on the same
/// values, and the state moves with its parameter's rows or columns (the
/// buffers are split, gathered whole and split again; the step counter
/// travels).
template <typename C>
void EveryLayoutEqualsOneProcessAndCheckpointsReshardBitIdentically() {
  const auto after = ckpt::one_process_after(C::kName, {1, 2, 3, 4, 5, 6, 7, 8}, [](ckpt::Rank& r) {
    const auto slots = distributed::detail::state_slots(*r.opt);
    ASSERT_EQ(slots.size(), ckpt::kModel.size());
    EXPECT_EQ(slots.at(0).kind, C::kName);
  });
  ckpt::reshard_chain(C::kName, std::string(C::kName) + "_reshard",
                      {{"sharded", 2, 1, "sharded W=2"},
                       {"layerwise", 3, 2, "layer-wise W=3 from sharded W=2"},
                       {"none", 1, 3, "single from layer-wise W=3"},
                       {"tp", 2, 4, "tensor-parallel W=2 from single"},
                       {"2d", 4, 5, "dp x tp 2x2 from tensor-parallel W=2"},
                       {"sharded", 2, 6, "sharded W=2 from dp x tp 2x2"},
                       {"none", 1, 7, "single from sharded W=2"},
                       {"sharded", 3, 8, "sharded W=3 from single"}},
                      after);
}

/// Weight decay "l2" adds wd·p to the gradient the step uses, leaving the
/// caller's gradient unchanged (for options with a weight_decay_method).
template <typename C>
void L2DecayLeavesTheCallersGradientUnchanged() {
  auto p = leaf(at::randn({4, 3}));
  typename C::Optimizer opt({p},
                            typename C::Options(0.01).weight_decay(0.5).weight_decay_method("l2"));
  const auto g = at::randn({4, 3});
  p.mutable_grad() = g.clone();
  opt.step();
  EXPECT_TRUE(at::equal(p.grad(), g));
}

}  // namespace muon::test::elementwise

namespace muon::test {
// The element-wise optimizers' reference runs compare with these.
using elementwise::doubles;
using elementwise::relative;
}  // namespace muon::test

/// The shared test `Name` of case `C` in GoogleTest suite `Suite`: the
/// function template of that name above, run for C.
#define MUON_ELEMENTWISE_CASE(Suite, C, Name) \
  TEST(Suite, Name) { ::muon::test::elementwise::Name<C>(); }

/// The shared tests of case `C` in GoogleTest suite `Suite` (the
/// optimizer's name), under the names the optimizer's own tests had.
#define MUON_ELEMENTWISE_CASES(Suite, C)                                                \
  MUON_ELEMENTWISE_CASE(Suite, C, ResumedRunIsBitIdentical)                             \
  MUON_ELEMENTWISE_CASE(Suite, C, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) \
  MUON_ELEMENTWISE_CASE(Suite, C, LoadRejectsOtherGroupsAndChangesNothing)              \
  MUON_ELEMENTWISE_CASE(Suite, C, ParametersWithoutGradientAreSkipped)                  \
  MUON_ELEMENTWISE_CASE(Suite, C, SchedulerDrivesLr)                                    \
  MUON_ELEMENTWISE_CASE(Suite, C, BadEditBetweenStepsChangesNothing)                    \
  MUON_ELEMENTWISE_CASE(Suite, C, BuiltFromAConfigWithItsFieldsAndExplained)            \
  MUON_ELEMENTWISE_CASE(Suite, C, EveryLayoutEqualsOneProcessAndCheckpointsReshardBitIdentically)
