#pragma once

/// Ranks that must describe the same thing: a check that names the first
/// difference in the user's terms, and DDP's start (parameters broadcast
/// from one rank).
///
///     std::vector<muon::distributed::AgreementItem> items{{"--width", std::to_string(width)}};
///     muon::distributed::check_ranks_agree(world, items, "[my_trainer] ", "pass the same flags");
///     muon::distributed::broadcast_parameters(model->named_parameters(), world);
///
/// A mismatch raises the same c10::ValueError on every rank of the group,
/// e.g. "lr of param group 0 is 0.01 on rank 1, 0.02 on rank 0", instead of
/// training the ranks apart or hanging some of them in the next collective.
#include <ATen/ATen.h>
#include <torch/ordered_dict.h>

#include <string>
#include <vector>

#include "muon/distributed/runtime/group.h"

namespace muon::distributed {

/// One thing the ranks of a group must agree on: what it is, in the user's
/// terms ("lr of param group 0", "parameter 'blocks.0.attn.w'"), and this
/// rank's value as text ("0.02", "shape [64, 64], Float"). Two ranks agree
/// on an item when both texts are equal; messages clip them to
/// kMaxAgreementText characters.
struct AgreementItem {
  std::string name;
  std::string value;
};

/// Characters of an item's name or value that a message shows.
constexpr size_t kMaxAgreementText = 160;

/// Collective over `group`: every rank passes its items, in order. Unless
/// every rank passes the same items (count, names and values), every rank
/// raises the same c10::ValueError
///   "<who>the ranks of group '<g>' disagree: <name> is <value on rank r>
///    on rank r, <value on rank 0> on rank 0; <hint>"
/// for the first item (in order) where some rank r differs from rank 0 (the
/// first such rank). Items that differ in name or that one rank lacks are
/// named with their position. Costs one all-gather of two integers when
/// the ranks agree; a single-rank group returns at once.
void check_ranks_agree(const Group& group, const std::vector<AgreementItem>& items,
                       const std::string& who, const std::string& hint);

/// Replicated parameters start equal, as DistributedDataParallel makes them:
/// checks that every rank of `group` has the same parameter names, shapes
/// and dtypes (check_ranks_agree, naming the first parameter that differs),
/// then copies rank `root`'s values into every rank's parameters.
/// Collective. Raises c10::ValueError on every rank for a mismatch or a
/// `root` outside the group.
void broadcast_parameters(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                          const Group& group, int root = 0);

}  // namespace muon::distributed
