// Seeds of the optimizers' own random draws (Dion's Q and sketches,
// PSGD-Pro's probes): a pure function of the options' seed, the whole
// matrix's shape and the draw, so that every layout and device draws what
// one process draws. Not installed.
#pragma once

#include <cstdint>

namespace muon::detail {

/// splitmix64's finalizer: one well-mixed 64-bit value from `x`.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// The seed of draw `draw` for a rows × cols matrix under the options' `seed`.
inline uint64_t shape_draw_seed(int64_t seed, int64_t rows, int64_t cols, uint64_t draw) {
  auto s = splitmix64(static_cast<uint64_t>(seed));
  s = splitmix64(s ^ static_cast<uint64_t>(rows));
  s = splitmix64(s ^ static_cast<uint64_t>(cols));
  return splitmix64(s ^ draw);
}

}  // namespace muon::detail
