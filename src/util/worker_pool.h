// A persistent pool of worker threads for work the library spreads over
// threads itself (matrices side by side, one per thread).
#pragma once

#include <functional>

namespace muon::detail {

/// Runs `body(w)` for every w in [0, workers): w = 0 on the calling thread,
/// the others on the process's persistent worker threads, started the
/// first time they are needed and kept for later calls (no thread is
/// started per step). Returns once every call has returned; the first
/// exception any of them threw is rethrown then.
///
/// One caller at a time: when another thread's work holds the pool (ranks
/// run as threads of one process), or when called from inside a pool
/// worker, it returns false without running anything and the caller does
/// the work itself. Safe after fork(): a child starts its own workers.
bool run_on_workers(int workers, const std::function<void(int)>& body);

/// Worker threads this process has started (tests: the pool is reused).
int worker_threads_started();

}  // namespace muon::detail
