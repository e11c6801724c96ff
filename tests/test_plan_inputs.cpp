// muon::plan and muon-plan on hostile input (issue 44): counts that would
// overflow int64, inputs that would make unbounded work, rates and
// latencies that would print inf or NaN, nonsense values, and messages that
// must name the field; then a seeded fuzz of random model and machine files
// through the API and the command: no crash, no hang, every refusal one line
// naming a field, every figure finite and non-negative.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "muon/plan.h"
#include "plan_test_util.h"
#include "train_gpt_util.h"

namespace {

using namespace plan_test;  // NOLINT(google-build-using-namespace): round_machine, predict, muon::plan's types
using json = nlohmann::json;

#define EXPECT_REFUSED(expr, ...)                                                   \
  do {                                                                              \
    const auto msg_ = error_of([&] { (void)(expr); });                              \
    EXPECT_FALSE(msg_.empty()) << #expr;                                            \
    EXPECT_EQ(msg_.find('\n'), std::string::npos) << msg_;                          \
    EXPECT_LT(msg_.size(), 400U) << msg_;                                           \
    for (const std::string part : {__VA_ARGS__}) {                                  \
      EXPECT_NE(msg_.find(part), std::string::npos) << "'" << part << "' in " << msg_; \
    }                                                                               \
  } while (0)

Model one(std::vector<int64_t> shape) {
  Model m;
  m.name = "one";
  muon::plan::Tensor t;
  t.name = "w";
  t.shape = std::move(shape);
  m.tensors = {t};
  return m;
}

const char* kMachine = R"("gemm_fp32": [1e9, 1e9, 1e9, 1e9], "gemm_bf16": [1e9, 1e9, 1e9, 1e9])";

Machine machine_with(const std::string& fields) {
  return Machine::from_json(std::string("{") + kMachine + (fields.empty() ? "" : ", ") + fields + "}");
}

// ---- int64 overflow ----

TEST(PlanInputs, ShapesWhoseElementsOverflowAreRefused) {
  // [2^32, 2^32] reported 0 parameters; [3037000500]² −9.2e18 and a
  // negative time; fp32 [2^31, 2^31] parameter_bytes −2^63.
  EXPECT_REFUSED(one({int64_t{1} << 32, int64_t{1} << 32}).parameters(), "tensor 'w'", "4294967296");
  EXPECT_REFUSED(predict(one({int64_t{1} << 32, int64_t{1} << 32}), LayoutKind::kReplicated, 1), "'w'", "shape");
  EXPECT_REFUSED(predict(one({3037000500, 3037000500}), LayoutKind::kReplicated, 1), "'w'", "3037000500");
  EXPECT_REFUSED(predict(one({int64_t{1} << 31, int64_t{1} << 31}), LayoutKind::kSharded, 2), "'w'", "2147483648");
  EXPECT_REFUSED(Model::from_json(R"({"tensors": [{"name": "w", "shape": [4294967296, 4294967296]}]})"), "'w'",
                 "shape");
}

TEST(PlanInputs, GptFlagsWhoseCountsOverflowAreRefusedByName) {
  const int64_t big = int64_t{1} << 62;
  EXPECT_REFUSED(Model::gpt(4, 128, 4, big, 64, 32), "vocab", "4611686018427387904");
  EXPECT_REFUSED(Model::gpt(4, 128, 4, 46, big, 32), "context", "4611686018427387904");
  EXPECT_REFUSED(Model::gpt(4, int64_t{1} << 32, 4, 46, 64, 32), "width", "4294967296");
  EXPECT_REFUSED(Model::gpt(4, 128, 4, 46, 64, 32, 4, int64_t{1} << 50), "experts", "1125899906842624");
  EXPECT_REFUSED(Model::gpt(100000000, 128, 4, 46, 64, 32), "layers", "100000000");
  // Each in range, the whole too large: every flag named.
  EXPECT_REFUSED(Model::gpt(100, 1 << 20, 4, 46, 64, 32), "layers 100", "width 1048576", "elements");
}

TEST(PlanInputs, ActivationBytesThatOverflowAreRefusedNotNegative) {
  // activation_elements 4e18 gave a negative bytes_sent.
  EXPECT_REFUSED(Model::from_json(R"({"tensors": [{"shape": [4, 4]}], "activation_all_reduces": 1,
                                      "activation_elements": 4e18})"),
                 "activation_elements", "4e+18");
  auto m = one({4, 4});
  m.activation_all_reduces = 1;
  m.activation_elements = int64_t{4} << 60;
  EXPECT_REFUSED(predict(m, LayoutKind::kTensorParallel, 2), "activation_elements");
  // Within range but their product with the ring too large: refused naming
  // the quantity and the world, never a wrapped count.
  m.activation_elements = int64_t{1} << 53;
  m.activation_all_reduces = int64_t{1} << 40;
  EXPECT_REFUSED(predict(m, LayoutKind::kTensorParallel, 2), "activations", "world 2", "int64");
}

// ---- unbounded work ----

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(PlanInputs, ActivationAllReducesAreMultipliedNotLooped) {
  auto m = one({4, 2});
  m.activation_all_reduces = 1000000000000000;  // 1e15: looped once each
  m.activation_elements = 8;
  Prediction p;
  EXPECT_LT(seconds_of([&] { p = predict(m, LayoutKind::kTensorParallel, 2); }), 1.0);
  // Each all-reduce of 8 floats at 2 ranks sends 32 bytes.
  int64_t bytes = -1;
  for (const auto& c : p.collectives) {
    if (c.what == "activations all-reduce (TP)") bytes = c.bytes;
  }
  EXPECT_EQ(bytes, 32 * m.activation_all_reduces);
}

TEST(PlanInputs, AMillionRanksAreRefusedByNameAtOnce) {
  // The TP layouts did world² work at --world 1048576; the planner's work,
  // tensors × world, is bounded (2^18) and refused by name beyond.
  for (const auto layout : muon::plan::all_layouts()) {
    std::string msg;
    const double s = seconds_of([&] { msg = error_of([&] { (void)predict(one({64, 64}), layout, 1 << 20); }); });
    EXPECT_LT(s, 1.0) << muon::plan::to_string(layout);
    EXPECT_NE(msg.find("world 1048576"), std::string::npos) << msg;
  }
  // Within the bound, the TP layout at 2^18 ranks finishes quickly.
  Prediction p;
  EXPECT_LT(seconds_of([&] { p = predict(one({64, 64}), LayoutKind::kTensorParallel, 1 << 18); }), 1.0);
  EXPECT_EQ(p.tp, 1 << 18);
  const auto gpt = Model::gpt(4, 128, 4, 46, 64, 32);
  EXPECT_REFUSED(predict(gpt, LayoutKind::kTensorParallel, 1 << 20), "world 1048576", "tensors");
}

TEST(PlanInputs, CountsAndLayersThatWouldExhaustMemoryAreRefused) {
  EXPECT_REFUSED(Model::from_json(R"({"tensors": [{"name": "w", "shape": [4], "count": 1e12}]})"), "'w'", "count",
                 "1000000000000");
  EXPECT_REFUSED(Model::from_json(R"({"tensors": [{"name": "w", "shape": [4], "count": 200000},
                                                   {"name": "v", "shape": [4], "count": 200000}]})"),
                 "'v'", "count");
  EXPECT_REFUSED(Model::from_json(std::string(9 << 20, ' ')), "the model", "8388608");
  EXPECT_REFUSED(Model::from_json(std::string(100000, '[') + std::string(100000, ']')), "the model", "deeper");
}

// ---- inf and NaN ----

TEST(PlanInputs, RatesAndLatenciesThatWouldPrintInfAreRefusedByName) {
  EXPECT_REFUSED(machine_with(R"("intra": {"latency_s": 1e308})"), "intra.latency_s", "1e+308");
  EXPECT_REFUSED(machine_with(R"("inter": {"bytes_per_s": 1e-310})"), "inter.bytes_per_s");
  EXPECT_REFUSED(Machine::from_json(R"({"gemm_fp32": [1e-310, 1, 1, 1], "gemm_bf16": [1, 1, 1, 1]})"),
                 "gemm_fp32[0]");
  auto machine = round_machine();
  machine.intra.latency_s = 1e308;
  Options o;
  o.world = 2;
  EXPECT_REFUSED(muon::plan::predict(one({4, 4}), machine, LayoutKind::kReplicated, o), "intra.latency_s");
  machine = round_machine();
  machine.muon_elementwise_s = std::nan("");
  EXPECT_REFUSED(muon::plan::predict(one({4, 4}), machine, LayoutKind::kReplicated, o), "muon_elementwise_s");
}

// ---- nonsense ----

TEST(PlanInputs, NonsenseIsRefusedNotDefaulted) {
  EXPECT_REFUSED(predict(one({4, 4}), LayoutKind::kTensorParallel, 4, -1), "tp", "-1");
  Options o;
  o.world = 4;
  o.ranks_per_node = -1;
  EXPECT_REFUSED(muon::plan::predict(one({4, 4}), round_machine(), LayoutKind::kReplicated, o), "ranks_per_node",
                 "-1");
  EXPECT_REFUSED(machine_with(R"("memory_bytes": -8e10)"), "memory_bytes", "-8e+10");
  EXPECT_REFUSED(Model::from_json(R"({"tensors": [{"shape": [4]}], "train_flops_per_s": -1e15})"),
                 "train_flops_per_s");
  EXPECT_REFUSED(Model::from_json(R"({"tensors": [{"name": "w", "shape": [16.5, 4]}]})"), "'w'", "shape[0]", "16.5");
  const auto msg = error_of([] { Model::from_json(R"({"tensors": [{"name": "w", "shape": [4], "count": 1e30}]})"); });
  EXPECT_NE(msg.find("1e+30"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("-9223372036854775808"), std::string::npos) << msg;
  // An integral number written as a float is still a count.
  EXPECT_EQ(Model::from_json(R"({"tensors": [{"shape": [16.0, 4]}]})").tensors[0].shape[0], 16);
}

// ---- messages name the field ----

TEST(PlanInputs, MachineRefusalsNameTheField) {
  // "a field is out of range" named none.
  EXPECT_REFUSED(machine_with(R"("overlap": 2)"), "overlap", "2");
  EXPECT_REFUSED(machine_with(R"("ranks_per_node": 0)"), "ranks_per_node", "0");
  EXPECT_REFUSED(machine_with(R"("cores_per_node": -3)"), "cores_per_node", "-3");
  EXPECT_REFUSED(machine_with(R"("ns_call_s": -1)"), "ns_call_s", "-1");
  // A negative all_gather_bytes_per_s was reported as bytes_per_s.
  EXPECT_REFUSED(machine_with(R"("intra": {"all_gather_bytes_per_s": -5})"), "intra.all_gather_bytes_per_s", "-5");
  EXPECT_REFUSED(machine_with(R"("inter": {"all_to_all_bytes_per_s": "fast"})"), "inter.all_to_all_bytes_per_s",
                 "fast");
  EXPECT_REFUSED(machine_with(R"("ranks_per_node": 2.5)"), "ranks_per_node", "2.5");
}

// ---- the command ----

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

// muon-plan with `args`, killed after `limit` seconds (status 124): a
// guard against hangs and unbounded reads (/dev/zero), far above the
// program's own time (about 0.7 s of CPU, most of it loading LibTorch, so
// that a busy 2-core machine already takes 2 s).
train_gpt_test::Output run_plan(const std::string& args, int limit = 20) {
  return train_gpt_test::run_program_command("timeout " + std::to_string(limit) + " " + MUON_PLAN_BIN + " " + args);
}

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("muon_plan_inputs_" + std::to_string(getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

void expect_one_line_naming(const train_gpt_test::Output& r, const std::vector<std::string>& parts) {
  EXPECT_EQ(r.status, 1) << r.text;
  EXPECT_EQ(std::count(r.text.begin(), r.text.end(), '\n'), 1) << r.text;
  for (const auto& p : parts) EXPECT_NE(r.text.find(p), std::string::npos) << "'" << p << "' in " << r.text;
}

TEST(PlanInputsCommand, BadFlagsAndFilesAreOneLineNamingThem) {
  const TempDir dir;
  const auto folder = (dir.path / "model.json").string();
  std::filesystem::create_directories(folder);
  expect_one_line_naming(run_plan("--machine h100 --tp -1 --world 4"), {"tp", "-1"});
  expect_one_line_naming(run_plan("--machine h100 --ranks-per-node -1"), {"ranks_per_node", "-1"});
  expect_one_line_naming(run_plan("--machine h100 --vocab 4611686018427387904"), {"vocab", "4611686018427387904"});
  expect_one_line_naming(run_plan("--machine h100 --layers 100000000"), {"layers", "100000000"});
  expect_one_line_naming(run_plan("--machine h100 --model " + folder), {folder, "directory"});
  expect_one_line_naming(run_plan("--machine h100 --model /dev/zero"), {"/dev/zero", "8388608"});
  const auto machine = dir.write("m.json", std::string("{") + kMachine + R"(, "memory_bytes": -8e10})");
  expect_one_line_naming(run_plan("--machine " + machine), {machine, "memory_bytes", "-8e+10"});
  const auto model = dir.write("c.json", R"({"tensors": [{"name": "w", "shape": [4], "count": 1e30}]})");
  expect_one_line_naming(run_plan("--machine h100 --model " + model), {model, "count", "1e+30"});
  // A million ranks: refused by name within the second (it never finished).
  expect_one_line_naming(run_plan("--machine h100 --world 1048576 --layout tp"), {"world 1048576"});
  const auto small = dir.write("s.json", R"({"tensors": [{"shape": [64, 64], "split": "rows"}]})");
  expect_one_line_naming(run_plan("--machine h100 --model " + small + " --world 1048576 --layout tp"),
                         {"world 1048576"});
}

// ---- the fuzz ----

// Values a careless or hostile file holds.
json wild(std::mt19937_64& rng) {
  static const std::vector<json> pool = {
      json(0), json(-1), json(1), json(2), json(3), json(16.5), json(-8e10), json(1e30), json(1e308),
      json(1e-310), json(4e18), json(int64_t{1} << 31), json(int64_t{1} << 32), json(int64_t{1} << 62),
      json(uint64_t{1} << 63), json(std::numeric_limits<int64_t>::min()), json("abc"), json(true), json(nullptr),
      json::array(), json::object(), json::array({1, 2}), json(0.5), json(1e-9), json(1e15), json(100000000)};
  return pool[rng() % pool.size()];
}

bool chance(std::mt19937_64& rng, int percent) { return static_cast<int>(rng() % 100) < percent; }

json sane_or_wild(std::mt19937_64& rng, json sane) { return chance(rng, 96) ? sane : wild(rng); }

json random_model(std::mt19937_64& rng) {
  json m = json::object();
  if (chance(rng, 50)) m["name"] = sane_or_wild(rng, "fuzz");
  json tensors = json::array();
  const int n = 1 + static_cast<int>(rng() % 5);
  for (int i = 0; i < n; ++i) {
    json t = json::object();
    if (chance(rng, 95)) {
      json shape = json::array();
      const int dims = 1 + static_cast<int>(rng() % 3);
      for (int d = 0; d < dims; ++d) shape.push_back(sane_or_wild(rng, 1 + static_cast<int64_t>(rng() % 96)));
      t["shape"] = chance(rng, 95) ? shape : wild(rng);
    }
    if (chance(rng, 30)) t["route"] = sane_or_wild(rng, chance(rng, 50) ? "muon" : "adamw");
    if (chance(rng, 30)) t["split"] = sane_or_wild(rng, chance(rng, 50) ? "rows" : "cols");
    if (chance(rng, 30)) t["count"] = sane_or_wild(rng, 1 + static_cast<int64_t>(rng() % 8));
    if (chance(rng, 20)) t["dtype_bytes"] = sane_or_wild(rng, 2);
    if (chance(rng, 10)) t["expert"] = sane_or_wild(rng, true);
    tensors.push_back(chance(rng, 97) ? t : wild(rng));
  }
  m["tensors"] = chance(rng, 97) ? tensors : wild(rng);
  for (const char* key : {"activation_all_reduces", "activation_elements", "train_flops", "train_flops_per_s",
                          "expert_data_parallel", "pipeline_stages"}) {
    if (chance(rng, 25)) m[key] = sane_or_wild(rng, 1 + static_cast<int64_t>(rng() % 1000));
  }
  return m;
}

json random_machine(std::mt19937_64& rng) {
  json m = json::object();
  for (const char* key : {"gemm_fp32", "gemm_bf16", "rank_gemm_fp32", "rank_gemm_bf16"}) {
    if (std::string(key).rfind("rank", 0) == 0 && chance(rng, 60)) continue;
    json rates = json::array();
    for (int c = 0; c < 4; ++c) rates.push_back(sane_or_wild(rng, 1e9 * static_cast<double>(1 + rng() % 100)));
    m[key] = chance(rng, 95) ? rates : wild(rng);
  }
  for (const char* key : {"muon_elementwise_s", "adamw_elementwise_s", "muon_tensor_s", "adamw_tensor_s",
                          "ns_call_s", "overlap"}) {
    if (chance(rng, 30)) m[key] = sane_or_wild(rng, 1e-9 * static_cast<double>(rng() % 100));
  }
  if (chance(rng, 30)) m["memory_bytes"] = sane_or_wild(rng, 1e9);
  if (chance(rng, 30)) m["ranks_per_node"] = sane_or_wild(rng, 1 + static_cast<int64_t>(rng() % 8));
  if (chance(rng, 20)) m["cores_per_node"] = sane_or_wild(rng, static_cast<int64_t>(rng() % 8));
  for (const char* key : {"intra", "inter"}) {
    if (!chance(rng, 60)) continue;
    json link = json::object();
    for (const char* f : {"latency_s", "bytes_per_s", "all_gather_bytes_per_s", "all_to_all_bytes_per_s"}) {
      if (chance(rng, 50)) link[f] = sane_or_wild(rng, std::string(f) == "latency_s" ? 1e-5 : 1e10);
    }
    m[key] = chance(rng, 95) ? link : wild(rng);
  }
  return m;
}

// A refusal names one of the fields (or the JSON it could not read).
bool names_a_field(const std::string& msg) {
  static const char* fields[] = {
      "'name'", "tensors", "shape", "route", "split", "count", "expert", "dtype_bytes", "activation_all_reduces",
      "activation_elements", "train_flops", "pipeline_stages", "gemm_fp32", "gemm_bf16", "rank_gemm_fp32",
      "rank_gemm_bf16", "elementwise_s", "tensor_s", "ns_call_s", "memory_bytes", "ranks_per_node",
      "cores_per_node", "overlap", "intra", "inter", "world", "tp", "JSON", "description", "source"};
  for (const auto* f : fields) {
    if (msg.find(f) != std::string::npos) return true;
  }
  return false;
}

void expect_figures_sane(const json& p, const std::string& context) {
  for (const char* key : {"step_s", "newton_schulz_s", "newton_schulz_flops", "elementwise_s", "communication_s",
                          "bytes_sent", "state_bytes", "parameter_bytes", "gradient_bytes", "adamw_step_s",
                          "vs_adamw", "adamw_bytes_sent", "adamw_state_bytes", "train_s", "share_of_training",
                          "iteration_ratio"}) {
    const auto& v = p.at(key);
    ASSERT_TRUE(v.is_number()) << key << " = " << v.dump() << "\n" << context;  // NaN and inf print as null
    EXPECT_TRUE(std::isfinite(v.get<double>()) && v.get<double>() >= 0) << key << " = " << v.dump() << "\n" << context;
  }
  ASSERT_TRUE(p.at("throughput_cost").is_number()) << context;
  for (const auto& b : p.at("bytes_per_rank")) EXPECT_GE(b.get<int64_t>(), 0) << context;
  for (const auto& c : p.at("collectives")) {
    for (const char* key : {"bytes", "calls", "seconds"}) {
      ASSERT_TRUE(c.at(key).is_number()) << context;
      EXPECT_GE(c.at(key).get<double>(), 0) << context;
    }
  }
}

// Text of a random file: the JSON, sometimes cut short.
std::string text_of(const json& j, std::mt19937_64& rng) {
  auto text = j.dump();
  if (chance(rng, 5)) text.resize(rng() % (text.size() + 1));
  return text;
}

TEST(PlanInputsFuzz, RandomModelsAndMachinesThroughTheApi) {
  std::mt19937_64 rng(44);
  int refused = 0, planned = 0;
  for (int k = 0; k < 400; ++k) {
    const auto model_text = text_of(random_model(rng), rng);
    const auto machine_text = text_of(random_machine(rng), rng);
    Options o;
    const int64_t worlds[] = {1, 2, 3, 4, 8, 64, 1024, 1 << 20};
    o.world = worlds[rng() % 8];
    o.tp = chance(rng, 80) ? 0 : static_cast<int64_t>(rng() % 5) - 1;
    const auto context = "model " + model_text + "\nmachine " + machine_text + "\nworld " + std::to_string(o.world);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const auto model = Model::from_json(model_text);
      const auto machine = Machine::from_json(machine_text);
      const auto all = muon::plan::plan(model, machine, o);
      ++planned;
      for (const auto& p : json::parse(muon::plan::to_json(all))) expect_figures_sane(p, context);
    } catch (const c10::ValueError& e) {
      ++refused;
      const std::string msg = e.what_without_backtrace();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg << "\n" << context;
      EXPECT_LT(msg.size(), 400U) << msg;
      EXPECT_TRUE(names_a_field(msg)) << msg << "\n" << context;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a refusal: " << e.what() << "\n" << context;
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0) << context;
    if (HasFailure()) break;
  }
  // The generator reaches both sides.
  EXPECT_GT(refused, 40);
  EXPECT_GT(planned, 40);
}

TEST(PlanInputsFuzz, RandomFilesThroughTheCommand) {
  const TempDir dir;
  std::mt19937_64 rng(4444);
  for (int k = 0; k < 8; ++k) {
    const auto model = dir.write("model.json", text_of(random_model(rng), rng));
    const auto machine = dir.write("machine.json", text_of(random_machine(rng), rng));
    const auto r = run_plan("--model " + shell_quote(model) + " --machine " + shell_quote(machine) +
                            " --world 1,4 --json");
    std::ifstream a(model), b(machine);
    std::stringstream context;
    context << "model " << a.rdbuf() << "\nmachine " << b.rdbuf() << "\n" << r.text;
    ASSERT_TRUE(r.status == 0 || r.status == 1) << "status " << r.status << "\n" << context.str();
    if (r.status == 1) {
      EXPECT_EQ(std::count(r.text.begin(), r.text.end(), '\n'), 1) << context.str();
      EXPECT_TRUE(names_a_field(r.text)) << context.str();
      continue;
    }
    const auto j = json::parse(r.text);
    for (const auto& p : j) expect_figures_sane(p, context.str());
  }
}

}  // namespace
