// muon::plan's model and machine files (Model::from_json,
// Machine::from_json): each field read by a reader that names it, refusing
// a wrong type, a fraction where a count belongs, or a value out of range
// (plan_checks.h) in one line with the value as the file gives it.
#include <c10/util/Exception.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "muon/plan.h"
#include "plan_checks.h"

namespace muon::plan {
namespace {

using json = nlohmann::json;
using detail::shown;
constexpr const char* kWho = "[muon::plan] ";
// Nesting deeper than this is no model or machine (and would recurse).
constexpr int kMaxDepth = 32;

// The deepest nesting of arrays and objects in `text` (strings skipped).
int nesting(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      in_string = !(c == '"' && !escaped);
      escaped = c == '\\' && !escaped;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

json parse(const std::string& text, const char* what) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(text.size()) <= kMaxInputBytes, kWho, what, " is ", text.size(),
                    " bytes, more than ", kMaxInputBytes);
  TORCH_CHECK_VALUE(nesting(text) <= kMaxDepth, kWho, what, " nests arrays and objects deeper than ", kMaxDepth);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, kWho, what, " is not valid JSON: ", shown(e.what()));
  }
}

// The field `key` of object `j` as `where` names it.
struct Field {
  const json& j;
  const std::string& where;
  std::string key;
  std::string label = "";  // the key as messages name it (default: key)

  std::string name() const { return label.empty() ? key : label; }

  bool given() const { return j.contains(key); }
  const json& value() const { return j.at(key); }
  [[noreturn]] void refuse(const char* wanted) const {
    const auto& v = value();
    TORCH_CHECK_VALUE(false, kWho, where, "'", name(), "' must be ", wanted, ", got ",
                      v.is_string() ? "'" + shown(v.get<std::string>()) + "'" : shown(v.dump()));
  }

  std::string text(const std::string& fallback) const {
    if (!given()) return fallback;
    if (!value().is_string()) refuse("a string");
    return value().get<std::string>();
  }
  bool boolean(bool fallback) const {
    if (!given()) return fallback;
    if (!value().is_boolean()) refuse("true or false");
    return value().get<bool>();
  }
  // Any finite number; check_model / check_machine bound it.
  double number(double fallback) const { return given() ? number_of(value()) : fallback; }
  double number_of(const json& v) const {
    if (!v.is_number()) {
      TORCH_CHECK_VALUE(false, kWho, where, "'", name(), "' must be a number, got ", shown(v.dump()));
    }
    return v.get<double>();
  }
  int64_t integer(int64_t fallback, int64_t lo, int64_t hi) const {
    return given() ? integer_of(value(), name(), lo, hi) : fallback;
  }
  // A JSON integer, or a number with an integral value, in [lo, hi].
  int64_t integer_of(const json& v, const std::string& name, int64_t lo, int64_t hi) const {
    bool ok = false;
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      ok = v.get<uint64_t>() <= static_cast<uint64_t>(hi);
      x = ok ? static_cast<int64_t>(v.get<uint64_t>()) : 0;
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
      ok = true;
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      ok = std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(lo) && d <= static_cast<double>(hi);
      x = ok ? static_cast<int64_t>(d) : 0;
    }
    TORCH_CHECK_VALUE(ok && x >= lo && x <= hi, kWho, where, "'", name, "' must be an integer in [", lo, ", ", hi,
                      "], got ", shown(v.dump()));
    return x;
  }
};

Route parse_route(const Field& f, bool matrix) {
  const auto s = f.text(matrix ? "muon" : "adamw");
  if (s == "muon") return Route::kMuon;
  if (s == "adamw") return Route::kAdamW;
  f.refuse("'muon' or 'adamw'");
}

Split parse_split(const Field& f) {
  const auto s = f.text("none");
  if (s == "none") return Split::kNone;
  if (s == "rows") return Split::kRows;
  if (s == "cols") return Split::kCols;
  f.refuse("'none', 'rows' or 'cols'");
}

// tensors[index]; `total`: the model's tensors so far, counts included.
void read_tensor(const json& t, size_t index, Model& m, int64_t& total) {
  const auto at = "tensors[" + std::to_string(index) + "]: ";
  TORCH_CHECK_VALUE(t.is_object(), kWho, at, "each tensor must be an object, got ", shown(t.dump()));
  Tensor x;
  x.name = Field{t, at, "name"}.text("tensor" + std::to_string(index));
  const auto where = "tensor '" + shown(x.name) + "' (" + at.substr(0, at.size() - 2) + "): ";
  const Field shape{t, where, "shape"};
  TORCH_CHECK_VALUE(shape.given(), kWho, where, "'shape' is missing");
  if (!shape.value().is_array() || shape.value().empty()) shape.refuse("a non-empty array of sizes");
  for (size_t d = 0; d < shape.value().size(); ++d) {
    x.shape.push_back(shape.integer_of(shape.value()[d], "shape[" + std::to_string(d) + "]", 1, detail::kMaxElements));
  }
  x.route = parse_route(Field{t, where, "route"}, x.shape.size() >= 2);
  x.split = parse_split(Field{t, where, "split"});
  x.expert = Field{t, where, "expert"}.boolean(false);
  x.dtype_bytes = Field{t, where, "dtype_bytes"}.integer(4, 2, 8);
  TORCH_CHECK_VALUE(x.dtype_bytes == 2 || x.dtype_bytes == 4 || x.dtype_bytes == 8, kWho, where,
                    "'dtype_bytes' must be 2, 4 or 8, got ", x.dtype_bytes);
  const auto count = Field{t, where, "count"}.integer(1, 1, detail::kMaxTensors);
  TORCH_CHECK_VALUE(count <= detail::kMaxTensors - total, kWho, where, "'count' ", count, " takes the model past ",
                    detail::kMaxTensors, " tensors");
  total += count;
  for (int64_t k = 0; k < count; ++k) {
    m.tensors.push_back(x);
    if (count > 1) m.tensors.back().name += "." + std::to_string(k);
  }
}

}  // namespace

Model Model::from_json(const std::string& text) {
  const auto j = parse(text, "the model");
  TORCH_CHECK_VALUE(j.is_object() && j.contains("tensors") && j.at("tensors").is_array(), kWho,
                    "the model must be an object with a 'tensors' array");
  const std::string top = "model: ";
  Model m;
  m.name = Field{j, top, "name"}.text("model");
  const auto where = "model '" + shown(m.name) + "': ";
  m.description = Field{j, where, "description"}.text("");
  int64_t total = 0;
  for (size_t i = 0; i < j.at("tensors").size(); ++i) read_tensor(j.at("tensors")[i], i, m, total);
  m.activation_all_reduces = Field{j, where, "activation_all_reduces"}.integer(0, 0, detail::kMaxCount);
  m.activation_elements = Field{j, where, "activation_elements"}.integer(0, 0, detail::kMaxCount);
  m.train_flops = Field{j, where, "train_flops"}.number(0.0);
  m.train_flops_per_s = Field{j, where, "train_flops_per_s"}.number(0.0);
  m.expert_data_parallel = Field{j, where, "expert_data_parallel"}.integer(0, 0, 1);
  m.pipeline_stages = Field{j, where, "pipeline_stages"}.integer(1, 1, detail::kMaxRanks);
  detail::check_model(m);
  return m;
}

Machine Machine::from_json(const std::string& text) {
  const auto j = parse(text, "the machine");
  TORCH_CHECK_VALUE(j.is_object(), kWho, "the machine must be a JSON object");
  Machine m;
  const std::string top = "machine: ";
  m.name = Field{j, top, "name"}.text("machine");
  const auto where = "machine '" + shown(m.name) + "': ";
  m.source = Field{j, where, "source"}.text("");
  const auto rates = [&](const char* key, double* out, bool required) {
    const Field f{j, where, key};
    if (!f.given() && !required) return;
    TORCH_CHECK_VALUE(f.given(), kWho, where, "'", key, "' is missing (", kShapeClasses,
                      " FLOP/s: m <= 128, 512, 2048, more)");
    if (!f.value().is_array() || f.value().size() != kShapeClasses) f.refuse("an array of 4 FLOP/s");
    for (int c = 0; c < kShapeClasses; ++c) out[c] = f.number_of(f.value()[static_cast<size_t>(c)]);
  };
  rates("gemm_fp32", m.gemm_fp32, true);
  rates("gemm_bf16", m.gemm_bf16, true);
  rates("rank_gemm_fp32", m.rank_gemm_fp32, false);
  rates("rank_gemm_bf16", m.rank_gemm_bf16, false);
  m.muon_elementwise_s = Field{j, where, "muon_elementwise_s"}.number(0.0);
  m.adamw_elementwise_s = Field{j, where, "adamw_elementwise_s"}.number(0.0);
  m.muon_tensor_s = Field{j, where, "muon_tensor_s"}.number(0.0);
  m.adamw_tensor_s = Field{j, where, "adamw_tensor_s"}.number(0.0);
  m.ns_call_s = Field{j, where, "ns_call_s"}.number(0.0);
  m.memory_bytes = Field{j, where, "memory_bytes"}.number(0.0);
  m.ranks_per_node = Field{j, where, "ranks_per_node"}.integer(1, 1, detail::kMaxRanks);
  m.cores_per_node = Field{j, where, "cores_per_node"}.integer(0, 0, detail::kMaxRanks);
  m.overlap = Field{j, where, "overlap"}.number(0.0);
  for (const auto* key : {"intra", "inter"}) {
    const Field f{j, where, key};
    if (f.given() && !f.value().is_object()) f.refuse("an object");
    const json link = f.given() ? f.value() : json::object();
    const auto field = [&](const char* name, double fallback) {
      return Field{link, where, name, std::string(key) + "." + name}.number(fallback);
    };
    Link& l = std::string(key) == "intra" ? m.intra : m.inter;
    l.latency_s = field("latency_s", 0.0);
    l.bytes_per_s = field("bytes_per_s", 1e9);
    l.all_gather_bytes_per_s = field("all_gather_bytes_per_s", 0.0);
    l.all_to_all_bytes_per_s = field("all_to_all_bytes_per_s", 0.0);
  }
  detail::check_machine(m);
  return m;
}

}  // namespace muon::plan
