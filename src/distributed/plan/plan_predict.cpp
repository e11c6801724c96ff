// muon::plan's entry points (include/muon/plan.h): every input checked
// against its range before the planner runs (plan_checks.h), every
// prediction checked finite after, an overflowing count refused by name.
#include <c10/util/Exception.h>

#include <algorithm>

#include "muon/newton_schulz.h"
#include "muon/plan.h"
#include "plan_checks.h"

namespace muon::plan {
namespace {

constexpr const char* kWho = "[muon::plan] ";

}  // namespace

int shape_class(int64_t smaller_side) {
  if (smaller_side <= 128) return 0;
  if (smaller_side <= 512) return 1;
  if (smaller_side <= 2048) return 2;
  return 3;
}

double newton_schulz_flops(int64_t rows, int64_t cols, int64_t steps) {
  return muon::newton_schulz_flops(rows, cols, muon::NewtonSchulzOptions().steps(steps));
}

Prediction predict(const Model& model, const Machine& machine, LayoutKind layout, const Options& options) {
  detail::check_options(options);
  detail::check_machine(machine);
  detail::check_model(model);
  // The planner's work grows as tensors × world (owners, row shards and
  // bytes per rank); bounded so that a prediction takes well under a second.
  const auto tensors = static_cast<int64_t>(model.tensors.size());
  TORCH_CHECK_VALUE(tensors <= detail::kMaxWork / options.world, kWho, "world ", options.world, " with model '",
                    detail::shown(model.name), "' (", tensors, " tensors): tensors × world is more than ",
                    detail::kMaxWork, ", what the planner takes; plan a smaller world");
  try {
    auto p = detail::predict_unchecked(model, machine, layout, options);
    detail::check_finite(p, model, machine);
    return p;
  } catch (const detail::Overflow& e) {
    TORCH_CHECK_VALUE(false, kWho, "model '", detail::shown(model.name), "', layout ", to_string(layout), " at world ",
                      options.world, ": ", e.what(), " do not fit in int64; plan a smaller world or model");
  }
}

std::vector<Prediction> plan(const Model& model, const Machine& machine, const Options& options) {
  std::vector<Prediction> out;
  for (const auto layout : all_layouts()) {
    auto p = predict(model, machine, layout, options);
    if (p.why_not.empty()) out.push_back(std::move(p));
  }
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    return a.step_s < b.step_s;
  });
  return out;
}

Prediction recommend(const Model& model, const Machine& machine, const Options& options) {
  const auto all = plan(model, machine, options);
  TORCH_CHECK_VALUE(!all.empty(), kWho, "no layout can run model '", detail::shown(model.name), "' at world ",
                    options.world);
  return all.front();
}

}  // namespace muon::plan
