// The distributed layer under its former names: the include/muon/dist/ paths
// forward to include/muon/distributed/, and muon::dist is an alias of
// muon::distributed (muon/distributed/namespace.h), for one release.
// Every old path is included here, so a forwarding header that goes missing
// or points at a moved header fails to compile.
#include "muon/dist/checkpoints/checkpoint.h"
#include "muon/dist/layouts/assignment.h"
#include "muon/dist/layouts/layerwise.h"
#include "muon/dist/layouts/layout.h"
#include "muon/dist/layouts/make.h"
#include "muon/dist/layouts/newton_schulz.h"
#include "muon/dist/layouts/qk_clip.h"
#include "muon/dist/layouts/row_shard.h"
#include "muon/dist/layouts/sharded_data_parallel.h"
#include "muon/dist/layouts/sharded_dion2.h"
#include "muon/dist/layouts/sharded_muon.h"
#include "muon/dist/layouts/sharded_soap.h"
#include "muon/dist/layouts/tensor_parallel.h"
#include "muon/dist/layouts/tensor_parallel_layers.h"
#include "muon/dist/layouts/tensor_parallel_shard.h"
#include "muon/dist/runtime/agreement.h"
#include "muon/dist/runtime/group.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <type_traits>

#include "muon/muon.h"

namespace {

static_assert(std::is_same_v<muon::dist::Group, muon::distributed::Group>);
static_assert(std::is_same_v<muon::dist::ShardedMuon, muon::distributed::ShardedMuon>);
static_assert(std::is_same_v<muon::dist::CheckpointOptions, muon::distributed::CheckpointOptions>);

TEST(DistForwarding, OldNamesReachTheSameFunctions) {
  // The same function, not a copy: an alias names the one namespace.
  EXPECT_EQ(&muon::dist::assign_owners, &muon::distributed::assign_owners);
  // And it calls through: four equal costs over two ranks, two each.
  const auto owners = muon::dist::assign_owners({1.0, 1.0, 1.0, 1.0}, 2);
  ASSERT_EQ(owners.size(), 4u);
  EXPECT_EQ(std::count(owners.begin(), owners.end(), 0), 2);
}

}  // namespace
