#pragma once
// Round-trips an optimizer through a torch::serialize archive in memory.
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>
#include <string>

#include "expect_util.h"
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

/// An Optimizer over one parameter, built with `options`, refuses the
/// archive of an Other after one step, naming `who` and `other_kind`, and
/// keeps its lr and its empty state.
template <typename Optimizer, typename Other, typename Options>
void expect_refuses_archive_of(const Options& options, const std::string& who, const std::string& other_kind) {
  auto p = leaf(at::randn({3, 2}));
  const auto bytes = archive_after_a_step<Other>(p);
  Optimizer opt({p}, options);
  expect_value_error([&] { load_from_string(opt, bytes); }, {who, other_kind});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), options.lr());
  EXPECT_TRUE(opt.state().empty());
}

/// `data` run straight through by an Optimizer built with `options`, and
/// again for its first `split` steps, saved, loaded into an Optimizer built
/// with `other` (the archive's options replace them) and run to the end:
/// the loaded options equal `options`, the loaded state (`state_of(opt, p)`)
/// equals the saved one, and both runs end bit-identical. `what` names the
/// case in the last failure.
template <typename Optimizer, typename Options, typename StateOf>
void expect_resumed_run_bit_identical(const GradientRun& data, int split, const Options& options,
                                      const Options& other, const StateOf& state_of,
                                      const std::string& what = "") {
  const int steps = static_cast<int>(data.grads.size());
  auto a = leaf(data.init);
  Optimizer straight({a}, options);
  data.run(a, straight, 0, steps);

  auto b = leaf(data.init);
  Optimizer first({b}, options);
  data.run(b, first, 0, split);
  const auto bytes = save_to_string(first);
  auto c = leaf(b.detach());
  Optimizer second({c}, other);
  load_from_string(second, bytes);
  const auto& o = static_cast<const Options&>(second.param_groups()[0].options());
  EXPECT_TRUE(o == options);
  EXPECT_TRUE(state_of(second, c) == state_of(first, b));
  data.run(c, second, split, steps);
  EXPECT_TRUE(at::equal(a.detach(), c.detach())) << what;
}

/// Reads into `in` what `out` holds, through its bytes.
inline void read_back(torch::serialize::OutputArchive& out, torch::serialize::InputArchive& in) {
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  in.load_from(in_bytes);
}

}  // namespace muon::test
