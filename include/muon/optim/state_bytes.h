#pragma once

/// How much memory an optimizer's state takes, asked one way for every
/// optimizer: the library's optimizers (muon::Muon and its subclasses,
/// muon::Lion, muon::CompositeOptimizer and muon::MuonWithAdamW,
/// muon::distributed::LayerwiseOptimizer) implement `muon::StateBytes`; any other
/// (LibTorch's Adam, AdamW, SGD, a user's) is counted from its per-parameter
/// state through the state schema of the registry entry that describes it.
#include <torch/optim/optimizer.h>

#include <cstdint>

namespace muon {

/// Implemented by optimizers that report the bytes of their state tensors
/// (momentum buffers, second moments, ...): `optimizer_state_bytes` asks
/// them. A user optimizer derives from it beside `torch::optim::Optimizer`
/// to be counted inside a composite or a distributed layout.
class StateBytes {
 public:
  virtual ~StateBytes() = default;
  /// Bytes held in this optimizer's state tensors on this process.
  virtual int64_t state_bytes() const = 0;

 protected:
  StateBytes() = default;
  StateBytes(const StateBytes&) = default;
  StateBytes& operator=(const StateBytes&) = default;
};

/// Bytes held in the state tensors of `optimizer`: its own count when it
/// implements `muon::StateBytes`; otherwise the tensors its state schema
/// names (muon/optim/state_schema.h; the global registry's entries); 0 for
/// an optimizer no registered schema describes.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace muon
