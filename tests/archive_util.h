#pragma once
// Round-trips an optimizer through a torch::serialize archive in memory.
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>
#include <string>

#include "tensor_util.h"

namespace muon::test {

inline std::string save_to_string(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

inline void load_from_string(torch::optim::Optimizer& opt, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  opt.load(archive);
}

/// The archive of an Optimizer over `p` after one step with a gradient of ones.
template <typename Optimizer>
std::string archive_after_a_step(at::Tensor p) {
  Optimizer opt({p});
  step_with_ones(opt, p);
  return save_to_string(opt);
}

/// Reads into `in` what `out` holds, through its bytes.
inline void read_back(torch::serialize::OutputArchive& out, torch::serialize::InputArchive& in) {
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  in.load_from(in_bytes);
}

}  // namespace muon::test
