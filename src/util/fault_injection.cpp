// Fault points for tests (see fault_injection.h).
#include "util/fault_injection.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace muon::detail {
namespace {

std::atomic<int64_t> countdown{-1};  // < 0: disarmed
std::atomic<int64_t> reached{0};

}  // namespace

void inject_fault_at(const int64_t n) {
  reached.store(0);
  countdown.store(n < 0 ? -1 : n);
}

int64_t fault_points_reached() { return reached.load(); }

void fault_point(const char* where) {
  if (countdown.load(std::memory_order_relaxed) < 0) return;
  reached.fetch_add(1);
  // Exactly one point sees 0 and raises; the count then stays below 0.
  if (countdown.fetch_sub(1) == 0) TORCH_CHECK(false, "injected fault at ", where);
}

}  // namespace muon::detail
