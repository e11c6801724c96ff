// muon_ns_probe: time muon::newton_schulz on one case and print one JSON line.
//
//   muon_ns_probe --shape 768x3072 --dtype fp32 [--coefficients quintic]
//                 [--steps N] [--method auto|standard|gram] [--reps 5]
//                 [--warmup 1] [--seed 0]
//
// The input is built so that Python can rebuild it bit for bit:
//
//   at::manual_seed(seed); g64 = at::randn(shape, at::kDouble); x = g64.to(dtype)
//
// and `checksum` (= g64.sum()) lets the caller check that it did. `rel_err`
// is ‖ours − ref‖_F / ‖ref‖_F against the same coefficient schedule
// evaluated plainly in fp64 on g64 (below, written out on purpose without
// any of the library's kernels). Bad flags: a message on stderr, exit 2.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "muon/newton_schulz.h"

namespace {

constexpr int kUsageError = 2;

const char* const kUsage =
    "usage: muon_ns_probe --shape ROWSxCOLS|BATCHxROWSxCOLS [--dtype fp32|bf16]\n"
    "                     [--coefficients NAME] [--steps N] [--method auto|standard|gram]\n"
    "                     [--reps N] [--warmup N] [--seed S]\n"
    "Times muon::newton_schulz on one randn input and prints one JSON line.\n";

struct UsageError {
  std::string message;
};

struct Args {
  std::vector<int64_t> shape;
  std::string shape_text;
  std::string dtype = "fp32";
  std::string coefficients = "quintic";
  int64_t steps = 0;  // 0: the set's default
  std::string method = "auto";
  int64_t reps = 5;
  int64_t warmup = 1;
  int64_t seed = 0;
};

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min_value) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    throw UsageError{flag + " expects an integer, got '" + text + "'"};
  }
  if (used != text.size()) throw UsageError{flag + " expects an integer, got '" + text + "'"};
  if (v < min_value) {
    throw UsageError{flag + " must be >= " + std::to_string(min_value) + ", got " + text};
  }
  return static_cast<int64_t>(v);
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> dims;
  std::size_t start = 0;
  while (true) {
    const auto x = text.find('x', start);
    const auto part = text.substr(start, x == std::string::npos ? std::string::npos : x - start);
    if (part.empty()) throw UsageError{"--shape: malformed '" + text + "' (want 768x3072 or 8x512x2048)"};
    dims.push_back(parse_int("--shape", part, 1));
    if (x == std::string::npos) break;
    start = x + 1;
  }
  if (dims.size() != 2 && dims.size() != 3) {
    throw UsageError{"--shape: want ROWSxCOLS or BATCHxROWSxCOLS, got '" + text + "'"};
  }
  return dims;
}

Args parse_args(int argc, char** argv) {
  Args a;
  bool have_shape = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    bool inline_value = false;
    const auto eq = flag.find('=');
    if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    if (flag == "-h" || flag == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    static const std::vector<std::string> known = {"--shape", "--dtype",  "--coefficients",
                                                   "--steps", "--method", "--reps",
                                                   "--warmup", "--seed"};
    if (std::find(known.begin(), known.end(), flag) == known.end()) {
      throw UsageError{"unknown flag '" + flag + "'"};
    }
    if (!inline_value) {
      if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
      value = argv[++i];
    }
    if (flag == "--shape") {
      a.shape = parse_shape(value);
      a.shape_text = value;
      have_shape = true;
    } else if (flag == "--dtype") {
      if (value != "fp32" && value != "bf16") {
        throw UsageError{"--dtype must be fp32 or bf16, got '" + value + "'"};
      }
      a.dtype = value;
    } else if (flag == "--coefficients") {
      a.coefficients = value;
    } else if (flag == "--steps") {
      a.steps = parse_int(flag, value, 1);
    } else if (flag == "--method") {
      if (value != "auto" && value != "standard" && value != "gram") {
        throw UsageError{"--method must be auto, standard or gram, got '" + value + "'"};
      }
      a.method = value;
    } else if (flag == "--reps") {
      a.reps = parse_int(flag, value, 1);
    } else if (flag == "--warmup") {
      a.warmup = parse_int(flag, value, 0);
    } else if (flag == "--seed") {
      a.seed = parse_int(flag, value, 0);
    }
  }
  if (!have_shape) throw UsageError{"--shape is required"};
  return a;
}

// The schedule in fp64, plainly: short side, Frobenius normalization, three
// GEMMs per step, one matrix at a time.
at::Tensor reference_fp64(const at::Tensor& g64, const std::vector<muon::NsCoefficients>& schedule,
                          double safety, double eps) {
  const bool batched = g64.dim() == 3;
  const auto g3 = batched ? g64 : g64.unsqueeze(0);
  const bool tall = g3.size(1) > g3.size(2);
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < g3.size(0); ++i) {
    auto x = g3[i];
    if (tall) x = x.t();
    x = x / (x.norm().item<double>() * safety + eps);
    for (const auto& k : schedule) {
      const auto a_mat = at::matmul(x, x.t());
      const auto b_mat = k.b * a_mat + k.c * at::matmul(a_mat, a_mat);
      x = k.a * x + at::matmul(b_mat, x);
    }
    if (tall) x = x.t();
    outs.push_back(x.contiguous());
  }
  auto out = at::stack(outs);
  return batched ? out : out.squeeze(0);
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

int run(const Args& args) {
  const auto dtype = args.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  muon::NewtonSchulzOptions options;
  try {
    options.coefficients(args.coefficients);
    if (args.steps > 0) options.steps(args.steps);
    options.method(args.method).compute_dtype(dtype);
  } catch (const c10::Error& e) {
    throw UsageError{e.what_without_backtrace()};
  }

  at::manual_seed(static_cast<uint64_t>(args.seed));
  const auto g64 = at::randn(args.shape, at::kDouble);
  const auto input = g64.to(dtype);
  const double checksum = g64.sum().item<double>();

  const int64_t rows = args.shape[args.shape.size() - 2];
  const int64_t cols = args.shape[args.shape.size() - 1];
  const int64_t batch = args.shape.size() == 3 ? args.shape[0] : 1;
  const auto resolved = muon::resolve_method(rows, cols, options);
  const double flops =
      muon::newton_schulz_plain_flops(rows, cols, options.steps()) * static_cast<double>(batch);

  at::Tensor out;
  for (int64_t i = 0; i < args.warmup; ++i) out = muon::newton_schulz(input, options);
  std::vector<double> times;
  for (int64_t i = 0; i < args.reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    out = muon::newton_schulz(input, options);
    const auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  auto sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const auto n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  const double min = sorted.front();

  const auto ref = reference_fp64(g64, options.schedule(), options.coefficients().safety_factor,
                                  options.eps());
  const auto ours64 = out.to(at::kDouble);
  const double rel_err = (ours64 - ref).norm().item<double>() / ref.norm().item<double>();
  const bool finite = ours64.isfinite().all().item<bool>();

  std::ostringstream js;
  js << "{\"shape\":" << json_string(args.shape_text) << ",\"dtype\":" << json_string(args.dtype)
     << ",\"coefficients\":" << json_string(options.coefficients().name)
     << ",\"steps\":" << options.steps() << ",\"method\":" << json_string(args.method)
     << ",\"resolved\":" << json_string(muon::to_string(resolved))
     << ",\"kernels\":" << json_string(muon::newton_schulz_cpu_kernels(options.compute_dtype())) << ",\"reps\":" << args.reps
     << ",\"warmup\":" << args.warmup << ",\"seed\":" << args.seed
     << ",\"median_s\":" << json_number(median) << ",\"min_s\":" << json_number(min)
     << ",\"times_s\":[";
  for (std::size_t i = 0; i < times.size(); ++i) js << (i ? "," : "") << json_number(times[i]);
  js << "],\"rel_err\":" << json_number(rel_err) << ",\"finite\":" << (finite ? "true" : "false")
     << ",\"flops\":" << json_number(flops) << ",\"gflops\":" << json_number(flops / median * 1e-9)
     << ",\"checksum\":" << json_number(checksum)
     << ",\"torch_threads\":" << at::get_num_threads() << "}";
  std::cout << js.str() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const UsageError& e) {
    std::cerr << "muon_ns_probe: " << e.message << "\n" << kUsage;
    return kUsageError;
  } catch (const c10::Error& e) {
    std::cerr << "muon_ns_probe: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "muon_ns_probe: error: " << e.what() << "\n";
    return 1;
  }
}
