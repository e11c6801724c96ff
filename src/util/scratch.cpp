// Scratch buffers reused from step to step.
#include "util/scratch.h"

#include <c10/util/Exception.h>

namespace muon::detail {
namespace {

thread_local Scratch* current = nullptr;
thread_local size_t next_slot = 0;

}  // namespace

at::Tensor Scratch::take(size_t slot, at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto elements = c10::multiply_integers(sizes);
  const size_t bytes = static_cast<size_t>(elements) * c10::elementSize(dtype);
  if (slot >= buffers_.size()) buffers_.resize(slot + 1);
  auto& buffer = buffers_[slot];
  if (!buffer.defined() || static_cast<size_t>(buffer.numel()) < bytes) {
    buffer = at::Tensor();  // free the old one first
    buffer = at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, at::kByte);
  }
  return at::from_blob(buffer.data_ptr(), sizes, at::TensorOptions().dtype(dtype));
}

size_t Scratch::bytes() const {
  size_t total = 0;
  for (const auto& b : buffers_) total += b.defined() ? static_cast<size_t>(b.numel()) : 0;
  return total;
}

ScratchScope::ScratchScope(Scratch* scratch) : previous_(current), previous_next_(next_slot) {
  current = scratch;
  next_slot = 0;
}

ScratchScope::~ScratchScope() {
  current = previous_;
  next_slot = previous_next_;
}

at::Tensor scratch_empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (current == nullptr || !options.device().is_cpu()) return at::empty(sizes, options);
  return current->take(next_slot++, sizes, options.dtype().toScalarType());
}

}  // namespace muon::detail
