// What an optimizer archive holds, in words, for load errors that name what
// differs ("the archive holds the state of muon::distributed::LayerwiseOptimizer,
// rank 0 of 2; ...") instead of a missing key.
#pragma once

#include <torch/serialize/input-archive.h>

#include <string>

namespace muon::detail {

/// Describes the optimizer state `archive` holds: the optimizer that wrote
/// it and what tells it apart (parts, layout, rank and world size), or "no
/// optimizer state this library writes" when no known key is present.
std::string describe_archive(torch::serialize::InputArchive& archive);

}  // namespace muon::detail
