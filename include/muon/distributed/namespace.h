// The distributed layer's namespace, and its former name.
//
// muon::distributed holds the distributed layer (include/muon/distributed/).
// Up to 0.1 it was muon::dist; that name stays for one release as an alias,
// so code that names muon::dist::Group or muon::dist::make_sharded compiles
// unchanged. An alias cannot be reopened: code that declared its own names
// inside `namespace muon::dist { ... }` moves them to muon::distributed.
#pragma once

namespace muon {
namespace distributed {}
namespace dist = distributed;  // deprecated in 0.2, removed in 0.3
}  // namespace muon
