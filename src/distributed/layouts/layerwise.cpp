// Layer-wise distributed optimizer: owner updates, bucketed overlapped all-gather.
#include "distributed/runtime/agreement.h"
#include "muon/distributed/layouts/layerwise.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "distributed/layouts/pipeline.h"
#include "distributed/runtime/max_over.h"
#include "muon/distributed/layouts/assignment.h"
#include "muon/optim/state_bytes.h"
#include "muon/scaling.h"
#include "optim/archive_kind.h"
#include "optim/closure.h"

namespace muon::distributed {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::distributed::LayerwiseOptimizer] ";
constexpr int64_t kAlign = 16;  // byte alignment of each parameter in a bucket

int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The bytes of a tensor as a flat uint8 view (contiguous input).
at::Tensor as_bytes(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

std::vector<AgreementItem> layout_items(const LayerwiseOptions& o) {
  return {{"bucket_bytes of the layer-wise layout", std::to_string(o.bucket_bytes())},
          {"max_in_flight of the layer-wise layout", std::to_string(o.max_in_flight())}};
}

// The settings each rank's optimizer would give every parameter: the inner
// factory over all parameters, read and discarded. Each rank builds its
// inner optimizer over a different subset, so only this probe shows the
// ranks the same thing to compare (optimizers allocate state on first step,
// so it holds none).
std::vector<AgreementItem> inner_option_items(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
    const InnerOptimizerFactory& make_inner) {
  if (named_parameters.is_empty()) return {};
  // The probe is built over copies: an optimizer may change its parameters
  // when built (MuonHyperball rescales them to its radius), and only each
  // parameter's owner may do that, once.
  torch::OrderedDict<std::string, at::Tensor> copies;
  for (const auto& item : named_parameters) {
    const auto& p = item.value();
    copies.insert(item.key(), p.defined() ? p.detach().clone().requires_grad_(p.requires_grad()) : p);
  }
  const auto probe = make_inner(copies);
  TORCH_CHECK_VALUE(probe != nullptr, kWho, "make_inner returned no optimizer");
  return detail::optimizer_items(*probe);
}

}  // namespace

double default_parameter_cost(const std::string& /*name*/, const at::Tensor& param) {
  if (param.dim() >= 2) {
    const auto [rows, cols] = matrix_dims(param.sizes());
    return newton_schulz_cost(rows, cols);
  }
  return static_cast<double>(param.numel());
}

LayerwiseOptimizer::LayerwiseOptimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters, Group group,
    const InnerOptimizerFactory& make_inner, LayerwiseOptions options, const ParameterCost& cost)
    : Optimizer(std::vector<OptimizerParamGroup>{},
                std::make_unique<torch::optim::SGDOptions>(0.0)),
      group_(std::move(group)),
      options_(options) {
  TORCH_CHECK_VALUE(group_.valid(), kWho, "group is invalid (default-constructed); pass the "
                    "group to distribute over, e.g. muon::distributed::init_from_env()");
  TORCH_CHECK_VALUE(options_.bucket_bytes() > 0, kWho, "bucket_bytes must be > 0, got ",
                    options_.bucket_bytes());
  TORCH_CHECK_VALUE(options_.max_in_flight() >= 0, kWho, "max_in_flight must be >= 0, got ",
                    options_.max_in_flight());
  TORCH_CHECK_VALUE(make_inner != nullptr, kWho, "make_inner is empty");
  const int64_t world = group_.size();
  const int64_t rank = group_.rank();

  // Every rank must describe the same parameters: compare a signature.
  uint64_t h = detail::kFnvOffset;
  std::vector<double> costs;
  for (const auto& item : named_parameters) {
    const auto& p = item.value();
    TORCH_CHECK_VALUE(p.defined(), kWho, "parameter '", item.key(), "' is undefined");
    h = detail::fnv1a(h, item.key() + ":" + c10::str(p.sizes()) + ":" + c10::toString(p.scalar_type()));
    names_.push_back(item.key());
    params_.push_back(p);
    costs.push_back(cost(item.key(), p));
  }
  signature_ = detail::signature_value(h);
  check_ranks_agree(group_, detail::parameter_items(named_parameters), kWho,
                    "every rank must pass the same named parameters (names, shapes, dtypes, "
                    "order)");
  check_ranks_agree(group_, layout_items(options_), kWho,
                    "every rank must build the layer-wise layout with the same LayerwiseOptions");
  check_ranks_agree(group_, inner_option_items(named_parameters, make_inner), kWho,
                    "every rank must build its optimizer with the same settings");
  check_ranks_agree(group_, detail::value_items(named_parameters), kWho,
                    "replicated parameters must start equal on every rank: broadcast them from "
                    "rank 0 (muon::distributed::broadcast_parameters, as DDP does) before building the "
                    "optimizer");
  owners_ = assign_owners(costs, world);

  // Buckets per rank, in parameter order, each up to bucket_bytes.
  buckets_.assign(static_cast<size_t>(world), {});
  for (const auto i : c10::irange(params_.size())) {
    auto& mine = buckets_[static_cast<size_t>(owners_[i])];
    const auto bytes = static_cast<int64_t>(params_[i].nbytes());
    const int64_t used = mine.empty() ? 0 : mine.back().back().offset + aligned(mine.back().back().bytes);
    if (mine.empty() || used + bytes > options_.bucket_bytes()) {
      mine.push_back({{static_cast<int64_t>(i), 0, bytes}});
    } else {
      mine.back().push_back({static_cast<int64_t>(i), used, bytes});
    }
  }
  size_t buckets = 0;
  for (const auto& b : buckets_) buckets = std::max(buckets, b.size());
  bucket_bytes_.assign(buckets, 0);
  for (const auto& per_rank : buckets_) {
    for (const auto k : c10::irange(per_rank.size())) {
      const auto& last = per_rank[k].back();
      bucket_bytes_[k] = std::max(bucket_bytes_[k], last.offset + aligned(last.bytes));
    }
  }

  torch::OrderedDict<std::string, at::Tensor> owned;
  for (const auto i : c10::irange(params_.size())) {
    if (owners_[i] != rank) continue;
    owned.insert(names_[i], params_[i]);
    owned_.push_back(static_cast<int64_t>(i));
  }
  if (!owned.is_empty()) {
    inner_ = make_inner(owned);
    TORCH_CHECK_VALUE(inner_ != nullptr, kWho, "make_inner returned no optimizer");
    mirror_.mirror(*inner_, param_groups_);
    // step() runs the inner optimizer's checks, once for all buckets and
    // agreed over the group; the inner step skips its own.
    if (auto* guard = muon::step_guard(*inner_)) guard->checked_by_owner(true);
  }
  // The parameters other ranks own, last: zero_grad() must reach every
  // gradient (backward accumulates into all of them on every rank).
  std::vector<at::Tensor> others;
  for (const auto i : c10::irange(params_.size())) {
    if (owners_[i] != rank) others.push_back(params_[i]);
  }
  if (!others.empty()) {
    param_groups_.emplace_back(others, std::make_unique<torch::optim::SGDOptions>(0.0));
  }
  // Every rank takes each owner's values, as after a step: the owner's
  // optimizer may have changed them when built (MuonHyperball's rescale).
  detail::run_pipeline(
      bucket_bytes_.size(), 0, [this](size_t k) { return start_gather(k); },
      [this](size_t k, const std::vector<at::Tensor>& gathered) { unpack(k, gathered); });
}

void LayerwiseOptimizer::sync_options() const {
  if (!inner_) return;
  const bool others = owned_.size() < params_.size();
  mirror_.hand_options(param_groups_, others ? 1 : 0, kWho);
}

PendingCollective LayerwiseOptimizer::start_gather(size_t k) const {
  auto buffer = at::zeros({bucket_bytes_[k]}, at::kByte);
  const auto& mine = buckets_[static_cast<size_t>(group_.rank())];
  if (k < mine.size()) {
    for (const auto& e : mine[k]) {
      buffer.narrow(0, e.offset, e.bytes).copy_(as_bytes(params_[static_cast<size_t>(e.param)].detach().contiguous()));
    }
  }
  return group_.all_gather_async(buffer);
}

void LayerwiseOptimizer::unpack(size_t k, const std::vector<at::Tensor>& gathered) {
  for (const auto r : c10::irange(buckets_.size())) {
    if (static_cast<int>(r) == group_.rank() || k >= buckets_[r].size()) continue;
    for (const auto& e : buckets_[r][k]) {
      auto& p = params_[static_cast<size_t>(e.param)];
      p.detach().copy_(gathered[r].narrow(0, e.offset, e.bytes).view(p.scalar_type()).view(p.sizes()));
    }
  }
}

void LayerwiseOptimizer::check_before_step() {
  sync_options();
  if (!inner_) return;
  if (auto* guard = muon::step_guard(*inner_)) {
    guard->check_before_step();
  } else {
    const auto& groups = inner_->param_groups();
    for (const auto g : c10::irange(groups.size())) {
      muon::detail::check_torch_options(groups[g].options(), kWho, g);
    }
  }
}

void LayerwiseOptimizer::set_agreed_by_layout(bool agreed) {
  StepGuard::set_agreed_by_layout(agreed);
  if (inner_) {
    if (auto* guard = muon::step_guard(*inner_)) guard->set_agreed_by_layout(agreed);
  }
}

std::pair<int64_t, int64_t> LayerwiseOptimizer::max_over_processes(int64_t code) {
  return detail::max_over_groups({&group_}, code);
}

void LayerwiseOptimizer::agree_on_gradients() const {
  // The parameters are replicated and so are their (averaged) gradients:
  // every rank must have a gradient for the same parameters, or a rank that
  // has none for a parameter it owns would drop the others' update of it
  // and every rank would step on. One all-gather of the masks; a difference
  // raises on every rank, naming the first parameter that differs.
  std::vector<int64_t> mask(params_.size());
  for (const auto i : c10::irange(params_.size())) mask[i] = params_[i].grad().defined() ? 1 : 0;
  const auto all = group_.all_gather_ints(mask);
  const auto me = static_cast<size_t>(group_.rank());
  for (const auto i : c10::irange(params_.size())) {
    for (const auto r : c10::irange(all.size())) {
      if (all[r][i] == all[me][i]) continue;
      const auto has = [](int64_t v) { return v != 0 ? "a gradient" : "no gradient"; };
      TORCH_CHECK_VALUE(false, kWho, "on group '", group_.name(), "' parameter '", names_[i],
                        "' has ", has(all[r][i]), " on rank ", r, " and ", has(all[me][i]),
                        " on rank ", me, "; every rank of a layer-wise group must have a gradient "
                        "for the same parameters (nothing of this step was applied)");
    }
  }
}

at::Tensor LayerwiseOptimizer::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss = muon::detail::loss_of(closure);
  // This rank checks the parameters it owns; the outcome is agreed over the
  // group before any rank changes anything.
  static const std::vector<OptimizerParamGroup> kNoGroups;
  const auto& owned_groups = inner_ ? inner_->param_groups() : kNoGroups;
  const auto describe = [&](size_t g, size_t i) {
    const auto* impl = owned_groups[g].params()[i].unsafeGetTensorImpl();
    for (const auto k : owned_) {
      const auto& p = params_[static_cast<size_t>(k)];
      if (p.unsafeGetTensorImpl() == impl) {
        return c10::str("parameter '", names_[static_cast<size_t>(k)], "' (shape ", p.sizes(), ")");
      }
    }
    return muon::detail::describe_param(owned_groups[g].params()[i], g, i);
  };
  if (!admit_step(owned_groups, kWho, [this] { check_before_step(); }, describe)) return loss;
  if (!agreed_by_layout()) agree_on_gradients();
  const auto& mine = buckets_[static_cast<size_t>(group_.rank())];
  const bool overlap = options_.max_in_flight() > 0 && mine.size() > 1;
  if (inner_ && !overlap) inner_->step();

  // With overlap, the inner optimizer steps once per bucket, seeing only that
  // bucket's gradients (optimizers skip parameters without one), so bucket k
  // is gathered while bucket k + 1 is computed. Each parameter still steps
  // exactly once.
  std::vector<at::Tensor> grads;
  if (overlap) {
    for (const auto i : owned_) grads.push_back(params_[static_cast<size_t>(i)].grad());
  }
  auto restore_grads = [&] {
    for (const auto j : c10::irange(grads.size())) {
      params_[static_cast<size_t>(owned_[j])].mutable_grad() = grads[j];
    }
  };
  // Bucket k: the inner step on its gradients (with overlap), then its
  // all-gather, which travels while the next buckets are computed.
  auto start = [&](size_t k) {
    if (overlap && k < mine.size()) {
      for (const auto i : owned_) params_[static_cast<size_t>(i)].mutable_grad() = at::Tensor();
      for (const auto& e : mine[k]) {
        const auto j = std::lower_bound(owned_.begin(), owned_.end(), e.param) - owned_.begin();
        params_[static_cast<size_t>(e.param)].mutable_grad() = grads[static_cast<size_t>(j)];
      }
      inner_->step();
    }
    return start_gather(k);
  };
  auto finish = [&](size_t k, const std::vector<at::Tensor>& gathered) { unpack(k, gathered); };
  try {
    detail::run_pipeline(bucket_bytes_.size(),
                         static_cast<size_t>(std::max<int64_t>(options_.max_in_flight(), 0)), start,
                         finish);
  } catch (...) {
    restore_grads();
    throw;
  }
  restore_grads();
  return loss;
}

int64_t LayerwiseOptimizer::state_bytes() const {
  return inner_ ? muon::optimizer_state_bytes(*inner_) : 0;
}

void LayerwiseOptimizer::save(OutputArchive& archive) const {
  archive.write("layerwise_format", c10::IValue(int64_t{1}));
  archive.write("world", c10::IValue(static_cast<int64_t>(group_.size())));
  archive.write("rank", c10::IValue(static_cast<int64_t>(group_.rank())));
  archive.write("signature", c10::IValue(signature_));
  archive.write("owners", c10::IValue(c10::List<int64_t>(owners_)));
  if (inner_) {
    OutputArchive inner(archive.compilation_unit());
    sync_options();  // options as the user last set them (an LR scheduler acts on ours)
    inner_->save(inner);
    archive.write("inner", inner);
  }
}

void LayerwiseOptimizer::load(InputArchive& archive) {
  c10::IValue v;
  TORCH_CHECK_VALUE(archive.try_read("layerwise_format", v) && v.toInt() == 1, kWho,
                    "the archive holds ", muon::detail::describe_archive(archive),
                    "; this optimizer is muon::distributed::LayerwiseOptimizer, rank ", group_.rank(),
                    " of ", group_.size(), ". Load an archive written in the same layout and "
                    "world size");
  auto expect = [&](const char* key, int64_t mine, const char* what) {
    c10::IValue value;
    archive.read(key, value);
    TORCH_CHECK_VALUE(value.toInt() == mine, kWho, "the archive was written with ", what, " ",
                      value.toInt(), ", this optimizer has ", mine,
                      "; load each rank's own archive into the same layout");
  };
  expect("world", group_.size(), "world size");
  expect("rank", group_.rank(), "rank");
  expect("signature", signature_, "parameter signature");
  c10::IValue owners;
  archive.read("owners", owners);
  TORCH_CHECK_VALUE(owners.toIntVector() == owners_, kWho,
                    "the archive's parameter owners differ from this optimizer's");
  if (inner_) {
    InputArchive inner;
    archive.read("inner", inner);
    inner_->load(inner);
    mirror_.take_options(param_groups_);
  }
}

void all_reduce_gradients(const std::vector<at::Tensor>& params, const Group& group,
                          int64_t bucket_bytes) {
  TORCH_CHECK_VALUE(bucket_bytes > 0, "[muon::distributed::all_reduce_gradients] bucket_bytes must be "
                    "> 0, got ", bucket_bytes);
  for (const auto i : c10::irange(params.size())) {
    TORCH_CHECK_VALUE(params[i].grad().defined(), "[muon::distributed::all_reduce_gradients] parameter ",
                      i, " (shape ", params[i].sizes(), ") has no gradient");
  }
  if (group.size() == 1) return;
  at::NoGradGuard no_grad;
  const double scale = 1.0 / group.size();
  // Buckets of consecutive same-dtype gradients.
  size_t begin = 0;
  while (begin < params.size()) {
    const auto dtype = params[begin].grad().scalar_type();
    size_t end = begin;
    int64_t bytes = 0;
    std::vector<at::Tensor> flat;
    while (end < params.size() && params[end].grad().scalar_type() == dtype &&
           (flat.empty() || bytes + static_cast<int64_t>(params[end].grad().nbytes()) <= bucket_bytes)) {
      flat.push_back(params[end].grad().reshape({-1}));
      bytes += static_cast<int64_t>(params[end].grad().nbytes());
      ++end;
    }
    auto bucket = at::cat(flat);
    group.all_reduce_(bucket);
    bucket.mul_(scale);
    int64_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      auto& g = params[i].mutable_grad();
      g.copy_(bucket.narrow(0, offset, g.numel()).view(g.sizes()));
      offset += g.numel();
    }
    begin = end;
  }
}

}  // namespace muon::distributed
