// The tests every element-wise optimizer (muon::ElementwiseOptimizer: Lion,
// LaProp, Signum, SimAdEMAMix) passes, written once and run by each
// optimizer's test file with a case struct describing it:
//
//   struct Case {
//     using Optimizer = ...; using Options = ...; using State = ...;
//     using Other = ...;                    // another element-wise optimizer
//     static constexpr const char* kName;   // its registry entry, e.g. "laprop"
//     static Options resumed();             // non-default options of the resumed run
//     static Options replaced();            // other options the loader must replace
//     static void bad_edit(Options& o);     // makes `o` invalid ...
//     static std::vector<std::string> bad_edit_words();  // ... and the error names it so
//     static constexpr const char* kConfig; // JSON config building kName with its fields
//     static void check_config(const Options& o);  // the options that config gives
//   };
//
// Each file keeps its own independent fp64 reference of the published
// arithmetic and the tests of options only it has.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <torch/optim/schedulers/step_lr.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "archive_util.h"
#include "checkpoint_model.h"
#include "distributed/checkpoints/checkpoint_state.h"
#include "expect_util.h"
#include "muon/compat.h"
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
};

/// The state of `p` in `opt`, as the case's State.
template <typename C>
const typename C::State& state_of(const typename C::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const typename C::State&>(*opt.state().at(compat::state_key(p)));
}

/// Clones of every buffer of `st`.
template <typename State>
std::vector<at::Tensor> buffer_copies(const State& st) {
  std::vector<at::Tensor> out;
  for (const at::Tensor* b : st.const_buffers()) out.push_back(b->clone());
  return out;
}

/// Six steps straight equal three, save, load into an optimizer built with
/// other options (the archive's options replace them, field for field, lr
/// included) and three more, bit for bit.
template <typename C>
void resumed_run_is_bit_identical() {
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
void load_rejects_another_optimizers_archive_and_changes_nothing() {
  auto p = leaf(at::randn({3}));
  typename C::Other other({p});
  p.mutable_grad() = at::ones({3});
  other.step();
  const auto bytes = save_to_string(other);
  typename C::Optimizer opt({p}, typename C::Options(0.2));
  expect_value_error([&] { load_from_string(opt, bytes); },
                     {std::string("[") + C::Optimizer::kKind + "]", C::Other::kKind});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_TRUE(opt.state().empty());
}

/// Loading an archive of another group structure raises c10::ValueError
/// and changes nothing.
template <typename C>
void load_rejects_other_groups_and_changes_nothing() {
  auto p = leaf(at::randn({3}));
  typename C::Optimizer opt({p});
  p.mutable_grad() = at::ones({3});
  opt.step();
  const auto bytes = save_to_string(opt);
  auto q = leaf(at::randn({3}));
  auto r = leaf(at::randn({3}));
  typename C::Optimizer two({q, r}, typename C::Options(0.2));
  expect_value_error([&] { load_from_string(two, bytes); }, {"1 parameters", "has 2"});
  EXPECT_DOUBLE_EQ(two.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_TRUE(two.state().empty());
}

/// A parameter without a gradient keeps its value and gets no state.
template <typename C>
void parameters_without_gradient_are_skipped() {
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
void scheduler_drives_lr() {
  auto p = leaf(at::randn({3}));
  typename C::Optimizer opt({p}, typename C::Options(1.0));
  torch::optim::StepLR sched(opt, 1, 0.5);
  p.mutable_grad() = at::ones({3});
  opt.step();
  sched.step();  // LibTorch 1.13's StepLR changes nothing on its first call
  sched.step();
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.5);
}

/// A bad edit of the options between steps (C::bad_edit, then an lr < 0) is
/// caught by the next step, which changes neither the parameter nor its state.
template <typename C>
void bad_edit_between_steps_changes_nothing() {
  auto p = leaf(at::randn({3}));
  typename C::Optimizer opt({p});
  p.mutable_grad() = at::ones({3});
  opt.step();
  const auto& st = state_of<C>(opt, p);
  const auto buffers_before = buffer_copies(st);
  const auto before = p.detach().clone();
  auto& o = static_cast<typename C::Options&>(opt.param_groups()[0].options());
  const auto good = o;
  C::bad_edit(o);
  expect_value_error([&] { opt.step(); }, C::bad_edit_words());
  o = good;
  o.set_lr(-0.5);
  expect_value_error([&] { opt.step(); },
                     {std::string("[") + C::Optimizer::kKind + "]", "lr", "-0.5"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_EQ(st.step(), 1);
  const auto buffers_after = buffer_copies(st);
  ASSERT_EQ(buffers_after.size(), buffers_before.size());
  for (size_t i = 0; i < buffers_after.size(); ++i)
    EXPECT_TRUE(at::equal(buffers_after[i], buffers_before[i])) << C::State::kBuffers[i];
}

/// muon::make_optimizer builds the optimizer from C::kConfig with its
/// fields (C::check_config), one step fills every buffer, and muon::explain
/// lists the state schema: step and each buffer, of the parameter's shape.
template <typename C>
void built_from_a_config_with_its_fields_and_explained() {
  ckpt::Named named;
  named.insert("w", leaf(at::randn({8, 4})));
  named.insert("b", leaf(at::randn({8})));
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
void every_layout_equals_one_process_and_checkpoints_reshard_bit_identically() {
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
void l2_decay_leaves_the_callers_gradient_unchanged() {
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

/// The shared tests of case `C` in GoogleTest suite `Suite` (the
/// optimizer's name), under the names the optimizer's own tests had.
#define MUON_ELEMENTWISE_CASES(Suite, C)                                                         \
  TEST(Suite, ResumedRunIsBitIdentical) {                                                        \
    ::muon::test::elementwise::resumed_run_is_bit_identical<C>();                                \
  }                                                                                              \
  TEST(Suite, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {                            \
    ::muon::test::elementwise::load_rejects_another_optimizers_archive_and_changes_nothing<C>(); \
  }                                                                                              \
  TEST(Suite, LoadRejectsOtherGroupsAndChangesNothing) {                                         \
    ::muon::test::elementwise::load_rejects_other_groups_and_changes_nothing<C>();               \
  }                                                                                              \
  TEST(Suite, ParametersWithoutGradientAreSkipped) {                                             \
    ::muon::test::elementwise::parameters_without_gradient_are_skipped<C>();                     \
  }                                                                                              \
  TEST(Suite, SchedulerDrivesLr) { ::muon::test::elementwise::scheduler_drives_lr<C>(); }        \
  TEST(Suite, BadEditBetweenStepsChangesNothing) {                                               \
    ::muon::test::elementwise::bad_edit_between_steps_changes_nothing<C>();                      \
  }                                                                                              \
  TEST(Suite, BuiltFromAConfigWithItsFieldsAndExplained) {                                       \
    ::muon::test::elementwise::built_from_a_config_with_its_fields_and_explained<C>();           \
  }                                                                                              \
  TEST(Suite, EveryLayoutEqualsOneProcessAndCheckpointsReshardBitIdentically) {                  \
    ::muon::test::elementwise::                                                                  \
        every_layout_equals_one_process_and_checkpoints_reshard_bit_identically<C>();            \
  }
