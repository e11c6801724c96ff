#pragma once

/// muon-cpp: the Muon optimizer engine on LibTorch.
///
/// Umbrella header: includes every public header of the library.
#include "muon/compat.h"
#include "muon/config.h"
#include "muon/dist/group.h"
#include "muon/dist/shard.h"
#include "muon/dist/tensor_parallel.h"
#include "muon/newton_schulz.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/composite.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"
#include "muon/optim/routing.h"
#include "muon/registry.h"
#include "muon/scaling.h"
#include "muon/schedule.h"
#include "muon/version.h"
