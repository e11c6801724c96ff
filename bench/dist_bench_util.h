#pragma once
// Shared by the distributed benchmarks: their command line and the median.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace muon::bench {

/// --iters N (timed steps), --warmup N, --single-threads N (threads of the
/// single-process baseline).
struct Args {
  int iters = 5;
  int warmup = 1;
  int single_threads = 2;
};

/// Parses the flags above; an unknown one exits with status 2.
inline Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (arg == "--iters") {
      a.iters = std::max(1, v);
    } else if (arg == "--warmup") {
      a.warmup = std::max(0, v);
    } else if (arg == "--single-threads") {
      a.single_threads = std::max(1, v);
    } else {
      std::fprintf(stderr, "unknown option %s\n", arg.c_str());
      std::exit(2);
    }
  }
  return a;
}

/// The median of `v` (non-empty).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace muon::bench
