// A step that happens whole or changes nothing: what a step may change is
// copied before it, and put back bit for bit if the step raises. Internal.
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>

namespace muon::detail {

/// What a step of `optimizer` may change, copied: every parameter with a
/// gradient, and every tensor and counter of the per-parameter state of the
/// optimizers that keep it (itself, or its inner optimizers through
/// muon::InnerOptimizers), found through their registry state schemas. An
/// optimizer whose state no schema describes is copied through its own
/// save(). The copies hold as many bytes as those parameters and states.
class StepSnapshot {
 public:
  explicit StepSnapshot(torch::optim::Optimizer& optimizer);
  ~StepSnapshot();
  StepSnapshot(const StepSnapshot&) = delete;
  StepSnapshot& operator=(const StepSnapshot&) = delete;

  /// Puts every copied value back into the tensors and state objects it came
  /// from, and removes the states created since the snapshot.
  void restore();

 private:
  struct Leaf;
  std::vector<std::unique_ptr<Leaf>> leaves_;
};

/// Runs `step` (the part of a step of `optimizer` after its checks) as one
/// transaction: if it raises, a snapshot taken before is restored and the
/// error propagates; a c10::Error that is not a ValueError or an
/// out-of-memory error (e.g. linalg.eigh failing to converge) becomes
/// c10::ValueError "<who>the step failed in <where()>: <first line of the
/// error>; nothing of this step was applied". `where` may be empty. With
/// muon::set_whole_steps(false), no snapshot: `step` runs under
/// name_step_failure alone.
void run_whole_step(torch::optim::Optimizer& optimizer, const char* who,
                    const std::function<void()>& step,
                    const std::function<std::string()>& where = nullptr);

/// Runs `body`; a c10::Error it raises that is not a ValueError or an
/// out-of-memory error becomes c10::ValueError as run_whole_step words it,
/// naming `where()` (e.g. the parameter whose matrix function failed).
/// Other errors propagate as they are.
void name_step_failure(const char* who, const std::function<std::string()>& where,
                       const std::function<void()>& body);

}  // namespace muon::detail
