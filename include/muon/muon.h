#pragma once

/// muon-cpp: the Muon optimizer engine on LibTorch.
///
/// Umbrella header: includes every public header of the library.
#include "muon/newton_schulz.h"
#include "muon/scaling.h"
#include "muon/version.h"
