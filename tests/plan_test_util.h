// What the tests of muon::plan share: a machine of round figures and a
// prediction on it.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <functional>
#include <string>

#include "muon/plan.h"

namespace plan_test {

// The types of muon::plan the tests name (`using namespace plan_test;`
// brings them and the helpers below).
using muon::plan::LayoutKind;
using muon::plan::Machine;
using muon::plan::Model;
using muon::plan::Options;
using muon::plan::Prediction;

// Round figures: every GEMM class at 1 GFLOP/s, links of 1 ms and 1 MB/s,
// no per-element or per-tensor cost, one rank per accelerator.
inline muon::plan::Machine round_machine() {
  muon::plan::Machine m;
  m.name = "round";
  for (int c = 0; c < muon::plan::kShapeClasses; ++c) m.gemm_fp32[c] = m.gemm_bf16[c] = 1e9;
  m.ranks_per_node = 8;
  m.intra = {1e-3, 1e6};
  m.inter = {1e-2, 1e5};
  return m;
}

// `model` in `layout` at `world` ranks (`tp`: the tensor-parallel size, 0
// for the layout's default) on round_machine().
inline muon::plan::Prediction predict(const muon::plan::Model& model, muon::plan::LayoutKind layout,
                                      int64_t world, int64_t tp = 0) {
  muon::plan::Options o;
  o.world = world;
  o.tp = tp;
  return muon::plan::predict(model, round_machine(), layout, o);
}

// The message of a refusal (a c10::ValueError) by `fn`, or "" when none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace plan_test
