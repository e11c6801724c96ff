// The Muon optimizer: options, state, step, save/load.
#include "muon/optim/muon.h"

#include <c10/util/Exception.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/irange.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <numeric>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kernels/fused_update.h"
#include "kernels/symmetric.h"
#include "muon/compat.h"
#include "newton_schulz_internal.h"
#include "optim/muon_internal.h"

namespace muon {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::Muon] ";

// ---- enum names --------------------------------------------------------------

template <typename Enum, size_t N>
Enum parse_enum(const std::string& name, const Enum (&values)[N], const char* what) {
  std::string valid;
  for (size_t i = 0; i < N; ++i) {
    if (to_string(values[i]) == name) return values[i];
    valid += (i ? ", " : "") + to_string(values[i]);
  }
  TORCH_CHECK_VALUE(false, kWho, "unknown ", what, " '", name, "'; valid names: ", valid);
}

constexpr MomentumStyle kMomentumStyles[] = {MomentumStyle::kEma, MomentumStyle::kClassic};
constexpr WeightDecayMode kWeightDecayModes[] = {
    WeightDecayMode::kDecoupled, WeightDecayMode::kIndependent, WeightDecayMode::kL2};

// ---- serialization helpers ---------------------------------------------------

template <typename T>
T read_value(InputArchive& archive, const char* key) {
  c10::IValue v;
  archive.read(key, v);
  return v.to<T>();
}

std::string schedule_name(StepSchedule s) {
  return s == StepSchedule::kCycle ? "cycle" : "repeat_last";
}

at::ScalarType parse_dtype(const std::string& name) {
  for (auto t : {at::kFloat, at::kBFloat16, at::kDouble, at::kHalf}) {
    if (name == c10::toString(t)) return t;
  }
  TORCH_CHECK_VALUE(false, kWho, "archive holds an unsupported ns compute dtype '", name, "'");
}

void write_ns(OutputArchive& archive, const NewtonSchulzOptions& ns) {
  const auto& set = ns.coefficients();
  std::vector<double> flat;
  for (const auto& k : set.coefficients) flat.insert(flat.end(), {k.a, k.b, k.c});
  archive.write("ns_set_name", c10::IValue(set.name));
  archive.write("ns_set_coefficients", c10::IValue(flat));
  archive.write("ns_set_schedule", c10::IValue(schedule_name(set.schedule)));
  archive.write("ns_set_safety_factor", c10::IValue(set.safety_factor));
  archive.write("ns_set_default_steps", c10::IValue(set.default_steps));
  archive.write("ns_set_description", c10::IValue(set.description));
  archive.write("ns_steps", c10::IValue(ns.steps_is_set() ? ns.steps() : int64_t{0}));
  archive.write("ns_eps", c10::IValue(ns.eps()));
  archive.write("ns_compute_dtype", c10::IValue(std::string(c10::toString(ns.compute_dtype()))));
  archive.write("ns_method", c10::IValue(to_string(ns.method())));
  archive.write("ns_symmetric", c10::IValue(ns.symmetric()));
}

NewtonSchulzOptions read_ns(InputArchive& archive) {
  CoefficientSet set;
  set.name = read_value<std::string>(archive, "ns_set_name");
  c10::IValue flat_value;
  archive.read("ns_set_coefficients", flat_value);
  const auto flat = flat_value.toDoubleVector();
  TORCH_CHECK_VALUE(flat.size() % 3 == 0 && !flat.empty(), kWho,
                    "archive holds a malformed coefficient list of length ", flat.size());
  for (size_t i = 0; i < flat.size(); i += 3) set.coefficients.push_back({flat[i], flat[i + 1], flat[i + 2]});
  set.schedule = read_value<std::string>(archive, "ns_set_schedule") == "cycle"
                     ? StepSchedule::kCycle
                     : StepSchedule::kRepeatLast;
  set.safety_factor = read_value<double>(archive, "ns_set_safety_factor");
  set.default_steps = read_value<int64_t>(archive, "ns_set_default_steps");
  set.description = read_value<std::string>(archive, "ns_set_description");

  NewtonSchulzOptions ns;
  ns.coefficient_set(std::move(set));
  const auto steps = read_value<int64_t>(archive, "ns_steps");
  if (steps > 0) ns.steps(steps);
  ns.eps(read_value<double>(archive, "ns_eps"));
  ns.compute_dtype(parse_dtype(read_value<std::string>(archive, "ns_compute_dtype")));
  ns.method(read_value<std::string>(archive, "ns_method"));
  ns.symmetric(read_value<bool>(archive, "ns_symmetric"));
  return ns;
}

// ---- the update of one parameter ---------------------------------------------

// The factor decoupled or independent weight decay multiplies the parameter
// by (1 for l2 or no decay).
double decay_factor(const MuonOptions& o) {
  if (o.weight_decay() == 0) return 1.0;
  switch (o.weight_decay_mode()) {
    case WeightDecayMode::kDecoupled:
      return 1 - o.lr() * o.weight_decay();
    case WeightDecayMode::kIndependent:
      return 1 - o.weight_decay();
    case WeightDecayMode::kL2:
      break;
  }
  return 1.0;
}

// The matrices Muon sees in a parameter: `batch` matrices of rows × cols.
struct MatrixView {
  int64_t batch;
  int64_t rows;
  int64_t cols;
};

MatrixView matrix_view(const at::Tensor& p, const MuonOptions& o) {
  if (o.stacked_experts() && p.dim() >= 3) {
    const auto [rows, cols] = matrix_dims(p.sizes().slice(1));
    return {p.size(0), rows, cols};
  }
  const auto [rows, cols] = matrix_dims(p.sizes());
  return {1, rows, cols};
}

// The orthogonalized, scaled update for `update` (p's shape), not yet
// multiplied by -lr; `alpha` receives the scale still to apply (folded into
// the final add) when the whole update shares one scale.
at::Tensor scaled_orthogonal(const at::Tensor& update, const MatrixView& v, const MuonOptions& o,
                             double& alpha) {
  // reshape, not view: a channels-last conv gradient is not viewable as a
  // matrix; reshape copies only then. The logical (in·kh·kw) order is kept.
  const auto mats = update.reshape({v.batch, v.rows, v.cols});
  const auto& split = o.split_sizes();
  if (split.empty()) {
    alpha = scale_factor(v.rows, v.cols, o.scale_mode(), o.extra_scale_factor());
    return newton_schulz(mats, o.ns());
  }
  // Fused QKV: (B, G, sum(split), cols); block i is (B, G·split[i], cols).
  alpha = 1.0;
  const int64_t groups = o.num_query_groups();
  const int64_t total = std::accumulate(split.begin(), split.end(), int64_t{0});
  const auto grouped = mats.view({v.batch, groups, total, v.cols});
  auto out = at::empty({v.batch, groups, total, v.cols}, update.options());
  int64_t offset = 0;
  for (const int64_t size : split) {
    const auto block = grouped.narrow(2, offset, size).reshape({v.batch, groups * size, v.cols});
    auto orth = newton_schulz(block, o.ns());
    orth.mul_(scale_factor(groups * size, v.cols, o.scale_mode(), o.extra_scale_factor()));
    out.narrow(2, offset, size).copy_(orth.view({v.batch, groups, size, v.cols}));
    offset += size;
  }
  return out;
}

// ---- fused steps, over matrices in parallel --------------------------------------

// Steps 1–6 of one parameter as fused passes (Muon::fused_state said yes).
// Touches only the parameter, its gradient and its state, so different
// parameters may run on different threads.
struct FusedJob {
  at::Tensor* param;
  const MuonOptions* options;
  MuonParamState* state;
  MatrixView view;
};

// A job's Newton–Schulz work, for scheduling: batch·rows·cols·min(rows, cols).
double cost_of(const FusedJob& job) {
  const auto& v = job.view;
  return static_cast<double>(v.batch) * static_cast<double>(v.rows) *
         static_cast<double>(v.cols) * static_cast<double>(std::min(v.rows, v.cols));
}

void run_fused_job(const FusedJob& job) {
  at::Tensor& p = *job.param;
  const MuonOptions& o = *job.options;
  const at::Tensor& grad = p.grad();
  auto& st = *job.state;
  st.step(st.step() + 1);
  auto& buf = st.momentum_buffer();

  // 2–3. momentum into the buffer and Σu² of the Nesterov update u, per matrix.
  const auto& v = job.view;
  const detail::MomentumRule rule{o.momentum(), o.momentum_style() == MomentumStyle::kEma,
                                  o.nesterov()};
  std::vector<double> scale(static_cast<size_t>(v.batch));
  detail::momentum_pass(buf, grad, rule, v.batch, scale.data());
  // 4. X₀ = u / (‖u‖_F·safety + eps), written once in the compute dtype;
  // then the iterations.
  const double safety = o.ns().coefficients().safety_factor;
  for (auto& s : scale) s = 1.0 / (std::sqrt(s) * safety + o.ns().eps());
  auto x0 = at::empty({v.batch, v.rows, v.cols}, p.options().dtype(o.ns().compute_dtype()));
  detail::normalized_update(x0, buf, grad, rule, v.batch, scale.data());
  const auto orth = detail::newton_schulz_normalized(std::move(x0), o.ns()).contiguous();
  // 1, 5–6. weight decay, scale and update in one pass.
  const double decay = decay_factor(o);
  const double alpha = scale_factor(v.rows, v.cols, o.scale_mode(), o.extra_scale_factor());
  detail::decay_and_add(p, orth, decay, -o.lr() * alpha);
}

// Below this much work in all (batch·rows·cols·min), starting threads costs
// more than it saves: 2²² is ~0.1 GFLOP of Newton–Schulz.
constexpr double kMinParallelCost = 4194304.0;

// How many threads run `jobs` side by side, one matrix per thread and each
// product on that thread alone; 1: one after another, each product on all of
// LibTorch's intra-op threads. Side by side wins when there are many
// matrices of moderate size: a 512-wide product gains little from a second
// thread, while two matrices on two threads never wait on each other. It
// needs every product on oneDNN (a BLAS keeps its own thread pool) and no
// matrix with more than its share of the work (it would run alone at the
// end on one thread). A tensor listed twice (one state, two updates) keeps
// the updates in order.
int fused_threads(const std::vector<FusedJob>& jobs) {
  const int threads = at::get_num_threads();
  if (threads < 2 || jobs.size() < 2 || at::in_parallel_region()) return 1;
  double total = 0;
  double largest = 0;
  std::unordered_set<const MuonParamState*> states;
  for (const auto& job : jobs) {
    if (!detail::products_follow_thread_scope(job.options->ns().compute_dtype())) return 1;
    if (!states.insert(job.state).second) return 1;
    const double cost = cost_of(job);
    total += cost;
    largest = std::max(largest, cost);
  }
  const int n = std::min<int>(threads, static_cast<int>(jobs.size()));
  if (total < kMinParallelCost || largest > total / n) return 1;
  return n;
}

std::atomic<int64_t> side_by_side{0};

// Runs every job: in order on this thread, or side by side (largest first,
// each thread taking the next job when it finishes one). A job gives the
// same bits either way at one intra-op thread: each thread's products and
// loops then run on that thread alone. The first error is rethrown after
// every thread has stopped.
void run_fused(std::vector<FusedJob>& jobs) {
  const int threads = fused_threads(jobs);
  if (threads <= 1) {
    for (const auto& job : jobs) run_fused_job(job);
    return;
  }
  ++side_by_side;
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const FusedJob& a, const FusedJob& b) { return cost_of(a) > cost_of(b); });
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  const at::ThreadLocalState caller;  // grad mode and the rest, as on this thread
  auto work = [&](size_t w) {
    try {
      at::ThreadLocalStateGuard same(caller);
      detail::OneThreadScope one;
      for (size_t i = next++; i < jobs.size(); i = next++) run_fused_job(jobs[i]);
    } catch (...) {
      errors[w] = std::current_exception();
      next = jobs.size();  // the others stop after their current job
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (size_t w = 1; w < static_cast<size_t>(threads); ++w) {
    try {
      pool.emplace_back(work, w);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the ones started share the jobs
    }
  }
  work(0);
  for (auto& t : pool) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace

// ---- enums -------------------------------------------------------------------

std::string to_string(MomentumStyle style) {
  switch (style) {
    case MomentumStyle::kEma:
      return "ema";
    case MomentumStyle::kClassic:
      return "classic";
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

MomentumStyle parse_momentum_style(const std::string& name) {
  return parse_enum(name, kMomentumStyles, "momentum_style");
}

std::string to_string(WeightDecayMode mode) {
  switch (mode) {
    case WeightDecayMode::kDecoupled:
      return "decoupled";
    case WeightDecayMode::kIndependent:
      return "independent";
    case WeightDecayMode::kL2:
      return "l2";
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

WeightDecayMode parse_weight_decay_mode(const std::string& name) {
  return parse_enum(name, kWeightDecayModes, "weight_decay_mode");
}

// ---- MuonOptions -------------------------------------------------------------

MuonOptions::MuonOptions(double lr) : lr_(lr) {}

MuonOptions& MuonOptions::momentum_style(const std::string& name) {
  momentum_style_ = parse_momentum_style(name);
  return *this;
}

MuonOptions& MuonOptions::weight_decay_mode(const std::string& name) {
  weight_decay_mode_ = parse_weight_decay_mode(name);
  return *this;
}

MuonOptions& MuonOptions::scale_mode(const std::string& name) {
  const auto names = scale_mode_names();
  std::string valid;
  for (const auto& n : names) {
    if (n == name) {
      scale_mode_ = parse_scale_mode(name);
      return *this;
    }
    valid += (valid.empty() ? "" : ", ") + n;
  }
  TORCH_CHECK_VALUE(false, kWho, "unknown scale_mode '", name, "'; valid names: ", valid);
}

MuonOptions& MuonOptions::ns_coefficients(const std::string& name) {
  const auto names = coefficient_set_names();
  std::string valid;
  for (const auto& n : names) {
    if (n == name) {
      ns_.coefficients(name);
      return *this;
    }
    valid += (valid.empty() ? "" : ", ") + n;
  }
  TORCH_CHECK_VALUE(false, kWho, "unknown ns_coefficients '", name, "'; valid names: ", valid);
}

MuonOptions& MuonOptions::ns_steps(int64_t steps) {
  TORCH_CHECK_VALUE(steps >= kMinNsSteps && steps < kMaxNsSteps, kWho, "ns_steps must be in [",
                    kMinNsSteps, ", ", kMaxNsSteps, "), got ", steps);
  ns_.steps(steps);
  return *this;
}

MuonOptions& MuonOptions::ns_eps(double eps) {
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps > 0, kWho, "ns_eps must be > 0, got ", eps);
  ns_.eps(eps);
  return *this;
}

MuonOptions& MuonOptions::ns_compute_dtype(at::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble ||
                        dtype == at::kHalf,
                    kWho, "ns_compute_dtype must be Float, BFloat16, Double or Half, got ", dtype);
  ns_.compute_dtype(dtype);
  return *this;
}

void MuonOptions::validate() const {
  TORCH_CHECK_VALUE(std::isfinite(lr_) && lr_ >= 0, kWho, "lr must be >= 0, got ", lr_);
  TORCH_CHECK_VALUE(momentum_ >= 0 && momentum_ < 1, kWho, "momentum must be in [0, 1), got ",
                    momentum_);
  TORCH_CHECK_VALUE(std::isfinite(weight_decay_) && weight_decay_ >= 0, kWho,
                    "weight_decay must be >= 0, got ", weight_decay_);
  TORCH_CHECK_VALUE(std::isfinite(extra_scale_factor_) && extra_scale_factor_ > 0, kWho,
                    "extra_scale_factor must be finite and > 0, got ", extra_scale_factor_);
  TORCH_CHECK_VALUE(ns_.steps() >= kMinNsSteps && ns_.steps() < kMaxNsSteps, kWho,
                    "ns_steps must be in [", kMinNsSteps, ", ", kMaxNsSteps, "), got ", ns_.steps());
  TORCH_CHECK_VALUE(std::isfinite(ns_.eps()) && ns_.eps() > 0, kWho, "ns_eps must be > 0, got ",
                    ns_.eps());
  ns_.validate();
  TORCH_CHECK_VALUE(num_query_groups_ >= 1, kWho, "num_query_groups must be >= 1, got ",
                    num_query_groups_);
  for (size_t i = 0; i < split_sizes_.size(); ++i) {
    TORCH_CHECK_VALUE(split_sizes_[i] >= 1, kWho, "split_sizes[", i, "] must be >= 1, got ",
                      split_sizes_[i], " (split_sizes ", c10::IntArrayRef(split_sizes_), ")");
  }
  TORCH_CHECK_VALUE(split_sizes_.empty() ? num_query_groups_ == 1 : true, kWho,
                    "num_query_groups must be 1 when split_sizes is empty, got ",
                    num_query_groups_);
}

double MuonOptions::get_lr() const { return lr(); }

void MuonOptions::set_lr(const double lr) { this->lr(lr); }

void MuonOptions::serialize(OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr_));
  archive.write("momentum", c10::IValue(momentum_));
  archive.write("nesterov", c10::IValue(nesterov_));
  archive.write("momentum_style", c10::IValue(to_string(momentum_style_)));
  archive.write("weight_decay", c10::IValue(weight_decay_));
  archive.write("weight_decay_mode", c10::IValue(to_string(weight_decay_mode_)));
  write_ns(archive, ns_);
  archive.write("scale_mode", c10::IValue(to_string(scale_mode_)));
  archive.write("extra_scale_factor", c10::IValue(extra_scale_factor_));
  archive.write("stacked_experts", c10::IValue(stacked_experts_));
  archive.write("split_sizes", c10::IValue(split_sizes_));
  archive.write("num_query_groups", c10::IValue(num_query_groups_));
}

void MuonOptions::serialize(InputArchive& archive) {
  lr_ = read_value<double>(archive, "lr");
  momentum_ = read_value<double>(archive, "momentum");
  nesterov_ = read_value<bool>(archive, "nesterov");
  momentum_style_ = parse_momentum_style(read_value<std::string>(archive, "momentum_style"));
  weight_decay_ = read_value<double>(archive, "weight_decay");
  weight_decay_mode_ =
      parse_weight_decay_mode(read_value<std::string>(archive, "weight_decay_mode"));
  ns_ = read_ns(archive);
  scale_mode_ = parse_scale_mode(read_value<std::string>(archive, "scale_mode"));
  extra_scale_factor_ = read_value<double>(archive, "extra_scale_factor");
  stacked_experts_ = read_value<bool>(archive, "stacked_experts");
  c10::IValue split;
  archive.read("split_sizes", split);
  split_sizes_ = split.toIntVector();
  num_query_groups_ = read_value<int64_t>(archive, "num_query_groups");
}

bool operator==(const MuonOptions& a, const MuonOptions& b) {
  return a.lr() == b.lr() && a.momentum() == b.momentum() && a.nesterov() == b.nesterov() &&
         a.momentum_style() == b.momentum_style() && a.weight_decay() == b.weight_decay() &&
         a.weight_decay_mode() == b.weight_decay_mode() && a.ns() == b.ns() &&
         a.scale_mode() == b.scale_mode() && a.extra_scale_factor() == b.extra_scale_factor() &&
         a.stacked_experts() == b.stacked_experts() && a.split_sizes() == b.split_sizes() &&
         a.num_query_groups() == b.num_query_groups();
}

// ---- MuonParamState ----------------------------------------------------------

void MuonParamState::serialize(OutputArchive& archive) const {
  archive.write("step", c10::IValue(step_));
  if (momentum_buffer_.defined()) archive.write("momentum_buffer", momentum_buffer_, /*is_buffer=*/true);
}

void MuonParamState::serialize(InputArchive& archive) {
  step_ = read_value<int64_t>(archive, "step");
  at::Tensor buf;
  if (archive.try_read("momentum_buffer", buf, /*is_buffer=*/true)) momentum_buffer_ = buf;
}

bool operator==(const MuonParamState& a, const MuonParamState& b) {
  if (a.step() != b.step()) return false;
  const auto& x = a.momentum_buffer();
  const auto& y = b.momentum_buffer();
  if (x.defined() != y.defined()) return false;
  return !x.defined() || (x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
                          at::equal(x, y));
}

// ---- Muon --------------------------------------------------------------------

Muon::Muon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults)
    : Muon(std::move(param_groups), std::move(defaults), /*allow_empty=*/false) {}

Muon::Muon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults, bool allow_empty)
    : Optimizer(param_groups, std::make_unique<MuonOptions>(defaults)), allow_empty_(allow_empty) {
  defaults.validate();
  compat::reapply_group_options(*this, param_groups);
  for (const auto i : c10::irange(param_groups_.size())) check_group(i);
}

Muon::Muon(std::vector<at::Tensor> params, MuonOptions defaults)
    : Muon(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
           std::move(defaults)) {}

void Muon::check_group(size_t index) const {
  const auto& group = param_groups_[index];
  const auto* o = dynamic_cast<const MuonOptions*>(&group.options());
  TORCH_CHECK_VALUE(o != nullptr, kWho, "param group ", index,
                    " has options of another optimizer; give it muon::MuonOptions");
  o->validate();
  const auto& split = o->split_sizes();
  const int64_t split_rows = o->num_query_groups() *
                             std::accumulate(split.begin(), split.end(), int64_t{0});
  for (const auto j : c10::irange(group.params().size())) {
    const auto& p = group.params()[j];
    TORCH_CHECK_VALUE(p.defined(), kWho, "parameter ", j, " of group ", index, " is undefined");
    TORCH_CHECK_VALUE(p.dim() >= 2, kWho, "parameter ", j, " of group ", index, " has shape ",
                      p.sizes(), " (ndim ", p.dim(),
                      "); Muon orthogonalizes matrices (ndim >= 2). Give vectors and scalars "
                      "(biases, norm gains) to AdamW, e.g. with muon::MuonWithAdamW "
                      "(muon/optim/hybrid.h), which routes them by shape and name");
    TORCH_CHECK_VALUE(allow_empty_ || p.numel() > 0, kWho, "parameter ", j, " of group ", index,
                      " has zero size (shape ", p.sizes(), ")");
    TORCH_CHECK_VALUE(at::isFloatingType(p.scalar_type()), kWho, "parameter ", j, " of group ",
                      index, " must have a floating dtype, got ", p.scalar_type());
    if (!split.empty()) {
      const auto rows = (o->stacked_experts() && p.dim() >= 3) ? p.size(1) : p.size(0);
      TORCH_CHECK_VALUE(rows == split_rows, kWho, "split_sizes ", c10::IntArrayRef(split),
                        " × num_query_groups ", o->num_query_groups(), " = ", split_rows,
                        " rows, but parameter ", j, " of group ", index, " has ", rows,
                        " rows (shape ", p.sizes(), ")");
    }
  }
}

at::Tensor Muon::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // Parameters the fused passes take run after the loop, possibly side by side.
  std::vector<FusedJob> fused;
  for (const auto gi : c10::irange(param_groups_.size())) {
    check_group(gi);  // a few comparisons: catches options changed or groups added since
    auto& group = param_groups_[gi];
    const auto& o = static_cast<const MuonOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (auto* st = fused_state(p, o)) {
        fused.push_back({&p, &o, st, matrix_view(p, o)});
        continue;
      }
      auto [update, st] = momentum_update(p, o);
      // 4–6. orthogonalize, scale, apply in the parameter's dtype.
      double alpha = 1.0;
      auto orth = orthogonal_update(p, update, o, *st, alpha);
      apply_update(p, orth, o.lr(), alpha);
    }
  }
  run_fused(fused);
  return loss;
}

std::pair<at::Tensor, MuonParamState*> Muon::momentum_update(at::Tensor& p, const MuonOptions& o) {
  TORCH_CHECK_VALUE(!p.grad().is_sparse(), kWho, "sparse gradients are not supported");
  at::Tensor grad = p.grad();
  const double mu = o.momentum();
  const double wd = o.weight_decay();
  const bool ema = o.momentum_style() == MomentumStyle::kEma;

  auto& st = state_of(p);
  if (!st.momentum_buffer().defined()) {
    st.momentum_buffer(at::zeros_like(p, at::MemoryFormat::Preserve));
  }
  st.step(st.step() + 1);
  auto& buf = st.momentum_buffer();

  // 1. weight decay. l2 makes a new gradient tensor: p.grad() is never written.
  if (wd != 0) {
    switch (o.weight_decay_mode()) {
      case WeightDecayMode::kDecoupled:
      case WeightDecayMode::kIndependent:
        p.mul_(decay_factor(o));
        break;
      case WeightDecayMode::kL2:
        grad = grad.add(p, wd);
        break;
    }
  }
  // 2–3. momentum in place on the buffer and the Nesterov update (a new
  // tensor): one pass over contiguous fp32 CPU tensors, the same arithmetic
  // as the fused step's.
  if (detail::fused_eligible(buf) && detail::fused_eligible(grad) && grad.sizes() == buf.sizes()) {
    at::Tensor nesterov_update;
    detail::momentum_step(buf, grad, {mu, ema, o.nesterov()}, &nesterov_update);
    return {o.nesterov() ? nesterov_update : buf, &st};
  }
  if (ema) {
    buf.lerp_(grad, 1 - mu);
  } else {
    buf.mul_(mu).add_(grad);
  }
  // 3. nesterov: a new tensor. Without it the buffer itself is passed on:
  // newton_schulz reads its input and returns a tensor that never aliases it.
  at::Tensor update = buf;
  if (o.nesterov()) update = ema ? grad.lerp(buf, mu) : grad.add(buf, mu);
  return {update, &st};
}

MuonParamState& Muon::state_of(const at::Tensor& p) {
  auto& slot = state_[compat::state_key(p)];
  if (!slot) slot = new_state(p);
  return static_cast<MuonParamState&>(*slot);
}

MuonParamState* Muon::fused_state(at::Tensor& p, const MuonOptions& o) {
  const auto compute = o.ns().compute_dtype();
  const at::Tensor& grad = p.grad();
  if (!orthogonalizes_by_default() || !detail::fused_eligible(p) || !detail::fused_eligible(grad) ||
      grad.sizes() != p.sizes() || p.numel() == 0 || !o.split_sizes().empty() ||
      (compute != at::kFloat && compute != at::kBFloat16) ||
      (o.weight_decay() != 0 && o.weight_decay_mode() == WeightDecayMode::kL2)) {
    return nullptr;
  }
  auto& st = state_of(p);
  if (st.momentum_buffer().defined() && !detail::fused_eligible(st.momentum_buffer())) {
    return nullptr;
  }
  if (!st.momentum_buffer().defined()) st.momentum_buffer(at::zeros_like(p));
  return &st;
}

void Muon::apply_update(at::Tensor& p, at::Tensor orth, double lr, double alpha) {
  if (detail::fused_eligible(p) && orth.is_contiguous() && orth.device().is_cpu() &&
      orth.numel() == p.numel() &&
      (orth.scalar_type() == at::kFloat || orth.scalar_type() == at::kBFloat16)) {
    detail::decay_and_add(p, orth, 1.0, -lr * alpha);  // the fused step's arithmetic
    return;
  }
  if (orth.scalar_type() != p.scalar_type()) orth = orth.to(p.scalar_type());
  p.add_(orth.view(p.sizes()), -lr * alpha);
}

at::Tensor Muon::orthogonal_update(const at::Tensor& param, const at::Tensor& update,
                                   const MuonOptions& options, MuonParamState& /*state*/,
                                   double& alpha) {
  return scaled_orthogonal(update, matrix_view(param, options), options, alpha);
}

std::unique_ptr<MuonParamState> Muon::new_state(const at::Tensor& /*param*/) const {
  return std::make_unique<MuonParamState>();
}

std::string Muon::archive_kind() const { return "muon::Muon"; }

int64_t Muon::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& item : state_) {
    const auto& buf = static_cast<const MuonParamState&>(*item.second).momentum_buffer();
    if (buf.defined()) bytes += static_cast<int64_t>(buf.nbytes());
  }
  return bytes;
}

void Muon::save(OutputArchive& archive) const {
  archive.write("muon_format", c10::IValue(int64_t{1}));
  archive.write("muon_kind", c10::IValue(archive_kind()));
  archive.write("param_groups/size", c10::IValue(static_cast<int64_t>(param_groups_.size())));
  for (const auto i : c10::irange(param_groups_.size())) {
    const auto& group = param_groups_[i];
    OutputArchive group_archive(archive.compilation_unit());
    group_archive.write("params/size", c10::IValue(static_cast<int64_t>(group.params().size())));
    OutputArchive options_archive(archive.compilation_unit());
    static_cast<const MuonOptions&>(group.options()).serialize(options_archive);
    group_archive.write("options", options_archive);
    for (const auto j : c10::irange(group.params().size())) {
      const auto it = state_.find(compat::state_key(group.params()[j]));
      if (it == state_.end()) continue;
      OutputArchive state_archive(archive.compilation_unit());
      static_cast<const MuonParamState&>(*it->second).serialize(state_archive);
      group_archive.write("state/" + std::to_string(j), state_archive);
    }
    archive.write("param_groups/" + std::to_string(i), group_archive);
  }
}

void Muon::load(InputArchive& archive) {
  c10::IValue format;
  TORCH_CHECK_VALUE(archive.try_read("muon_format", format) && format.toInt() == 1, kWho,
                    "the archive was not written by muon::Muon::save");
  c10::IValue kind;
  const std::string expected = archive_kind();
  const std::string found = archive.try_read("muon_kind", kind) ? kind.toStringRef() : "muon::Muon";
  TORCH_CHECK_VALUE(found == expected, kWho, "the archive holds the state of ", found,
                    ", this optimizer is ", expected);
  const auto groups = read_value<int64_t>(archive, "param_groups/size");
  TORCH_CHECK_VALUE(groups == static_cast<int64_t>(param_groups_.size()), kWho,
                    "the archive has ", groups, " param groups, this optimizer has ",
                    param_groups_.size());
  // Read everything first: a mismatch leaves this optimizer unchanged.
  std::vector<MuonOptions> options(param_groups_.size());
  std::vector<std::pair<at::Tensor, std::unique_ptr<MuonParamState>>> states;
  for (const auto i : c10::irange(param_groups_.size())) {
    const auto& params = param_groups_[i].params();
    InputArchive group_archive;
    archive.read("param_groups/" + std::to_string(i), group_archive);
    const auto count = read_value<int64_t>(group_archive, "params/size");
    TORCH_CHECK_VALUE(count == static_cast<int64_t>(params.size()), kWho, "param group ", i,
                      " of the archive has ", count, " parameters, this optimizer's has ",
                      params.size());
    InputArchive options_archive;
    group_archive.read("options", options_archive);
    options[i].serialize(options_archive);
    for (const auto j : c10::irange(params.size())) {
      InputArchive state_archive;
      if (!group_archive.try_read("state/" + std::to_string(j), state_archive)) continue;
      const auto& p = params[j];
      auto st = new_state(p);
      st->serialize(state_archive);
      auto& buf = st->momentum_buffer();
      if (buf.defined()) {
        TORCH_CHECK_VALUE(buf.sizes() == p.sizes(), kWho, "the archive's momentum buffer of "
                          "parameter ", j, " of group ", i, " has shape ", buf.sizes(),
                          ", the parameter has shape ", p.sizes());
        buf = buf.to(p.device(), p.scalar_type());
      }
      states.emplace_back(p, std::move(st));
    }
  }
  for (const auto i : c10::irange(param_groups_.size())) {
    param_groups_[i].set_options(std::make_unique<MuonOptions>(options[i]));
  }
  state_.clear();  // the archive holds the whole state, as Python's load_state_dict
  for (auto& [p, st] : states) state_[compat::state_key(p)] = std::move(st);
}

namespace detail {

int64_t side_by_side_steps() { return side_by_side.load(); }

}  // namespace detail
}  // namespace muon
