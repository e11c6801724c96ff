// What one process (a rank) sees of its threads: the thread variables of
// its environment, LibTorch's intra-op count and the BLAS pool's size, for
// the tests of muon-launch and of muon::detail::align_blas_threads.
//
//   env_check [--torch-threads N | --align | --join]...
//
// Prints "start <state>" first, then one line per argument, in order:
// --torch-threads N calls at::set_num_threads(N) ("torch-threads <state>");
// --align calls align_blas_threads ("aligned <state>"); --join calls
// muon::distributed::init_from_env() with default options ("joined rank R of W
// <state>"). <state> is "omp=.. openblas=.. mkl=.. torch=.. blas=..": the
// variables OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS ("unset"
// when unset), at::get_num_threads(), and openblas_get_num_threads() found
// at run time ("none" without OpenBLAS). An exception prints
// "error: <what()>" on stderr and exits with 1.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "muon/distributed/runtime/group.h"
#include "util/threads.h"

namespace {

std::string var(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "unset";
}

std::string blas_threads() {
  using GetThreads = int (*)();
  const auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get != nullptr ? std::to_string(get()) : "none";
}

void print(const std::string& what) {
  std::printf("%s omp=%s openblas=%s mkl=%s torch=%d blas=%s\n", what.c_str(),
              var("OMP_NUM_THREADS").c_str(), var("OPENBLAS_NUM_THREADS").c_str(),
              var("MKL_NUM_THREADS").c_str(), at::get_num_threads(), blas_threads().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    print("start");
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--torch-threads" && i + 1 < argc) {
        at::set_num_threads(std::atoi(argv[++i]));
        print("torch-threads");
      } else if (a == "--align") {
        muon::detail::align_blas_threads();
        print("aligned");
      } else if (a == "--join") {
        const auto world = muon::distributed::init_from_env();
        print("joined rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()));
      } else {
        std::fprintf(stderr, "env_check: unknown argument '%s'\n", a.c_str());
        return 2;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
