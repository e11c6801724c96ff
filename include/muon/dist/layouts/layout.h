// Deprecated path, kept for one release: the distributed layer's headers are
// in muon/distributed/ and its namespace is muon::distributed (muon::dist is
// an alias). Include "muon/distributed/layouts/layout.h" instead.
#pragma once
#include "muon/distributed/layouts/layout.h"
