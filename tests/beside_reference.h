#pragma once
// A parameter stepped by an optimizer beside the test's reference.
#include <ATen/ATen.h>

#include <utility>

#include "tensor_util.h"

namespace muon::test {

/// One parameter from a GradientRun's start, stepped by `Opt` through the
/// run's first `steps` gradients beside `Ref`, the test's reference (built
/// from `ref_options` and the start, stepped with the same gradients), for
/// the tests that compare the two after each step or at the end.
template <typename Opt, typename Ref>
struct BesideReference {
  template <typename Options, typename RefOptions>
  BesideReference(GradientRun run, const Options& options, const RefOptions& ref_options, int steps)
      : data(std::move(run)), ref(ref_options, data.init), p(leaf(data.init.clone())), opt({p}, options) {
    for (int s = 0; s < steps; ++s) {
      ref.step(data.grads[static_cast<size_t>(s)]);
      data.run(p, opt, s, s + 1);
    }
  }

  GradientRun data;
  Ref ref;
  at::Tensor p;
  Opt opt;
};

}  // namespace muon::test
