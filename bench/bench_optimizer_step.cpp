// Optimizer step time on the 25M-parameter, 32-matrix set of REFERENCE.md
// (d = 512, 8 layers; per layer 1536×512, 512×512, 2048×512, 512×2048):
// muon::Muon with fp32 and bf16 Newton–Schulz compute, torch::optim::AdamW,
// and, in the same run, the plain Python Muon step (bench/muon_step_plain.py
// with the same shapes and schedule). Synthetic fixed gradients; warm-up
// steps, then the median of timed steps.
//
//   bench_optimizer_step [--iters N] [--warmup N] [--threads N]
//                        [--python /usr/bin/python3] [--script bench/muon_step_plain.py]
//                        [--no-python]
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

#include "muon/optim/muon.h"

namespace {

struct Args {
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
    if (arg == "--iters") {
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
                   "usage: %s [--iters N] [--warmup N] [--threads N] [--python PATH] "
                   "[--script PATH] [--no-python]\n",
                   argv[0]);
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  return a;
}

// The 32 matrices: (out, in) per layer, 8 layers.
std::vector<std::vector<int64_t>> shapes() {
  std::vector<std::vector<int64_t>> out;
  for (int layer = 0; layer < 8; ++layer) {
    for (const auto& s : std::vector<std::vector<int64_t>>{{1536, 512}, {512, 512}, {2048, 512}, {512, 2048}}) {
      out.push_back(s);
    }
  }
  return out;
}

struct Model {
  std::vector<at::Tensor> params;
  int64_t numel = 0;
};

// Same values for every optimizer: parameters N(0, 0.02²), gradients N(0, 1),
// set once (the gradients stay, as after a backward pass).
Model make_model() {
  at::manual_seed(0);
  Model m;
  for (const auto& s : shapes()) {
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
      << " --warmup " << args.warmup << " --dtype both";
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

  const auto base = make_model();
  std::printf("optimizer step, %lld parameters in %zu matrices (d=512, 8 layers), fp32 parameters\n",
              static_cast<long long>(base.numel), base.params.size());
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
  std::map<std::string, double> py;
  if (args.run_python) py = run_python(args, threads);

  const double adamw = ms["adamw"];
  auto row = [&](const char* label, double value) {
    std::printf("  %-36s %10.1f ms  %6.2fx AdamW\n", label, value, value / adamw);
  };
  row("torch::optim::AdamW", adamw);
  row("muon::Muon, NS fp32", ms["muon_fp32"]);
  row("muon::Muon, NS bf16", ms["muon_bf16"]);
  if (py.count("fp32")) row("plain Python Muon step, NS fp32", py["fp32"]);
  if (py.count("bf16")) row("plain Python Muon step, NS bf16", py["bf16"]);
  std::printf("\n");
  for (const char* d : {"fp32", "bf16"}) {
    if (py.count(d)) {
      std::printf("  muon::Muon vs plain Python step, NS %s: %.2fx faster%s\n", d,
                  py[d] / ms[std::string("muon_") + d],
                  std::strcmp(d, "bf16") == 0 ? "  (target >= 2x)" : "");
    }
  }
  std::printf("  Muon/AdamW step ratio: %.2f (NS fp32), %.2f (NS bf16)\n", ms["muon_fp32"] / adamw,
              ms["muon_bf16"] / adamw);
  std::printf("  optimizer state bytes per parameter: muon::Muon %.2f, torch::optim::AdamW %.2f\n",
              state_per_param["muon"], state_per_param["adamw"]);
  return 0;
}
