#pragma once
// The weight-update hooks' sums over a parameter's parts in the layouts that
// split matrices (muon/optim/weight_update_hook.h, SumAcrossParts).
#include <map>
#include <string>
#include <unordered_map>

#include "muon/distributed/layouts/make.h"
#include "muon/optim/weight_update_hook.h"

namespace muon::distributed::detail {

/// Sums each parameter's partial sums over the ranks that hold its other
/// parts: a tensor-parallel block's over its group; a row shard's over its
/// group, then, for the 2-D layout's TP blocks, over the TP group. Other
/// parameters are whole (replicated). `names` maps tensors to the names
/// `layout` knows them by. Collective over those groups at each call: the
/// ranks of a group batch their parameters' rows into one all-reduce per
/// group, in the order the parameters come.
SumAcrossParts hook_sums(const DistributedLayout& layout, std::unordered_map<const void*, std::string> names);

}  // namespace muon::distributed::detail
