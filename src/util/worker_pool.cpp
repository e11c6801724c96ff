// The persistent worker pool behind run_on_workers.
#include "util/worker_pool.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace muon::detail {
namespace {

thread_local bool on_worker = false;

class Pool {
 public:
  bool run(int workers, const std::function<void(int)>& body) {
    if (workers <= 1 || on_worker) return false;
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    const int helpers = ensure_threads(workers - 1);
    std::exception_ptr first;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body_ = &body;
      active_ = helpers;
      pending_ = helpers;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    try {
      body(0);
    } catch (...) {
      first = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    body_ = nullptr;
    if (!first) first = error_;
    lock.unlock();
    if (first) std::rethrow_exception(first);
    return true;
  }

  int started() {
    std::lock_guard<std::mutex> lock(mutex_);
    return started_;
  }

 private:
  // Starts workers until `wanted` exist (fewer when the system refuses a
  // thread); returns how many take part. After fork() the parent's workers
  // do not exist in the child: it forgets them and starts its own.
  int ensure_threads(int wanted) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (owner_pid_ != ::getpid()) {
      owner_pid_ = ::getpid();
      count_ = 0;
    }
    while (count_ < wanted) {
      try {
        std::thread(&Pool::loop, this, count_ + 1, generation_).detach();
      } catch (const std::system_error&) {
        break;
      }
      ++count_;
      ++started_;
    }
    return count_ < wanted ? count_ : wanted;
  }

  void loop(int index, uint64_t seen) {
    on_worker = true;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (index > active_) continue;
      const auto* body = body_;
      lock.unlock();
      std::exception_ptr error;
      try {
        (*body)(index);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error && !error_) error_ = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex busy_;   // held by the one caller whose work runs
  std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int)>* body_ = nullptr;
  uint64_t generation_ = 0;
  int active_ = 0;   // workers 1..active_ take part in this generation
  int pending_ = 0;  // of those, how many have not finished
  int count_ = 0;    // workers alive in this process
  int started_ = 0;
  pid_t owner_pid_ = 0;
  std::exception_ptr error_;
};

// Never destroyed: its detached workers wait on it until the process ends.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

bool run_on_workers(int workers, const std::function<void(int)>& body) {
  return pool().run(workers, body);
}

int worker_threads_started() { return pool().started(); }

}  // namespace muon::detail
