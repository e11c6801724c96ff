// muon-plan: predicts every layout's optimizer step (muon::plan) for a model
// on a machine, and measures this machine (calibrate).
//
//   muon-plan [--model gpt|PRESET|FILE.json] [--layers N --width N ...]
//             [--machine h100|gb300|FILE.json] [--world 1,2,4] [--tp N]
//             [--layout L] [--ns-dtype fp32|bf16] [--optimizer-step] [--json]
//   muon-plan calibrate [--out FILE.json] [--ranks-per-node N]
//
// docs/scale.md: what the model counts, its validation here, projections.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/optim/adamw.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <algorithm>
#include <functional>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "muon/distributed/runtime/group.h"
#include "muon/newton_schulz.h"
#include "muon/optim/muon.h"
#include "muon/plan.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s.size() > 400 ? s.substr(0, 397) + "..." : s;
}

// A model or machine file: at most muon::plan::kMaxInputBytes, read with a
// bounded read (a device or a pipe never ends); a directory is said to be one.
std::string read_file(const std::string& path, const char* flag) {
  const auto shown = path.substr(0, 200);
  std::error_code ec;
  TORCH_CHECK_VALUE(!fs::is_directory(path, ec), "[muon-plan] ", flag, " '", shown, "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), "[muon-plan] ", flag, " '", shown, "': cannot read it");
  std::string text(static_cast<size_t>(muon::plan::kMaxInputBytes) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  TORCH_CHECK_VALUE(!in.bad(), "[muon-plan] ", flag, " '", shown, "': cannot read it");
  text.resize(static_cast<size_t>(in.gcount()));
  TORCH_CHECK_VALUE(static_cast<int64_t>(text.size()) <= muon::plan::kMaxInputBytes, "[muon-plan] ", flag, " '",
                    shown, "' is larger than ", muon::plan::kMaxInputBytes, " bytes (8 MiB), more than a ",
                    flag + 2, " file holds");
  return text;
}

// A file's model or machine; its refusals name the flag and the path.
template <typename T>
T from_file(const std::string& path, const char* flag) {
  const auto text = read_file(path, flag);
  try {
    return T::from_json(text);
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "[muon-plan] ", flag, " '", path.substr(0, 200), "': ", e.what_without_backtrace());
  }
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The fastest of `reps` runs of `fn` after one warm-up: the machine's
// speed, not its load (other work on a shared machine only slows a run).
double best_seconds(const std::function<void()>& fn, int reps) {
  fn();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// The median of `reps` runs of `fn` after one warm-up (ranks measured while
// they run at once: their typical, contended speed).
double median_seconds(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Newton–Schulz FLOP/s (the library's count) on an m × 4m matrix: the
// fastest of `reps` runs, or their median.
double ns_rate(int64_t m, at::ScalarType dtype, int reps, bool median = false) {
  at::manual_seed(0);
  const auto g = at::randn({m, 4 * m});
  const auto opts = muon::NewtonSchulzOptions().compute_dtype(dtype);
  const auto once = [&] { (void)muon::newton_schulz(g, opts); };
  const double secs = median ? median_seconds(once, reps) : best_seconds(once, reps);
  return muon::newton_schulz_flops(m, 4 * m, opts) / secs;
}

// Seconds per element of Muon's element-wise work (the momentum, Nesterov
// and the update: the operations muon::Muon runs around Newton–Schulz, on
// 2M elements), and of a whole AdamW step.
std::pair<double, double> elementwise_seconds() {
  const int64_t n = 512, count = 8;
  auto p = at::randn({count, n, n});
  auto g = at::randn({count, n, n});
  auto m = at::zeros({count, n, n});
  const double muon_s = best_seconds(
      [&] {
        m.lerp_(g, 0.05);
        const auto u = g.lerp(m, 0.95);
        p.mul_(1.0 - 1e-4).add_(u, -0.01);
      },
      9);
  const double elements = static_cast<double>(count * n * n);
  auto q = at::randn({count * n * n}).requires_grad_(true);
  q.mutable_grad() = at::randn({count * n * n});
  torch::optim::AdamW adamw({q}, torch::optim::AdamWOptions(1e-3));
  const double adamw_s = best_seconds([&] { adamw.step(); }, 9);
  return {muon_s / elements, adamw_s / elements};
}

// Seconds per tensor of a Muon step and of an AdamW step beyond their
// elements (256 tiny tensors: launches and bookkeeping), and of one
// Newton–Schulz call on a tiny matrix.
struct Overheads {
  double muon_tensor_s, adamw_tensor_s, ns_call_s;
};
Overheads overheads() {
  const int64_t count = 256;
  std::vector<at::Tensor> mats, vecs;
  for (int64_t k = 0; k < count; ++k) {
    mats.push_back(at::randn({4, 8}).requires_grad_(true));
    mats.back().mutable_grad() = at::randn({4, 8});
    vecs.push_back(at::randn({8}).requires_grad_(true));
    vecs.back().mutable_grad() = at::randn({8});
  }
  const auto tiny = at::randn({4, 8});
  const double ns_s = best_seconds([&] { (void)muon::newton_schulz(tiny, muon::NewtonSchulzOptions()); }, 51);
  muon::Muon muon(mats, muon::MuonOptions(0.01));
  const double muon_s = best_seconds([&] { muon.step(); }, 15);
  torch::optim::AdamW adamw(vecs, torch::optim::AdamWOptions(1e-3));
  const double adamw_s = best_seconds([&] { adamw.step(); }, 15);
  // Muon batched the tiny matrices into one Newton–Schulz call.
  return {std::max(muon_s - ns_s, 0.0) / count, adamw_s / count, ns_s};
}

// One rank of the link measurement: two processes over a FileStore (Gloo
// over TCP on loopback, as the jobs on this machine run). The latency is an
// 8-byte all-gather's time (one hop at two ranks); the rates from 4 MiB
// collectives as the layouts issue them (an all-reduce: two hops, N bytes
// sent per rank; an all-gather: one hop, N; an all-to-all: one hop, N / 2).
muon::plan::Link link_rank(int rank, const std::string& path) {
  auto store = c10::make_intrusive<c10d::FileStore>(path, 2);
  auto group = muon::distributed::Group::create(store, rank, 2);
  const int64_t n = int64_t{1} << 20;  // floats: 4 MiB
  const double bytes = static_cast<double>(n * 4);
  auto tiny = at::zeros({1}, at::kLong);
  auto a = at::zeros({n});
  const double small = best_seconds([&] { (void)group.all_gather(tiny); }, 101);
  const double reduce = best_seconds([&] { group.all_reduce_(a); }, 9);
  const double gather = best_seconds([&] { (void)group.all_gather_async(a).wait(); }, 9);
  const std::vector<int64_t> half{n / 2, n / 2};
  const double to_all = best_seconds([&] { (void)group.all_to_all_async(a, half, half).wait(); }, 9);
  group.barrier();
  muon::plan::Link link;
  link.latency_s = small;
  link.bytes_per_s = bytes / std::max(reduce - 2 * small, 1e-9);
  link.all_gather_bytes_per_s = bytes / std::max(gather - small, 1e-9);
  link.all_to_all_bytes_per_s = bytes / 2 / std::max(to_all - small, 1e-9);
  return link;
}

muon::plan::Link measure_link() {
  char dir[] = "/tmp/muon-plan-link-XXXXXX";
  TORCH_CHECK(mkdtemp(dir) != nullptr, "[muon-plan] calibrate: cannot make a temporary directory");
  const std::string path = std::string(dir) + "/store";
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> args{self, "--link-rank", "1", path};
  std::vector<char*> argv;
  for (auto& x : args) argv.push_back(x.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  TORCH_CHECK(posix_spawn(&child, self.c_str(), nullptr, nullptr, argv.data(), environ) == 0,
              "[muon-plan] calibrate: cannot start ", self);
  muon::plan::Link link;
  try {
    link = link_rank(0, path);
  } catch (...) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    throw;
  }
  int status = 0;
  waitpid(child, &status, 0);
  fs::remove_all(dir);
  TORCH_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "[muon-plan] calibrate: the second rank failed");
  return link;
}

// One of calibrate's concurrent ranks: one thread (OMP_NUM_THREADS and
// OPENBLAS_NUM_THREADS 1, set by calibrate), each class's Newton–Schulz rate,
// fp32 then bf16, on one line of `path`.
int rank_rates(const std::string& path) {
  at::set_num_threads(1);
  // Loaded: say so, then start when every rank is (the parent's "go"), so
  // that the ranks measure while the others run.
  std::ofstream(path + ".ready") << "\n";
  const auto go = fs::path(path).parent_path() / "go";
  for (int i = 0; i < 60000 && !fs::exists(go); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int64_t sizes[muon::plan::kShapeClasses - 1] = {128, 384, 1024};
  std::ofstream out(path);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto m : sizes) out << ns_rate(m, dtype, m >= 1024 ? 5 : 15, /*median=*/true) << " ";
  }
  out << "\n";
  return out.good() ? 0 : 1;
}

// Spawns `argv` with extra environment variables; returns its pid.
pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
  std::vector<std::string> env_text(extra_env);
  for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
  std::vector<char*> env;
  for (auto& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);
  std::vector<std::string> a(args);
  std::vector<char*> argv;
  for (auto& x : a) argv.push_back(x.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  TORCH_CHECK(posix_spawn(&child, a[0].c_str(), nullptr, nullptr, argv.data(), env.data()) == 0,
              "[muon-plan] calibrate: cannot start ", a[0]);
  return child;
}

// The rates of `cores` one-thread ranks running at once (processes, as a
// job's ranks): each class's slowest rank.
void shared_rates(muon::plan::Machine& m, int64_t cores, const int64_t* sizes) {
  (void)sizes;
  char dir[] = "/tmp/muon-plan-rates-XXXXXX";
  TORCH_CHECK(mkdtemp(dir) != nullptr, "[muon-plan] calibrate: cannot make a temporary directory");
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<pid_t> children;
  for (int64_t r = 0; r < cores; ++r) {
    children.push_back(spawn({self, "--rank-rates", std::string(dir) + "/" + std::to_string(r)},
                             {"OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", "MKL_NUM_THREADS=1"}));
  }
  // Every rank loaded, then all start at once.
  for (int i = 0; i < 120000; ++i) {
    int64_t ready = 0;
    for (int64_t r = 0; r < cores; ++r) ready += fs::exists(std::string(dir) + "/" + std::to_string(r) + ".ready");
    if (ready == cores) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::ofstream(std::string(dir) + "/go") << "\n";
  bool ok = true;
  for (const auto c : children) {
    int status = 0;
    waitpid(c, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::vector<double> worst(2 * (muon::plan::kShapeClasses - 1), std::numeric_limits<double>::infinity());
  for (int64_t r = 0; ok && r < cores; ++r) {
    std::ifstream in(std::string(dir) + "/" + std::to_string(r));
    for (auto& w : worst) {
      double v = 0;
      ok = ok && static_cast<bool>(in >> v);
      w = std::min(w, v);
    }
  }
  fs::remove_all(dir);
  TORCH_CHECK(ok, "[muon-plan] calibrate: a concurrent rank failed");
  for (int c = 0; c < muon::plan::kShapeClasses; ++c) {
    const int k = std::min(c, muon::plan::kShapeClasses - 2);
    m.rank_gemm_fp32[c] = worst[static_cast<size_t>(k)];
    m.rank_gemm_bf16[c] = worst[static_cast<size_t>(muon::plan::kShapeClasses - 1 + k)];
  }
}

int calibrate(const std::string& out, int64_t ranks_per_node) {
  const int64_t cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  muon::plan::Machine m;
  m.name = "this";
  m.source = "muon-plan calibrate";
  m.cores_per_node = cores;
  m.ranks_per_node = ranks_per_node > 0 ? ranks_per_node : cores;
  const int64_t sizes[muon::plan::kShapeClasses] = {128, 384, 1024, 1024};
  std::printf("calibrating on %lld cores: Newton-Schulz FLOP/s per shape class (fp32, bf16) ...\n",
              static_cast<long long>(cores));
  std::fflush(stdout);
  at::set_num_threads(static_cast<int>(cores));
  for (int c = 0; c < muon::plan::kShapeClasses; ++c) {
    const int reps = sizes[c] >= 1024 ? 3 : 9;
    m.gemm_fp32[c] = c == 3 ? m.gemm_fp32[2] : ns_rate(sizes[c], at::kFloat, reps);
    m.gemm_bf16[c] = c == 3 ? m.gemm_bf16[2] : ns_rate(sizes[c], at::kBFloat16, reps);
  }
  // Element-wise work as a rank runs it: one LibTorch thread (the jobs'
  // default; more would contend with BLAS's spinning threads).
  at::set_num_threads(1);
  const auto [muon_s, adamw_s] = elementwise_seconds();
  m.muon_elementwise_s = muon_s;
  m.adamw_elementwise_s = adamw_s;
  const auto o = overheads();
  m.muon_tensor_s = o.muon_tensor_s;
  m.adamw_tensor_s = o.adamw_tensor_s;
  m.ns_call_s = o.ns_call_s;
  std::printf("... with %lld one-thread ranks at once ...\n", static_cast<long long>(cores));
  std::fflush(stdout);
  shared_rates(m, cores, sizes);
  m.intra = measure_link();
  m.inter = m.intra;
  m.memory_bytes = 0;
  m.overlap = 0;
  at::set_num_threads(static_cast<int>(cores));
  const auto text = m.to_json();
  if (out.empty() || out == "-") {
    std::printf("%s\n", text.c_str());
  } else {
    std::ofstream f(out);
    TORCH_CHECK_VALUE(f.good(), "[muon-plan] --out '", out.substr(0, 200), "': cannot write it");
    f << text << "\n";
    std::printf("machine written to %s\n", out.c_str());
  }
  return 0;
}

std::vector<int64_t> parse_worlds(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    TORCH_CHECK_VALUE(!item.empty() && *end == '\0' && v >= 1 && v <= (1 << 20), "[muon-plan] --world '",
                      text.substr(0, 100), "': each entry must be an integer in [1, 1048576]");
    out.push_back(v);
  }
  TORCH_CHECK_VALUE(!out.empty(), "[muon-plan] --world is empty");
  return out;
}

// The flags of a prediction (calibrate's are its own).
struct Flags {
  std::string model_name = "gpt", machine_name, worlds = "1,2,4", layout, ns_dtype = "fp32";
  int64_t layers = 4, width = 128, heads = 4, vocab = 46, context = 64, batch = 32, experts = 0, tp = 0;
  bool optimizer_step = false, as_json = false, adamw = false;
  int64_t ranks_per_node_job = 0;
  double row_fraction = 1.0;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--model", f.model_name, "gpt (muon-train-gpt's model, from the flags below), a preset (" +
                                              [] {
                                                std::string s;
                                                for (const auto& n : muon::plan::Model::preset_names()) {
                                                  s += (s.empty() ? "" : ", ") + n;
                                                }
                                                return s;
                                              }() + ") or FILE.json");
  app.add_option("--layers", f.layers, "gpt: transformer blocks");
  app.add_option("--width", f.width, "gpt: model width");
  app.add_option("--heads", f.heads, "gpt: attention heads");
  app.add_option("--vocab", f.vocab, "gpt: vocabulary (the main job's generated corpus: 46)");
  app.add_option("--context", f.context, "gpt: context length");
  app.add_option("--batch", f.batch, "gpt: sequences per step over all ranks");
  app.add_option("--experts", f.experts, "gpt: experts per block (0: dense)");
  app.add_option("--machine", f.machine_name, "h100, gb300 or FILE.json (muon-plan calibrate's); required");
  app.add_option("--world", f.worlds, "comma-separated world sizes");
  app.add_option("--tp", f.tp, "tensor-parallel size of the tp layouts (default: world for tp, 2 for tp,sharded)");
  app.add_option("--layout", f.layout, "only this layout");
  app.add_option("--ns-dtype", f.ns_dtype, "Newton-Schulz compute dtype")->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--optimizer-step", f.optimizer_step,
               "the optimizer step only (gradient reduction, optimizer, gather), without the activations' "
               "tensor-parallel all-reduces of a training step");
  app.add_option("--ranks-per-node", f.ranks_per_node_job,
                 "ranks of the job on each node (default: the machine's ranks_per_node)");
  app.add_option("--row-fraction", f.row_fraction,
                 "orthogonalize this fraction of each matrix's rows (Dion2's selection, approximately)")
      ->check(CLI::Range(1e-6, 1.0));
  app.add_flag("--adamw", f.adamw, "predict AdamW on every tensor (the baseline) instead of Muon");
  app.add_flag("--json", f.as_json, "print the predictions as JSON");
}

// Prints the predictions the flags ask for; raises c10::ValueError for bad input.
void predict_and_print(const Flags& f) {
  TORCH_CHECK_VALUE(!f.machine_name.empty(), "[muon-plan] --machine is required (h100, gb300, or a file of "
                                             "muon-plan calibrate)");
  // A name that is no preset but a path (or ends in .json) is a file.
  const auto is_file = [](const std::string& name, const std::vector<std::string>& presets) {
    std::error_code ec;
    return std::find(presets.begin(), presets.end(), name) == presets.end() &&
           (ends_with(name, ".json") || fs::exists(name, ec));
  };
  const auto machine = is_file(f.machine_name, muon::plan::Machine::preset_names())
                           ? from_file<muon::plan::Machine>(f.machine_name, "--machine")
                           : muon::plan::Machine::preset(f.machine_name);
  const auto model =
      f.model_name == "gpt"
          ? muon::plan::Model::gpt(f.layers, f.width, f.heads, f.vocab, f.context, f.batch, 4, f.experts)
      : is_file(f.model_name, muon::plan::Model::preset_names())
          ? from_file<muon::plan::Model>(f.model_name, "--model")
          : muon::plan::Model::preset(f.model_name);
  std::vector<muon::plan::Prediction> all;
  for (const auto w : parse_worlds(f.worlds)) {
    muon::plan::Options o;
    o.world = w;
    o.tp = f.tp;
    o.ns_bf16 = f.ns_dtype == "bf16";
    o.training_step = !f.optimizer_step;
    o.adamw_only = f.adamw;
    o.ranks_per_node = f.ranks_per_node_job;
    o.row_fraction = f.row_fraction;
    std::vector<muon::plan::Prediction> some;
    if (!f.layout.empty()) {
      auto p = muon::plan::predict(model, machine, muon::plan::parse_layout(f.layout), o);
      TORCH_CHECK_VALUE(p.why_not.empty(), "[muon-plan] --layout ", f.layout, " at world ", w, ": ", p.why_not);
      some.push_back(p);
    } else {
      some = muon::plan::plan(model, machine, o);
    }
    if (!f.as_json) {
      std::printf("%s on %s, world %lld (%lld parameters, %lld in Muon):\n%s", model.name.c_str(),
                  machine.name.c_str(), static_cast<long long>(w), static_cast<long long>(model.parameters()),
                  static_cast<long long>(model.muon_parameters()), muon::plan::format_table(some).c_str());
      if (f.layout.empty() && !some.empty()) {
        std::printf("recommended: %s\n\n", muon::plan::to_string(some.front().layout).c_str());
      }
    }
    all.insert(all.end(), some.begin(), some.end());
  }
  if (f.as_json) std::printf("%s\n", muon::plan::to_json(all).c_str());
}
}  // namespace

int main(int argc, char** argv) {
  // The second rank of calibrate's link measurement (started by calibrate).
  if (argc == 3 && std::string(argv[1]) == "--rank-rates") return rank_rates(argv[2]);
  if (argc == 4 && std::string(argv[1]) == "--link-rank") {
    try {
      (void)link_rank(std::atoi(argv[2]), argv[3]);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "muon-plan: link rank: %s\n", one_line(e.what()).c_str());
      return 1;
    }
  }
  CLI::App app("Predict every layout's optimizer step for a model on a machine (muon::plan).");
  Flags flags;
  add_flags(app, flags);
  auto* cal = app.add_subcommand("calibrate", "measure this machine (GEMM rates, element-wise, link) as a machine file");
  std::string out;
  int64_t ranks_per_node = 0;
  cal->add_option("--out", out, "write the machine JSON here (default: print it)");
  cal->add_option("--ranks-per-node", ranks_per_node, "ranks a job runs on this machine (default: its cores)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "muon-plan: %s\n", one_line(e.what()).c_str());
    return 1;
  }
  try {
    if (cal->parsed()) return calibrate(out, ranks_per_node);
    predict_and_print(flags);
  } catch (const std::exception& e) {
    const auto* c10 = dynamic_cast<const c10::Error*>(&e);
    std::fprintf(stderr, "muon-plan: %s\n", one_line(c10 ? c10->what_without_backtrace() : e.what()).c_str());
    return 1;
  }
  return 0;
}
