// align_blas_threads: the BLAS pool follows LibTorch's intra-op count.
#include "util/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <mutex>

namespace muon::detail {
namespace {

using SetThreads = void (*)(int);

bool any_set(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

SetThreads lookup(const char* symbol) {
  return reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, symbol));
}

// The setters of the BLAS libraries whose count this process may change,
// decided once: the user's variables are read at the first call only, so a
// program's own later setenv cannot make a pool flip between owners.
struct Targets {
  SetThreads openblas = nullptr;
  SetThreads mkl = nullptr;

  Targets() {
    if (!any_set({"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"})) {
      openblas = lookup("openblas_set_num_threads");
    }
    if (!any_set({"MKL_NUM_THREADS", "OMP_NUM_THREADS"})) mkl = lookup("mkl_set_num_threads");
  }
  int count() const { return (openblas != nullptr ? 1 : 0) + (mkl != nullptr ? 1 : 0); }
};

}  // namespace

int align_blas_threads() {
  static const Targets targets;
  static std::atomic<int> last{0};  // the count last set; 0 before the first
  static std::mutex mutex;
  if (targets.count() == 0 || at::in_parallel_region()) return targets.count();
  const int n = at::get_num_threads();
  if (last.load(std::memory_order_acquire) == n) return targets.count();
  std::lock_guard<std::mutex> lock(mutex);
  if (last.load(std::memory_order_relaxed) != n) {
    if (targets.openblas != nullptr) targets.openblas(n);
    if (targets.mkl != nullptr) targets.mkl(n);
    last.store(n, std::memory_order_release);
  }
  return targets.count();
}

}  // namespace muon::detail
