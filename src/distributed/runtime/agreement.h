// "Do all ranks agree": one collective check used wherever the ranks of a
// group must describe the same thing (parameters, shapes, which parameters
// step), so a mismatch raises the same error on every rank instead of
// hanging some of them in the next collective.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <string>
#include <vector>

#include "muon/distributed/runtime/agreement.h"
#include "muon/distributed/runtime/group.h"

namespace muon {
class OptimizerConfig;
}  // namespace muon

namespace muon::distributed::detail {

/// FNV-1a of `text` continuing from `hash`: a signature of names and shapes
/// small enough to all-gather. Unsigned, so it wraps instead of overflowing.
inline uint64_t fnv1a(uint64_t hash, const std::string& text) {
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return hash;
}

/// The FNV-1a offset basis: the signature of nothing.
constexpr uint64_t kFnvOffset = 1469598103934665603ULL;

/// A signature as an int64 to all-gather (the low 63 bits).
inline int64_t signature_value(uint64_t hash) {
  return static_cast<int64_t>(hash & 0x7FFFFFFFFFFFFFFFULL);
}

/// Collective over `group`: every rank passes its `values`; unless all are
/// equal, every rank raises c10::ValueError "<who>on group '<name>' rank r
/// has [..], rank me has [..]: <what>", naming the first rank (in rank
/// order) whose values differ from its own.
inline void check_all_ranks_agree(const Group& group, const std::vector<int64_t>& values,
                                  const char* who, const std::string& what) {
  const auto all = group.all_gather_ints(values);
  const auto me = static_cast<size_t>(group.rank());
  for (const auto r : c10::irange(all.size())) {
    if (all[r] == all[me]) continue;
    TORCH_CHECK_VALUE(false, who, "on group '", group.name(), "' rank ", r, " has ",
                      c10::IntArrayRef(all[r]), ", rank ", me, " has ", c10::IntArrayRef(all[me]),
                      ": ", what);
  }
}

/// Collective over each of `peers` (in order, through max_over_groups):
/// raises `failure` (a message this rank caught, empty for none) or, when a
/// rank of `peers` reported one, a c10::ValueError "<who>the ranks disagree:
/// rank r of group '<peers[0]>' found a difference in its <where> (its
/// message names it)". Lets the
/// ranks of one group that raised together stop their peers in other groups
/// from waiting for them.
void raise_together(const std::string& failure, const std::vector<const Group*>& peers,
                    const char* who, const std::string& where);

// ---- the items the layouts compare (check_ranks_agree) ---------------------------

/// "parameter '<name>'" = "shape [..], <dtype>", one per parameter, in order.
std::vector<AgreementItem> parameter_items(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters);

/// "the checksum of the values of parameter '<name>'" = 16 hex digits, a
/// 64-bit hash of the parameter's bytes (copied to the CPU first when elsewhere):
/// equal values give equal checksums, and any difference of a single
/// element changes it.
std::vector<AgreementItem> value_items(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters);

/// Appends the items of one param group's options: "optimizer of <where>"
/// (the options' type) and "<field> of <where>" for every field the options
/// write in their archive (serialize), which for this library's options and
/// LibTorch's is every field that changes the step (options whose type
/// writes no archive give only the type). Doubles are written in the shortest text that reads back
/// exactly, so two ranks whose values differ in the last bit disagree.
void append_option_items(std::vector<AgreementItem>& out,
                         const torch::optim::OptimizerOptions& options, const std::string& where);

/// The items of every param group of `optimizer`: append_option_items with
/// where = "param group <g>", plus "parameters of param group <g>" (their
/// count and shapes).
std::vector<AgreementItem> optimizer_items(const torch::optim::Optimizer& optimizer);

/// "config field '<name>'" = its value for every field of `config`, then
/// "config override rule <i>" = its label, criteria and fields.
std::vector<AgreementItem> config_items(const OptimizerConfig& config);

}  // namespace muon::distributed::detail
