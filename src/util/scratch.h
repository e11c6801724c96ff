// Reusable buffers for the intermediates of a computation repeated every
// step (Newton–Schulz on a batch of matrices).
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <vector>

namespace muon::detail {

/// CPU buffers kept from one step to the next. A fresh buffer of a few
/// megabytes comes from mmap and costs a page fault per 4 KiB on first
/// touch; buffers reused step after step are faulted in once. Held by the
/// caller that repeats the work (muon::Muon holds one per worker thread),
/// so they are freed with it.
class Scratch {
 public:
  /// A contiguous CPU tensor of `sizes` and `dtype` over slot `slot`'s
  /// buffer, grown when too small. Valid until the slot is taken again or
  /// the Scratch is destroyed; it does not own the memory.
  at::Tensor take(size_t slot, at::IntArrayRef sizes, at::ScalarType dtype);
  /// Bytes held in all slots.
  size_t bytes() const;

 private:
  std::vector<at::Tensor> buffers_;
};

/// While alive on this thread, scratch_empty() takes CPU tensors from
/// `scratch`, one slot after another in the order of the calls (the
/// same computation asks in the same order every step). Scopes nest; a
/// null scratch turns scratch_empty() back into at::empty.
class ScratchScope {
 public:
  explicit ScratchScope(Scratch* scratch);
  ~ScratchScope();
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;

 private:
  Scratch* previous_;
  size_t previous_next_;
};

/// at::empty(sizes, options), or, inside a ScratchScope and for CPU
/// tensors, the scope's next slot. Only for intermediates that do not
/// outlive the scope.
at::Tensor scratch_empty(at::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace muon::detail
