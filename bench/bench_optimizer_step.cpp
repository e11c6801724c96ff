// Optimizer step time on a set of matrices (--model):
//   25m          the 25M-parameter, 32-matrix set of REFERENCE.md (d = 512,
//                8 layers; per layer 1536×512, 512×512, 2048×512, 512×2048)
//   64x128x128   64 matrices of 128×128
//   32x256x1024  32 matrices of 256×1024
// muon::Muon with fp32 and bf16 Newton–Schulz compute, torch::optim::AdamW,
// and, in the same run, the plain Python Muon step (bench/muon_step_plain.py
// with the same shapes and schedule). Synthetic fixed gradients; warm-up
// steps, then the median of timed steps.
//
// The same run also measures the machine's GEMM rate in each compute dtype,
// through the products Newton–Schulz itself uses: for every NS shape of the
// model, X ← P·X on the whole batch of that shape (s×s times s×l), and one
// 1024³ product. "NS at GEMM rate" is the step's executed Newton–Schulz
// FLOPs (muon::newton_schulz_executed_flops: each symmetric product at its
// kernel's real share of a GEMM) divided by the same-shape rate, and the
// nominal FLOPs (muon::newton_schulz_flops: a symmetric product half a GEMM)
// likewise; "share of peak" divides the executed FLOPs per second of the
// step by the highest rate measured.
//
//   bench_optimizer_step [--model 25m|64x128x128|32x256x1024] [--iters N] [--warmup N]
//                        [--threads N] [--python /usr/bin/python3]
//                        [--script bench/muon_step_plain.py] [--no-python]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/symmetric.h"
#include "newton_schulz_internal.h"
#include "muon/newton_schulz.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"
#include "muon/optim/step_guard.h"

namespace {

struct Args {
  std::string model = "25m";
  int iters = 5;
  int warmup = 1;
  int threads = 0;  // 0: LibTorch's default
  std::string python = "/usr/bin/python3";
  std::string script = "bench/muon_step_plain.py";
  bool run_python = true;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--model") {
      a.model = next();
    } else if (arg == "--iters") {
      a.iters = std::stoi(next());
    } else if (arg == "--warmup") {
      a.warmup = std::stoi(next());
    } else if (arg == "--threads") {
      a.threads = std::stoi(next());
    } else if (arg == "--python") {
      a.python = next();
    } else if (arg == "--script") {
      a.script = next();
    } else if (arg == "--no-python") {
      a.run_python = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--model 25m|64x128x128|32x256x1024] [--iters N] [--warmup N] [--threads N] [--python PATH] "
                   "[--script PATH] [--no-python]\n",
                   argv[0]);
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  return a;
}

// The matrices of `model`, (out, in) each.
std::vector<std::vector<int64_t>> shapes(const std::string& model) {
  std::vector<std::vector<int64_t>> out;
  if (model == "25m") {
    for (int layer = 0; layer < 8; ++layer) {
      for (const auto& s : std::vector<std::vector<int64_t>>{{1536, 512}, {512, 512}, {2048, 512}, {512, 2048}}) {
        out.push_back(s);
      }
    }
  } else if (model == "64x128x128") {
    out.assign(64, {128, 128});
  } else if (model == "32x256x1024") {
    out.assign(32, {256, 1024});
  } else {
    std::fprintf(stderr, "unknown --model %s (25m, 64x128x128, 32x256x1024)\n", model.c_str());
    std::exit(2);
  }
  return out;
}

double seconds_of(const std::function<void()>& f, int reps) {
  f();  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
}

// GFLOP/s of X ← P·X on `count` matrices (s×s times s×l, one product per
// matrix) in `dtype`, through the products Newton–Schulz runs on.
double gemm_rate(int64_t count, int64_t s, int64_t l, at::ScalarType dtype) {
  const auto o = at::TensorOptions().dtype(dtype);
  auto p = at::randn({count, s, s}).to(dtype);
  auto x = at::randn({count, s, l}).to(dtype);
  auto out = at::empty({count, s, l}, o);
  const double flops = 2.0 * static_cast<double>(count * s * s * l);
  const int reps = std::max<int>(3, static_cast<int>(2e9 / flops));
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const double t = seconds_of([&] { muon::detail::batched_mm_out(out, p, x); }, reps);
    best = std::max(best, flops / t / 1e9);
  }
  return best;
}

struct Model {
  std::vector<at::Tensor> params;
  int64_t numel = 0;
};

// Same values for every optimizer: parameters N(0, 0.02²), gradients N(0, 1),
// set once (the gradients stay, as after a backward pass).
Model make_model(const std::string& model) {
  at::manual_seed(0);
  Model m;
  for (const auto& s : shapes(model)) {
    auto p = at::randn(s) * 0.02;
    p.mutable_grad() = at::randn(s);
    m.numel += p.numel();
    m.params.push_back(p);
  }
  return m;
}

double median_ms(const std::function<void()>& step, const Args& args) {
  std::vector<double> ms;
  for (int i = 0; i < args.warmup + args.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    const auto stop = std::chrono::steady_clock::now();
    if (i >= args.warmup) ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

int64_t adamw_state_bytes(const torch::optim::AdamW& opt) {
  int64_t bytes = 0;
  for (const auto& item : opt.state()) {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*item.second);
    for (const auto* t : {&st.exp_avg(), &st.exp_avg_sq(), &st.max_exp_avg_sq()}) {
      if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
    }
  }
  return bytes;
}

// Runs the plain Python step; returns dtype ("fp32"/"bf16") → median ms.
std::map<std::string, double> run_python(const Args& args, int threads) {
  std::map<std::string, double> out;
  if (!std::ifstream(args.script).good()) {
    std::printf("(plain Python step skipped: %s not found; run from the source tree or pass --script)\n",
                args.script.c_str());
    return out;
  }
  std::ostringstream cmd;
  cmd << args.python << " " << args.script << " --threads " << threads << " --iters " << args.iters
      << " --warmup " << args.warmup << " --dtype both --model " << args.model;
  FILE* pipe = popen(cmd.str().c_str(), "r");
  if (pipe == nullptr) {
    std::printf("(plain Python step skipped: could not run %s)\n", cmd.str().c_str());
    return out;
  }
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    char dtype[16] = {0};
    double ms = 0;
    if (std::sscanf(line, "plain_python_muon_step %15s median_ms %lf", dtype, &ms) == 2) out[dtype] = ms;
  }
  const int rc = pclose(pipe);
  if (rc != 0 || out.size() != 2) {
    std::printf("(plain Python step failed: `%s` exited with %d)\n", cmd.str().c_str(), rc);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  if (args.threads > 0) at::set_num_threads(args.threads);
  const int threads = at::get_num_threads();
  at::NoGradGuard no_grad;

  const auto base = make_model(args.model);
  std::printf("optimizer step, model %s: %lld parameters in %zu matrices, fp32 parameters\n",
              args.model.c_str(), static_cast<long long>(base.numel), base.params.size());
  std::printf("threads %d, %d warm-up + %d timed steps, median\n\n", threads, args.warmup, args.iters);

  auto fresh = [&] {
    std::vector<at::Tensor> ps;
    for (const auto& p : base.params) {
      auto q = p.detach().clone();
      q.mutable_grad() = p.grad();
      ps.push_back(q);
    }
    return ps;
  };

  const auto muon_options = muon::MuonOptions(0.02).weight_decay(0.01);  // quintic ×5, shape_scaling
  std::map<std::string, double> ms;
  std::map<std::string, double> state_per_param;
  {
    torch::optim::AdamW opt(fresh(), torch::optim::AdamWOptions(3e-4).weight_decay(0.01));
    ms["adamw"] = median_ms([&] { opt.step(); }, args);
    state_per_param["adamw"] = static_cast<double>(adamw_state_bytes(opt)) / static_cast<double>(base.numel);
  }
  for (const auto& [name, dtype] : {std::make_pair(std::string("fp32"), at::kFloat),
                                    std::make_pair(std::string("bf16"), at::kBFloat16)}) {
    muon::Muon opt(fresh(), muon::MuonOptions(muon_options).ns_compute_dtype(dtype));
    ms["muon_" + name] = median_ms([&] { opt.step(); }, args);
    state_per_param["muon"] = static_cast<double>(opt.state_bytes()) / static_cast<double>(base.numel);
  }
  // The cost of whole-or-nothing steps (muon::set_whole_steps): the copy of
  // the stepped parameters and state before each step, on Newton–Schulz's
  // step and on an element-wise one.
  for (const bool whole : {true, false}) {
    muon::set_whole_steps(whole);
    const std::string suffix = whole ? "" : "_no_copy";
    {
      muon::Muon opt(fresh(), muon::MuonOptions(muon_options));
      ms["muon_fp32_whole" + suffix] = median_ms([&] { opt.step(); }, args);
    }
    muon::Lion opt(fresh(), muon::LionOptions(3e-4).weight_decay(0.01));
    ms["lion" + suffix] = median_ms([&] { opt.step(); }, args);
  }
  muon::set_whole_steps(true);
  std::map<std::string, double> py;
  if (args.run_python) py = run_python(args, threads);

  // GEMM rates, and the executed Newton–Schulz FLOPs of one step, per dtype.
  std::map<std::vector<int64_t>, int64_t> counts;  // (s, l) → matrices
  for (const auto& p : base.params) {
    const int64_t r = p.size(0);
    const int64_t c = p.size(1);
    ++counts[{std::min(r, c), std::max(r, c)}];
  }
  std::map<std::string, double> at_rate_ms;  // executed FLOPs at the same-shape rate
  std::map<std::string, double> nominal_at_rate_ms;  // nominal FLOPs (a SYRK half) likewise
  std::map<std::string, double> peak;
  std::map<std::string, double> flops;
  std::map<std::string, double> fp32_state_flops;
  for (const auto& [name, dtype] : {std::make_pair(std::string("fp32"), at::kFloat),
                                    std::make_pair(std::string("bf16"), at::kBFloat16)}) {
    const auto ns = muon::MuonOptions(muon_options).ns_compute_dtype(dtype).ns();
    peak[name] = gemm_rate(1, 1024, 1024, dtype);
    for (const auto& [shape, count] : counts) {
      const double rate = gemm_rate(count, shape[0], shape[1], dtype);
      peak[name] = std::max(peak[name], rate);
      const double n = static_cast<double>(count);
      const double f = n * muon::newton_schulz_executed_flops(shape[0], shape[1], ns);
      // 16-bit Gram's s×s state runs in fp32: at the fp32 rate of s×s products.
      const double f32 = n * muon::detail::executed_fp32_state_flops(shape[0], shape[1], ns);
      flops[name] += f;
      fp32_state_flops[name] += f32;
      at_rate_ms[name] += (f - f32) / rate / 1e6;
      if (f32 > 0) at_rate_ms[name] += f32 / gemm_rate(count, shape[0], shape[0], at::kFloat) / 1e6;
      nominal_at_rate_ms[name] +=
          static_cast<double>(count) * muon::newton_schulz_flops(shape[0], shape[1], ns) / rate / 1e6;
    }
  }

  const double adamw = ms["adamw"];
  auto row = [&](const char* label, double value) {
    std::printf("  %-36s %10.1f ms  %6.2fx AdamW\n", label, value, value / adamw);
  };
  row("torch::optim::AdamW", adamw);
  row("muon::Muon, NS fp32", ms["muon_fp32"]);
  row("muon::Muon, NS bf16", ms["muon_bf16"]);
  row("muon::Muon, NS fp32 (again)", ms["muon_fp32_whole"]);
  row("muon::Muon, NS fp32, whole steps off", ms["muon_fp32_whole_no_copy"]);
  row("muon::Lion", ms["lion"]);
  row("muon::Lion, whole steps off", ms["lion_no_copy"]);
  if (py.count("fp32")) row("plain Python Muon step, NS fp32", py["fp32"]);
  if (py.count("bf16")) row("plain Python Muon step, NS bf16", py["bf16"]);
  std::printf("\n");
  for (const char* d : {"fp32", "bf16"}) {
    const std::string key = std::string("muon_") + d;
    std::printf("  NS %s: executed %.3f GFLOP per step, at the same-shape GEMM rate %.1f ms: step / that "
                "= %.2fx (target <= 1.3x); nominal FLOPs (a SYRK half a GEMM) at that rate %.1f ms: "
                "%.2fx\n",
                d, flops[d] / 1e9, at_rate_ms[d], ms[key] / at_rate_ms[d], nominal_at_rate_ms[d],
                ms[key] / nominal_at_rate_ms[d]);
    // Share of peak: the time the executed FLOPs take at the peak rate of
    // their dtype (fp32 peak for 16-bit Gram's fp32 state), over the step.
    const double at_peak_ms = (flops[d] - fp32_state_flops[d]) / peak[d] / 1e6 +
                              fp32_state_flops[d] / peak["fp32"] / 1e6;
    std::printf("  NS %s: GEMM peak %.0f GFLOP/s (fp32 %.0f); the step's executed NS FLOPs "
                "(%.3f GFLOP of them fp32) take %.1f ms at peak = %.0f%% of the step (target >= "
                "80%%)\n",
                d, peak[d], peak["fp32"], fp32_state_flops[d] / 1e9, at_peak_ms,
                100.0 * at_peak_ms / ms[key]);  }
  for (const char* d : {"fp32", "bf16"}) {
    if (py.count(d)) {
      std::printf("  muon::Muon vs plain Python step, NS %s: %.2fx faster\n", d,
                  py[d] / ms[std::string("muon_") + d]);
    }
  }
  std::printf("  Muon/AdamW step ratio: %.2f (NS fp32), %.2f (NS bf16)\n", ms["muon_fp32"] / adamw,
              ms["muon_bf16"] / adamw);
  std::printf("  optimizer state bytes per parameter: muon::Muon %.2f, torch::optim::AdamW %.2f\n",
              state_per_param["muon"], state_per_param["adamw"]);
  return 0;
}
