// muon::plan's input ranges and checked arithmetic (plan_checks.h).
#include "plan_checks.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "util/names.h"

namespace muon::plan {
namespace detail {
namespace {

constexpr const char* kWho = "[muon::plan] ";

std::string shape_text(const std::vector<int64_t>& shape) {
  return shown(muon::detail::shape_text(shape));
}

void int_range(const std::string& where, const char* field, int64_t v, int64_t lo, int64_t hi,
               const char* note = "") {
  TORCH_CHECK_VALUE(v >= lo && v <= hi, kWho, where, field, " must be in [", lo, ", ", hi, "]", note, ", got ", v);
}

// A finite double in [lo, hi] (or 0, where 0 means "not given").
void real_range(const std::string& where, const std::string& field, double v, double lo, double hi, bool zero_ok,
                const char* unit) {
  TORCH_CHECK_VALUE(std::isfinite(v) && ((zero_ok && v == 0) || (v >= lo && v <= hi)), kWho, where, field,
                    " must be ", zero_ok ? "0 or " : "", "in [", lo, ", ", hi, "] ", unit, ", got ", v);
}

void check_link(const std::string& where, const std::string& key, const Link& l) {
  real_range(where, key + ".latency_s", l.latency_s, 0, kMaxSeconds, false, "seconds");
  real_range(where, key + ".bytes_per_s", l.bytes_per_s, kMinRate, kMaxByteRate, false, "bytes/s");
  real_range(where, key + ".all_gather_bytes_per_s", l.all_gather_bytes_per_s, kMinRate, kMaxByteRate, true,
             "bytes/s");
  real_range(where, key + ".all_to_all_bytes_per_s", l.all_to_all_bytes_per_s, kMinRate, kMaxByteRate, true,
             "bytes/s");
}

}  // namespace

int64_t mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw Overflow(what);
  return r;
}

int64_t add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw Overflow(what);
  return r;
}

int64_t balanced_part(int64_t total, int64_t parts, int64_t index) {
  return total / parts + (index < total % parts ? 1 : 0);
}

int64_t ring_all_reduce_bytes(int64_t bytes, int64_t p) {
  if (p <= 1) return 0;
  // ⌊2(p−1)·b / p⌋ = 2b − ⌈2b / p⌉, without the product.
  const int64_t twice = mul(2, bytes, "an all-reduce's bytes");
  return twice - (twice / p + (twice % p != 0 ? 1 : 0));
}

int64_t all_gather_bytes(int64_t bytes, int64_t p) { return p <= 1 ? 0 : mul(p - 1, bytes, "an all-gather's bytes"); }

std::string shown(const std::string& s) {
  std::string out = s.size() > 80 ? s.substr(0, 77) + "..." : s;
  for (auto& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return out;
}

void check_options(const Options& o) {
  int_range("", "world", o.world, 1, kMaxRanks);
  int_range("", "ranks_per_node", o.ranks_per_node, 0, kMaxRanks, " (0: the machine's)");
  int_range("", "tp", o.tp, 0, kMaxRanks, " (0: the layout's default)");
  int_range("", "ns_steps", o.ns_steps, 1, 99);
  TORCH_CHECK_VALUE(std::isfinite(o.row_fraction) && o.row_fraction > 0 && o.row_fraction <= 1, kWho,
                    "row_fraction must be in (0, 1], got ", o.row_fraction);
  int_range("", "all_reduce_bucket_bytes", o.all_reduce_bucket_bytes, 1, kMaxCount);
  int_range("", "row_bucket_bytes", o.row_bucket_bytes, 1, kMaxCount);
  int_range("", "layerwise_bucket_bytes", o.layerwise_bucket_bytes, 1, kMaxCount);
}

void check_machine(const Machine& m) {
  const std::string where = "machine '" + shown(m.name) + "': ";
  for (int c = 0; c < kShapeClasses; ++c) {
    const auto k = "[" + std::to_string(c) + "]";
    real_range(where, "gemm_fp32" + k, m.gemm_fp32[c], kMinRate, kMaxFlopRate, false, "FLOP/s");
    real_range(where, "gemm_bf16" + k, m.gemm_bf16[c], kMinRate, kMaxFlopRate, false, "FLOP/s");
    real_range(where, "rank_gemm_fp32" + k, m.rank_gemm_fp32[c], kMinRate, kMaxFlopRate, true, "FLOP/s");
    real_range(where, "rank_gemm_bf16" + k, m.rank_gemm_bf16[c], kMinRate, kMaxFlopRate, true, "FLOP/s");
  }
  real_range(where, "muon_elementwise_s", m.muon_elementwise_s, 0, kMaxSeconds, false, "seconds");
  real_range(where, "adamw_elementwise_s", m.adamw_elementwise_s, 0, kMaxSeconds, false, "seconds");
  real_range(where, "muon_tensor_s", m.muon_tensor_s, 0, kMaxSeconds, false, "seconds");
  real_range(where, "adamw_tensor_s", m.adamw_tensor_s, 0, kMaxSeconds, false, "seconds");
  real_range(where, "ns_call_s", m.ns_call_s, 0, kMaxSeconds, false, "seconds");
  real_range(where, "memory_bytes", m.memory_bytes, 0, kMaxMemory, false, "bytes (0: unbounded)");
  int_range(where, "ranks_per_node", m.ranks_per_node, 1, kMaxRanks);
  int_range(where, "cores_per_node", m.cores_per_node, 0, kMaxRanks, " (0: an accelerator per rank)");
  check_link(where, "intra", m.intra);
  check_link(where, "inter", m.inter);
  real_range(where, "overlap", m.overlap, 0, 1, false, "");
}

void check_model(const Model& m) {
  const std::string where = "model '" + shown(m.name) + "': ";
  TORCH_CHECK_VALUE(!m.tensors.empty(), kWho, where, "the model has no tensors");
  TORCH_CHECK_VALUE(static_cast<int64_t>(m.tensors.size()) <= kMaxTensors, kWho, where, m.tensors.size(),
                    " tensors (counts included), more than ", kMaxTensors);
  int64_t total = 0;
  for (const auto& t : m.tensors) {
    const auto tensor = where + "tensor '" + shown(t.name) + "': ";
    TORCH_CHECK_VALUE(!t.shape.empty(), kWho, tensor, "shape must not be empty");
    int64_t n = 1;
    for (const auto s : t.shape) {
      TORCH_CHECK_VALUE(s >= 1 && s <= kMaxElements && !__builtin_mul_overflow(n, s, &n) && n <= kMaxElements, kWho,
                        tensor, "shape ", shape_text(t.shape), ": every size must be >= 1 and the elements at most ",
                        kMaxElements);
    }
    TORCH_CHECK_VALUE(t.dtype_bytes == 2 || t.dtype_bytes == 4 || t.dtype_bytes == 8, kWho, tensor,
                      "dtype_bytes must be 2, 4 or 8, got ", t.dtype_bytes);
    total += n;
    TORCH_CHECK_VALUE(total <= kMaxElements, kWho, where, "its tensors hold more than ", kMaxElements,
                      " elements (at tensor '", shown(t.name), "')");
  }
  int_range(where, "activation_all_reduces", m.activation_all_reduces, 0, kMaxCount);
  int_range(where, "activation_elements", m.activation_elements, 0, kMaxCount);
  real_range(where, "train_flops", m.train_flops, 0, kMaxFlops, false, "FLOPs");
  real_range(where, "train_flops_per_s", m.train_flops_per_s, kMinRate, kMaxFlopRate, true, "FLOP/s");
  int_range(where, "expert_data_parallel", m.expert_data_parallel, 0, 1);
  int_range(where, "pipeline_stages", m.pipeline_stages, 1, kMaxRanks);
}

void check_finite(const Prediction& p, const Model& model, const Machine& machine) {
  const auto bad = [&](const char* field, double v) {
    TORCH_CHECK_VALUE(false, kWho, "model '", shown(model.name), "' on machine '", shown(machine.name), "', layout ",
                      to_string(p.layout), " at world ", p.world, ": ", field, " came out ", v,
                      " (inputs beyond the model's ranges)");
  };
  const std::pair<const char*, double> figures[] = {
      {"newton_schulz_s", p.newton_schulz_s}, {"elementwise_s", p.elementwise_s},
      {"communication_s", p.communication_s}, {"step_s", p.step_s},
      {"newton_schulz_flops", p.newton_schulz_flops}, {"adamw_step_s", p.adamw_step_s},
      {"vs_adamw", p.vs_adamw}, {"train_s", p.train_s},
      {"share_of_training", p.share_of_training}, {"iteration_ratio", p.iteration_ratio}};
  for (const auto& [field, v] : figures) {
    if (!std::isfinite(v) || v < 0) bad(field, v);
  }
  if (!std::isfinite(p.throughput_cost)) bad("throughput_cost", p.throughput_cost);
  for (const auto& c : p.collectives) {
    if (!std::isfinite(c.seconds) || c.seconds < 0) bad("a collective's seconds", c.seconds);
  }
}

}  // namespace detail

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (const auto s : shape) {
    TORCH_CHECK_VALUE(s >= 0 && !__builtin_mul_overflow(n, s, &n), detail::kWho, "tensor '", detail::shown(name),
                      "': shape ", detail::shape_text(shape), " has more elements than int64 holds");
  }
  return n;
}

int64_t Tensor::bytes() const {
  int64_t b = 0;
  TORCH_CHECK_VALUE(!__builtin_mul_overflow(numel(), dtype_bytes, &b), detail::kWho, "tensor '",
                    detail::shown(name), "': shape ", detail::shape_text(shape), " at ", dtype_bytes,
                    " bytes an element has more bytes than int64 holds");
  return b;
}

int64_t Model::parameters() const {
  int64_t n = 0;
  for (const auto& t : tensors) {
    TORCH_CHECK_VALUE(!__builtin_add_overflow(n, t.numel(), &n), detail::kWho, "model '", detail::shown(name),
                      "': its parameters are more than int64 holds");
  }
  return n;
}

int64_t Model::muon_parameters() const {
  int64_t n = 0;
  for (const auto& t : tensors) {
    if (t.route != Route::kMuon || t.shape.size() < 2) continue;
    TORCH_CHECK_VALUE(!__builtin_add_overflow(n, t.numel(), &n), detail::kWho, "model '", detail::shown(name),
                      "': its Muon parameters are more than int64 holds");
  }
  return n;
}

}  // namespace muon::plan
