#pragma once
// Small tensor helpers shared by the optimizer tests.
#include <ATen/ATen.h>

namespace muon::test {

/// A parameter: a fresh copy of `values` that requires grad.
inline at::Tensor leaf(const at::Tensor& values) {
  auto t = values.detach().clone();
  t.set_requires_grad(true);
  return t;
}

}  // namespace muon::test
