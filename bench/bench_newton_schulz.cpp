// Google Benchmark for muon::newton_schulz.
//
// Families (names are <family>/<method>/<dtype>/<shape>):
//
//   NS/...          methods {standard, gram, auto, standard_nosym} × shapes ×
//                   compute dtypes {fp32, bf16}
//   AspectSweep/... s = 512, l/s in {1, 1.5, 2, 2.5, 3, 4, 6}, standard vs
//                   gram, fp32 and bf16: where Gram Newton–Schulz starts to
//                   pay (kGramMinAspect in muon/newton_schulz.h)
//
// Every benchmark reports real time per call and a counter GFLOP/s =
// newton_schulz_plain_flops(rows, cols, steps) · batch / time: the same
// numerator for every method ("equivalent plain FLOPs per second"), so a
// method that does fewer FLOPs shows a higher rate.
//
// Build:  cmake -S . -B build -G Ninja && ninja -C build bench_newton_schulz
// Run:    build/bench/bench_newton_schulz [--benchmark_filter=REGEX]
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "muon/newton_schulz.h"

namespace {

constexpr double kMinTime = 0.5;        // seconds of timed calls per benchmark
constexpr double kMinWarmUpTime = 0.1;  // seconds of untimed calls first

struct Shape {
  int64_t batch;  // 0: a single 2-D matrix
  int64_t rows;
  int64_t cols;
};

std::string shape_name(const Shape& s) {
  std::ostringstream os;
  if (s.batch > 0) os << s.batch << "x";
  os << s.rows << "x" << s.cols;
  return os.str();
}

struct Method {
  std::string name;
  muon::NewtonSchulzMethod method;
  bool symmetric;
};

struct DType {
  std::string name;
  at::ScalarType type;
};

void run_ns(benchmark::State& state, const Shape& shape, const Method& method, const DType& dtype) {
  try {
    at::manual_seed(0);
    std::vector<int64_t> sizes;
    if (shape.batch > 0) sizes.push_back(shape.batch);
    sizes.push_back(shape.rows);
    sizes.push_back(shape.cols);
    // The input arrives in the compute dtype (as in an optimizer whose
    // momentum buffer is kept there), so no conversion cost hides in it.
    const auto x = at::randn(sizes, at::kFloat).to(dtype.type);
    auto options = muon::NewtonSchulzOptions()
                       .compute_dtype(dtype.type)
                       .method(method.method)
                       .symmetric(method.symmetric);
    const auto resolved = muon::resolve_method(shape.rows, shape.cols, options);
    const int64_t batch = shape.batch > 0 ? shape.batch : 1;
    const double flops =
        muon::newton_schulz_plain_flops(shape.rows, shape.cols, options.steps()) *
        static_cast<double>(batch);

    // One explicit warm-up call (allocator, thread pool, BLAS buffers) on
    // top of MinWarmUpTime.
    {
      auto y = muon::newton_schulz(x, options);
      benchmark::DoNotOptimize(y.data_ptr());
    }
    for (auto _ : state) {
      auto y = muon::newton_schulz(x, options);
      benchmark::DoNotOptimize(y.data_ptr());
      benchmark::ClobberMemory();
    }
    // kIsIterationInvariantRate: flops · iterations / seconds, where the
    // seconds are real time because the benchmark uses UseRealTime().
    state.counters["GFLOP/s"] =
        benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["plain_GFLOP"] = benchmark::Counter(flops * 1e-9);
    state.counters["method_GFLOP"] = benchmark::Counter(
        muon::newton_schulz_flops(shape.rows, shape.cols, options) * static_cast<double>(batch) *
        1e-9);
    state.SetLabel(method.name == "auto" ? "auto->" + muon::to_string(resolved)
                                         : muon::to_string(resolved));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_one(const std::string& name, const Shape& shape, const Method& method,
                  const DType& dtype) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [shape, method, dtype](benchmark::State& state) {
                                 run_ns(state, shape, method, dtype);
                               })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(kMinTime)
      ->MinWarmUpTime(kMinWarmUpTime);
}

void register_all() {
  const std::vector<DType> dtypes = {{"fp32", at::kFloat}, {"bf16", at::kBFloat16}};
  const std::vector<Method> methods = {
      {"standard", muon::NewtonSchulzMethod::kStandard, true},
      {"gram", muon::NewtonSchulzMethod::kGram, true},
      {"auto", muon::NewtonSchulzMethod::kAuto, true},
      {"standard_nosym", muon::NewtonSchulzMethod::kStandard, false},
  };
  const std::vector<Shape> shapes = {
      {0, 256, 1024},  {0, 512, 512},   {0, 1024, 256},  {0, 768, 3072},
      {0, 1024, 4096}, {0, 2048, 2048}, {0, 4096, 1024}, {8, 512, 2048},
  };
  for (const auto& dtype : dtypes) {
    for (const auto& shape : shapes) {
      for (const auto& method : methods) {
        register_one("NS/" + method.name + "/" + dtype.name + "/" + shape_name(shape), shape,
                     method, dtype);
      }
    }
  }

  // Aspect sweep: wide s×l with s = 512 and l = s·ratio.
  constexpr int64_t s = 512;
  const std::vector<std::pair<std::string, int64_t>> aspects = {
      {"1", s}, {"1.5", 3 * s / 2}, {"2", 2 * s}, {"2.5", 5 * s / 2},
      {"3", 3 * s}, {"4", 4 * s}, {"6", 6 * s},
  };
  const std::vector<Method> sweep_methods = {methods[0], methods[1]};
  for (const auto& dtype : dtypes) {
    for (const auto& [ratio, l] : aspects) {
      for (const auto& method : sweep_methods) {
        const Shape shape{0, s, l};
        register_one("AspectSweep/" + method.name + "/" + dtype.name + "/aspect" + ratio + "/" +
                         shape_name(shape),
                     shape, method, dtype);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("torch_num_threads", std::to_string(at::get_num_threads()));
  benchmark::AddCustomContext("muon_kGramMinAspect", std::to_string(muon::kGramMinAspect));
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
