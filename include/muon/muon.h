#pragma once

/// muon-cpp: the Muon optimizer engine on LibTorch.
///
/// Umbrella header: includes every public header of the library.
#include "muon/compat.h"
#include "muon/config.h"
#include "muon/distributed/agreement.h"
#include "muon/distributed/assignment.h"
#include "muon/distributed/group.h"
#include "muon/distributed/layerwise.h"
#include "muon/distributed/make.h"
#include "muon/distributed/newton_schulz.h"
#include "muon/distributed/shard.h"
#include "muon/distributed/sharded.h"
#include "muon/distributed/tensor_parallel.h"
#include "muon/newton_schulz.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/composite.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"
#include "muon/optim/routing.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"
#include "muon/registry.h"
#include "muon/scaling.h"
#include "muon/schedule.h"
#include "muon/version.h"
