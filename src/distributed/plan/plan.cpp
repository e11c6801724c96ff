// muon::plan: predictions of every layout (include/muon/plan.h).
//
// The bytes mirror what each layout sends through muon::distributed::Group (its
// ring model, per call, in integers): the step's agreement, the gradient
// reduction in buckets, the optimizer's collectives and the gather of the
// updated parameters, with the same bucketing, padding, row splits and owner
// packing as src/distributed/layouts/. The times are a model: each collective
// hops · latency + bytes / bandwidth, each Newton–Schulz call its FLOPs at the
// machine's rate for its shape class.
#include "muon/plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <tuple>
#include <sstream>

#include "muon/distributed/layouts/assignment.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/newton_schulz.h"
#include "plan_checks.h"
#include "planner.h"

namespace muon::plan {
namespace {

constexpr const char* kWho = "[muon::plan] ";

}  // namespace

namespace planner {

Matrices matrices_of(const std::vector<int64_t>& shape) {
  if (shape.size() < 2) return {};
  const int64_t rows = shape[shape.size() - 2];
  const int64_t cols = shape.back();
  int64_t count = 1;
  for (size_t d = 0; d + 2 < shape.size(); ++d) count *= shape[d];
  return {count, rows, cols};
}

bool is_muon(const Tensor& t, const Options& o) {
  return !o.adamw_only && t.route == Route::kMuon && t.shape.size() >= 2;
}

std::vector<int64_t> block_shape(const Tensor& t, int64_t tp, int64_t rank) {
  auto shape = t.shape;
  if (tp <= 1 || t.split == Split::kNone || (shape.size() < 2 && t.split == Split::kCols)) return shape;
  const size_t dim = t.split == Split::kRows ? (shape.size() < 2 ? 0 : shape.size() - 2) : shape.size() - 1;
  shape[dim] = detail::balanced_part(shape[dim], tp, rank);
  return shape;
}

Tensor block_of(const Tensor& t, int64_t tp, int64_t rank) {
  Tensor b = t;
  b.shape = block_shape(t, tp, rank);
  return b;
}

Planner::Planner(const Model& model, const Machine& machine, LayoutKind layout, const Options& o)
    : model_(model), machine_(machine), layout_(layout), o_(o), ranks_(o.world) {
  const bool tp_layout = layout == LayoutKind::kTensorParallel || layout == LayoutKind::kTensorParallelSharded;
  tp_ = 1;
  if (tp_layout) tp_ = o.tp > 0 ? o.tp : (layout == LayoutKind::kTensorParallel ? o.world : 2);
  if (o.world % tp_ != 0) {
    p_.why_not = c10::str("tp = ", tp_, " does not divide world = ", o.world);
    tp_ = 1;
  }
  dp_ = o.world / tp_;
  p_.layout = layout;
  p_.world = o.world;
  p_.tp = tp_;
  p_.dp = dp_;
  p_.adamw = o.adamw_only;
}

Prediction Planner::run() {
  if (!p_.why_not.empty()) return p_;
  if (layout_ == LayoutKind::kTensorParallelSharded && (tp_ < 2 || dp_ < 2)) {
    p_.why_not = "the 2-D layout needs tp >= 2 and dp >= 2";
    return p_;
  }
  if ((layout_ == LayoutKind::kTensorParallel || layout_ == LayoutKind::kTensorParallelSharded) &&
      model_.expert_data_parallel > 0) {
    p_.why_not = "this model's experts are laid out by expert parallelism";
    return p_;
  }
  for (int64_t tp_rank = 0; tp_rank < tp_; ++tp_rank) run_replica(tp_rank);
  finish();
  return p_;
}

Collective& Planner::collective(const std::string& what, int64_t group, bool overlapped) {
  for (auto& c : p_.collectives) {
    if (c.what == what) return c;
  }
  Collective c;
  c.what = what;
  c.kind = what.find("gather") != std::string::npos || what == "step agreement" ? "all_gather"
           : what.find("reduce-scatter") != std::string::npos || what.find("exchange") != std::string::npos
               ? "all_to_all"
               : "all_reduce";
  c.group = group;
  c.overlapped = overlapped;
  p_.collectives.push_back(c);
  return p_.collectives.back();
}

// Records a collective of `group` ranks that sends bytes[r] from each of
// its ranks (world ranks `members`); the reported bytes and calls are the
// most loaded rank's.
void Planner::add(const std::string& what, const std::vector<int64_t>& members,
                  const std::vector<int64_t>& bytes, int64_t hops, bool overlapped) {
  const auto g = static_cast<int64_t>(members.size());
  if (g <= 1) return;
  auto& c = collective(what, g, overlapped);
  int64_t most = 0;
  for (size_t k = 0; k < members.size(); ++k) {
    auto& sent = ranks_.bytes[static_cast<size_t>(members[k])];
    sent = detail::add(sent, bytes[k], "the bytes a rank sends");
    most = std::max(most, bytes[k]);
  }
  c.calls += 1;
  c.bytes = detail::add(c.bytes, most, "a collective's bytes");
  c.hops = detail::add(c.hops, hops, "a collective's latency terms");
}

std::vector<int64_t> Planner::dp_members(int64_t t) const {
  std::vector<int64_t> m;
  for (int64_t d = 0; d < dp_; ++d) m.push_back(world_rank(d, t));
  return m;
}

std::vector<int64_t> Planner::tp_members(int64_t d) const {
  std::vector<int64_t> m;
  for (int64_t t = 0; t < tp_; ++t) m.push_back(world_rank(d, t));
  return m;
}

void Planner::same_bytes(const std::string& what, const std::vector<int64_t>& members, int64_t bytes,
                         int64_t hops, bool overlapped) {
  add(what, members, std::vector<int64_t>(members.size(), bytes), hops, overlapped);
}

// The tensors of this TP rank (blocks) and which are the optimizer's.
std::vector<Tensor> Planner::local_tensors(int64_t tp_rank) const {
  std::vector<Tensor> out;
  for (const auto& t : model_.tensors) out.push_back(block_of(t, tp_, tp_rank));
  return out;
}

double Planner::ns_rate(int64_t smaller) const {
  const int c = shape_class(smaller);
  const double node = (o_.ns_bf16 ? machine_.gemm_bf16 : machine_.gemm_fp32)[c];
  if (machine_.cores_per_node <= 0) return node;
  const int64_t k = ranks_on_node();
  if (k == 1) return node;
  const double shared = (o_.ns_bf16 ? machine_.rank_gemm_bf16 : machine_.rank_gemm_fp32)[c];
  const double cores = static_cast<double>(machine_.cores_per_node);
  const double each = shared > 0 ? shared : node / std::min(static_cast<double>(k), cores);
  return each * std::min(1.0, cores / static_cast<double>(k));
}


int64_t Planner::ranks_on_node() const { return std::min<int64_t>(o_.world, ranks_per_node()); }

int64_t Planner::ranks_per_node() const {
  return std::max<int64_t>(1, o_.ranks_per_node > 0 ? o_.ranks_per_node : machine_.ranks_per_node);
}

// A rank's share of its node's element-wise throughput: a CPU node's
// rates are one thread's (a rank's), and ranks beyond the cores share
// them; accelerators have one rank each.
double Planner::compute_share() const {
  if (machine_.cores_per_node <= 0) return 1.0;
  return std::min(1.0, static_cast<double>(machine_.cores_per_node) / static_cast<double>(ranks_on_node()));
}

// `share`: this rank's part of the work (distributed Newton–Schulz).
void Planner::orthogonalize(int64_t rank, int64_t count, int64_t rows, int64_t cols, double share) {
  if (count <= 0 || rows <= 0 || cols <= 0) return;
  // Dion2-like selection: Newton–Schulz on a fraction of the rows.
  if (o_.row_fraction < 1.0) rows = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o_.row_fraction * static_cast<double>(rows))));
  const double f = share * static_cast<double>(count) * newton_schulz_flops(rows, cols, o_.ns_steps);
  ranks_.flops[static_cast<size_t>(rank)] += f;
  ranks_.ns_s[static_cast<size_t>(rank)] += f / ns_rate(std::min(rows, cols));
  if (ranks_.shapes.insert({rank, rows, cols}).second) {
    ranks_.ns_s[static_cast<size_t>(rank)] += machine_.ns_call_s;
  }
}

void Planner::add_params(int64_t rank, int64_t bytes) {
  auto& held = ranks_.params[static_cast<size_t>(rank)];
  held = detail::add(held, bytes, "a rank's parameter bytes");
}

void Planner::elementwise(int64_t rank, int64_t elements, bool muon) {
  const double per = muon ? machine_.muon_elementwise_s : machine_.adamw_elementwise_s;
  const double fixed = muon ? machine_.muon_tensor_s : machine_.adamw_tensor_s;
  ranks_.elementwise_s[static_cast<size_t>(rank)] +=
      static_cast<double>(elements) * per / compute_share() + (elements > 0 ? fixed : 0.0);
  auto& state = ranks_.state[static_cast<size_t>(rank)];
  state = detail::add(state, mul(elements, muon ? 4 : 8, "a rank's state bytes"), "a rank's state bytes");
}

// The step agreement: one all-gather of a few integers (its slots and a
// bit per parameter) over the world group, which every layout is given.
void Planner::agreement(int64_t tp_rank, int64_t params) {
  if (tp_rank != 0) return;
  const int64_t ints = kAgreementSlots + (params + kMaskBits - 1) / kMaskBits;
  std::vector<int64_t> all(static_cast<size_t>(o_.world));
  std::iota(all.begin(), all.end(), 0);
  same_bytes("step agreement", all, ints_bytes(ints, o_.world), 1);
}

void Planner::gradient_all_reduce(int64_t tp_rank, const std::vector<Tensor>& tensors) {
  if (dp_ <= 1) return;
  int64_t bucket = 0;
  int64_t bytes = 0;
  int64_t hops = 0;
  auto flush = [&] {
    if (bucket == 0) return;
    bytes = detail::add(bytes, ring_all_reduce_bytes(bucket, dp_), "the gradients all-reduce's bytes");
    hops += 2 * (dp_ - 1);
    bucket = 0;
  };
  for (const auto& t : tensors) {
    if (bucket > 0 && detail::add(bucket, t.bytes(), "a bucket's bytes") > o_.all_reduce_bucket_bytes) flush();
    bucket = detail::add(bucket, t.bytes(), "a bucket's bytes");
  }
  flush();
  same_bytes("gradients all-reduce", dp_members(tp_rank), bytes, hops);
}

void Planner::run_replica(int64_t tp_rank) {
  auto tensors = local_tensors(tp_rank);
  agreement(tp_rank, static_cast<int64_t>(tensors.size()));
  if (model_.expert_data_parallel > 0) {
    std::vector<Tensor> dense, experts;
    for (auto& t : tensors) (t.expert ? experts : dense).push_back(t);
    local_experts(tp_rank, experts);
    tensors = dense;
  }
  if (o_.training_step && tp_ > 1 && model_.activation_all_reduces > 0 && tp_rank == 0) {
    const int64_t each = ring_all_reduce_bytes(mul(model_.activation_elements / dp_, 4, "activation bytes"), tp_);
    const int64_t bytes = mul(model_.activation_all_reduces, each, "the activations all-reduce's bytes");
    const int64_t hops = mul(2 * (tp_ - 1), model_.activation_all_reduces, "the activations' latency terms");
    for (int64_t d = 0; d < dp_; ++d) same_bytes("activations all-reduce (TP)", tp_members(d), bytes, hops);
  }
  switch (layout_) {
    case LayoutKind::kReplicated: replicated(tp_rank, tensors); break;
    case LayoutKind::kLayerwise: layerwise(tp_rank, tensors); break;
    case LayoutKind::kSharded:
    case LayoutKind::kShardedReplicated:
    case LayoutKind::kTensorParallelSharded: sharded(tp_rank, tensors); break;
    case LayoutKind::kTensorParallel: replicated(tp_rank, tensors); break;
  }
  if (tp_ > 1) tensor_parallel_gathers(tp_rank, tensors);
}

void Planner::finish() {
  size_t most = 0;
  const auto world = static_cast<size_t>(o_.world);
  for (size_t r = 0; r < world; ++r) {
    if (ranks_.bytes[r] > ranks_.bytes[most]) most = r;
  }
  p_.bytes_per_rank = ranks_.bytes;
  p_.bytes_sent = ranks_.bytes[most];
  // Times: the slowest rank's compute, then each collective by the
  // alpha-beta model on the link its group spans.
  double compute = 0;
  for (size_t r = 0; r < world; ++r) {
    const double c = ranks_.ns_s[r] + ranks_.elementwise_s[r];
    if (c >= compute) {
      compute = c;
      p_.newton_schulz_s = ranks_.ns_s[r];
      p_.elementwise_s = ranks_.elementwise_s[r];
      p_.newton_schulz_flops = ranks_.flops[r];
    }
  }
  double overlapped = 0, serial = 0;
  for (auto& c : p_.collectives) {
    const bool inter = c.group > ranks_per_node() && o_.world > ranks_per_node();
    const Link& link = inter ? machine_.inter : machine_.intra;
    const double rate = c.kind == "all_gather" && link.all_gather_bytes_per_s > 0   ? link.all_gather_bytes_per_s
                        : c.kind == "all_to_all" && link.all_to_all_bytes_per_s > 0 ? link.all_to_all_bytes_per_s
                                                                                     : link.bytes_per_s;
    c.seconds = static_cast<double>(c.hops) * link.latency_s + static_cast<double>(c.bytes) / rate;
    (c.overlapped ? overlapped : serial) += c.seconds;
  }
  p_.communication_s = overlapped + serial;
  const double hidden = machine_.overlap * std::min(overlapped, compute);
  p_.step_s = compute + p_.communication_s - hidden;
  p_.state_bytes = *std::max_element(ranks_.state.begin(), ranks_.state.end());
  p_.parameter_bytes = *std::max_element(ranks_.params.begin(), ranks_.params.end());
  int64_t grads = 0;
  for (const auto& t : model_.tensors) grads = detail::add(grads, block_of(t, tp_, 0).bytes(), "the gradient bytes");
  p_.gradient_bytes = grads;
  p_.fits = machine_.memory_bytes <= 0 || static_cast<double>(p_.parameter_bytes) + static_cast<double>(p_.gradient_bytes) +
                                                  static_cast<double>(p_.state_bytes) <= machine_.memory_bytes;
  if (model_.train_flops > 0) {
    const double rate = model_.train_flops_per_s > 0 ? model_.train_flops_per_s : machine_.gemm_bf16[kShapeClasses - 1];
    p_.train_s = model_.train_flops / static_cast<double>(tp_) / rate;
    if (p_.train_s + p_.step_s > 0) p_.share_of_training = p_.step_s / (p_.train_s + p_.step_s);
  }
}

}  // namespace planner

Prediction detail::predict_unchecked(const Model& model, const Machine& machine, LayoutKind layout,
                                     const Options& options) {
  auto p = planner::Planner(model, machine, layout, options).run();
  if (!p.why_not.empty() || options.adamw_only) return p;
  auto adamw = options;
  adamw.adamw_only = true;
  const auto base = planner::Planner(model, machine, layout, adamw).run();
  p.adamw_step_s = base.step_s;
  p.adamw_bytes_sent = base.bytes_sent;
  if (p.train_s > 0) {
    p.throughput_cost = (p.step_s - base.step_s) / (p.train_s + base.step_s);
    p.iteration_ratio = (p.train_s + p.step_s) / (p.train_s + base.step_s);
  }
  p.adamw_state_bytes = base.state_bytes;
  p.vs_adamw = base.step_s > 0 ? p.step_s / base.step_s : 0;
  return p;
}

}  // namespace muon::plan
