#pragma once

namespace muon {

/// Library version (semantic versioning).
constexpr int kVersionMajor = 0;
constexpr int kVersionMinor = 1;
constexpr int kVersionPatch = 0;
constexpr const char* kVersionString = "0.1.0";

}  // namespace muon
