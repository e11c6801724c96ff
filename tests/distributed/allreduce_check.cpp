// A 2+ rank test program for muon-launch and torchrun: joins the world group
// from the environment, sums (rank + 1) over the ranks and checks the result.
//
//   allreduce_check [--fail-rank R] [--exit-code C] [--sleep S]
//
// --fail-rank: rank R exits with status C (default 3) after joining the group
// and before the collective, so the others block in it until stopped.
// --sleep: every rank sleeps S seconds first (for signal tests).
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "muon/distributed/runtime/group.h"

int main(int argc, char** argv) {
  int fail_rank = -1;
  int exit_code = 3;
  int sleep_s = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--fail-rank") == 0) fail_rank = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--exit-code") == 0) exit_code = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sleep") == 0) sleep_s = std::atoi(argv[i + 1]);
  }
  if (sleep_s > 0) std::this_thread::sleep_for(std::chrono::seconds(sleep_s));
  auto world = muon::distributed::init_from_env(
      muon::distributed::GroupOptions().timeout(std::chrono::seconds(60)));
  const int rank = world.rank();
  const int n = world.size();
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  std::fprintf(stderr, "rank %d of %d: joined (stderr; agent store: %s)\n", rank, n,
               agent ? agent : "unset");
  if (rank == fail_rank) {
    std::printf("rank %d failing on purpose with status %d\n", rank, exit_code);
    std::fflush(stdout);
    std::_Exit(exit_code);
  }
  auto t = at::full({4}, static_cast<float>(rank + 1));
  world.all_reduce_(t);
  const float expected = static_cast<float>(n * (n + 1) / 2);
  if (!at::equal(t, at::full({4}, expected))) {
    std::printf("rank %d of %d: all_reduce WRONG (got %f, expected %f)\n", rank, n,
                t[0].item<float>(), expected);
    return 1;
  }
  std::printf("rank %d of %d: all_reduce ok (sum %d)\n", rank, n, static_cast<int>(expected));
  return 0;
}
