// Megatron-style tensor-parallel linear layers: the two autograd
// boundaries (f: identity / all-reduce, g: all-reduce / identity), the
// column- and row-parallel modules, and the map of their shards by name.
#include "muon/distributed/layouts/tensor_parallel_layers.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "util/names.h"

namespace muon::distributed {
namespace {

// "[1, 2, 3]", at most 8 entries shown (a message's length stays bounded).
std::string list_text(const std::vector<int64_t>& values) {
  constexpr size_t kShown = 8;
  std::string out = "[";
  for (size_t i = 0; i < values.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  if (values.size() > kShown) out += ", ... (" + std::to_string(values.size()) + " entries)";
  return out + "]";
}

std::string shape_text(const at::Tensor& t) { return list_text(t.sizes().vec()); }

void check_input(const at::Tensor& x, const Group& tp, const char* who) {
  TORCH_CHECK_VALUE(x.defined(), "[muon::distributed::", who, "] x is undefined");
  TORCH_CHECK_VALUE(tp.valid(), "[muon::distributed::", who,
                    "] tp is an invalid (default-constructed) Group");
}

// The backward of both boundaries, as an autograd Node of its own so that it
// can hold the Group. (torch::autograd::Function keeps its state in
// AutogradContext::saved_data, which holds only IValues, and a Group is not
// one.) The node is owned by the graph: it lives exactly as long as the
// output that refers to it, and the Group (a shared handle) with it; no
// registry, nothing to clean up when backward never runs.
//  - all_reduce (copy_to_tensor_parallel): the gradient summed over tp.
//    An undefined incoming gradient is summed as zeros: every rank must
//    join the collective, whatever its gradient.
//  - identity (reduce_from_tensor_parallel): the gradient as it comes.
class TensorParallelBackward final : public torch::autograd::Node {
 public:
  TensorParallelBackward(Group tp, bool all_reduce, const at::Tensor& input)
      : tp_(std::move(tp)),
        all_reduce_(all_reduce),
        sizes_(input.sizes().vec()),
        options_(input.options()) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor grad = grads.at(0);
    if (!all_reduce_) return {grad};
    at::Tensor sum = grad.defined() ? grad.clone(at::MemoryFormat::Contiguous)
                                    : at::zeros(sizes_, options_);
    tp_.all_reduce_(sum);
    return {sum};
  }

  std::string name() const override {
    return all_reduce_ ? "muon::distributed::CopyToTensorParallelBackward"
                       : "muon::distributed::ReduceFromTensorParallelBackward";
  }

 private:
  Group tp_;
  bool all_reduce_;
  std::vector<int64_t> sizes_;
  at::TensorOptions options_;
};

// `output` (a new tensor that autograd has not seen) becomes the output of a
// TensorParallelBackward node whose input edge is `input`'s, as the
// generated code of an ATen operator does (collect_next_edges, set_history).
at::Tensor attach_backward(at::Tensor output, const at::Tensor& input, const Group& tp,
                           bool all_reduce) {
  std::shared_ptr<TensorParallelBackward> node(new TensorParallelBackward(tp, all_reduce, input),
                                               torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(output, node);
  return output;
}

// The whole (out, in) weight and (out) bias as torch::nn::Linear(in, out)
// draws them (LinearImpl::reset_parameters), from the global generator.
std::pair<at::Tensor, at::Tensor> linear_init(int64_t in_features, int64_t out_features,
                                              bool with_bias) {
  at::NoGradGuard no_grad;
  at::Tensor weight = at::empty({out_features, in_features});
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  at::Tensor bias;
  if (with_bias) {
    bias = at::empty({out_features});
    const auto fan_in = std::get<0>(torch::nn::init::_calculate_fan_in_and_fan_out(weight));
    const auto bound = 1 / std::sqrt(fan_in);
    torch::nn::init::uniform_(bias, -bound, bound);
  }
  return {weight, bias};
}

// The sizes of the blocks: `given`, or balanced when empty; checked.
std::vector<int64_t> block_sizes(std::vector<int64_t> given, int64_t total, const Group& tp,
                                 const char* who, const char* arg, const char* total_name) {
  if (given.empty()) return balanced_split_sizes(total, tp.size());
  const bool nonnegative =
      std::all_of(given.begin(), given.end(), [](int64_t v) { return v >= 0; });
  TORCH_CHECK_VALUE(static_cast<int64_t>(given.size()) == tp.size() && nonnegative &&
                        std::accumulate(given.begin(), given.end(), int64_t{0}) == total,
                    "[muon::distributed::", who, "] ", arg, " must have one entry >= 0 per rank of tp (",
                    tp.size(), ") summing to ", total_name, " (", total, "), got ",
                    list_text(given));
  return given;
}

void check_construction(int64_t in_features, int64_t out_features, const Group& tp,
                        const char* who) {
  TORCH_CHECK_VALUE(in_features >= 1, "[muon::distributed::", who, "] in_features must be >= 1, got ",
                    in_features);
  TORCH_CHECK_VALUE(out_features >= 1, "[muon::distributed::", who, "] out_features must be >= 1, got ",
                    out_features);
  TORCH_CHECK_VALUE(tp.valid(), "[muon::distributed::", who,
                    "] tp is an invalid (default-constructed) Group");
}

// Checks the whole tensors given to load_full.
void check_full(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& own_bias,
                int64_t in_features, int64_t out_features, const char* who) {
  TORCH_CHECK_VALUE(weight.defined() && weight.dim() == 2 && weight.size(0) == out_features &&
                        weight.size(1) == in_features,
                    "[muon::distributed::", who, "] load_full: weight must have shape [", out_features,
                    ", ", in_features, "], got ",
                    weight.defined() ? shape_text(weight) : std::string("undefined"));
  if (!bias.defined()) return;
  TORCH_CHECK_VALUE(own_bias.defined(), "[muon::distributed::", who,
                    "] load_full: bias given to a layer built with bias = false");
  TORCH_CHECK_VALUE(bias.dim() == 1 && bias.size(0) == out_features, "[muon::distributed::", who,
                    "] load_full: bias must have shape [", out_features, "], got ",
                    shape_text(bias));
}

// The names a layer splitting dimension `split_dim` of its weight goes by in
// its messages and its printout.
struct SplitNames {
  const char* layer;       // "ColumnParallelLinear"
  const char* sizes;       // "rows_per_rank": the constructor's argument
  const char* split_total; // "out_features": the size of the split dimension
};

SplitNames split_names(int64_t split_dim) {
  if (split_dim == 0) return {"ColumnParallelLinear", "rows_per_rank", "out_features"};
  return {"RowParallelLinear", "cols_per_rank", "in_features"};
}

}  // namespace

at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const Group& tp) {
  check_input(x, tp, "copy_to_tensor_parallel");
  if (tp.size() == 1 || !torch::autograd::compute_requires_grad(x)) return x;
  // detach(): the same data and version counter as x (no copy), no history;
  // the node then makes it an output whose gradient flows to x, summed.
  return attach_backward(x.detach(), x, tp, /*all_reduce=*/true);
}

at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const Group& tp) {
  check_input(x, tp, "reduce_from_tensor_parallel");
  if (tp.size() == 1) return x;
  at::Tensor sum;
  {
    at::NoGradGuard no_grad;
    sum = x.detach().clone(at::MemoryFormat::Contiguous);
    tp.all_reduce_(sum);
  }
  if (!torch::autograd::compute_requires_grad(x)) return sum;
  return attach_backward(sum, x, tp, /*all_reduce=*/false);
}

TensorParallelModule::~TensorParallelModule() = default;

std::map<std::string, TensorParallelShard> tensor_parallel_shards(const torch::nn::Module& root) {
  std::map<std::string, TensorParallelShard> shards;
  const auto collect = [&shards](const std::string& prefix, const torch::nn::Module& module) {
    const auto* tp_module = dynamic_cast<const TensorParallelModule*>(&module);
    if (tp_module == nullptr) return;
    const auto own = module.named_parameters(/*recurse=*/false);
    for (auto& [name, shard] : tp_module->tensor_parallel_shards()) {
      const std::string full = prefix.empty() ? name : prefix + "." + name;
      TORCH_CHECK_VALUE(own.contains(name), "[muon::distributed::tensor_parallel_shards] module '",
                        muon::detail::clip(prefix), "' declares a shard for '",
                        muon::detail::clip(name), "', which is not one of its parameters");
      shards.insert_or_assign(full, shard);
    }
  };
  collect("", root);
  // Submodules only: named_modules(include_self = true) needs root to be
  // held by a shared_ptr.
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    collect(item.key(), *item.value());
  }
  return shards;
}

std::vector<int64_t> rows_per_rank_by_heads(int64_t heads, int64_t rows_per_head, int64_t tp_size) {
  TORCH_CHECK_VALUE(heads >= 1, "[muon::distributed::rows_per_rank_by_heads] heads must be >= 1, got ",
                    heads);
  TORCH_CHECK_VALUE(rows_per_head >= 1,
                    "[muon::distributed::rows_per_rank_by_heads] rows_per_head must be >= 1, got ",
                    rows_per_head);
  TORCH_CHECK_VALUE(tp_size >= 1,
                    "[muon::distributed::rows_per_rank_by_heads] tp_size must be >= 1, got ", tp_size);
  auto rows = balanced_split_sizes(heads, tp_size);
  for (auto& r : rows) r *= rows_per_head;
  return rows;
}

// ---- ParallelLinearBase ---------------------------------------------------------

ParallelLinearBase::ParallelLinearBase(int64_t in_features, int64_t out_features, Group tp,
                                       bool bias, std::vector<int64_t> sizes_per_rank,
                                       int64_t split_dim)
    : in_features_(in_features),
      out_features_(out_features),
      tp_(std::move(tp)),
      split_dim_(split_dim) {
  const SplitNames names = split_names(split_dim_);
  check_construction(in_features, out_features, tp_, names.layer);
  const int64_t split_total = split_dim_ == 0 ? out_features : in_features;
  sizes_per_rank_ = block_sizes(std::move(sizes_per_rank), split_total, tp_, names.layer,
                                names.sizes, names.split_total);
  offset_ = split_offset(sizes_per_rank_, tp_.rank());
  const int64_t size = sizes_per_rank_[static_cast<size_t>(tp_.rank())];
  auto [w, b] = linear_init(in_features, out_features, bias);
  weight = register_parameter(
      "weight", w.narrow(split_dim_, offset_, size).clone(at::MemoryFormat::Contiguous));
  if (!bias) return;
  // The bias goes with the output features: split with the rows, whole when
  // the columns are split.
  this->bias = register_parameter(
      "bias", split_dim_ == 0 ? b.narrow(0, offset_, size).clone(at::MemoryFormat::Contiguous) : b);
}

void ParallelLinearBase::load_full(const at::Tensor& full_weight, const at::Tensor& full_bias) {
  check_full(full_weight, full_bias, bias, in_features_, out_features_,
             split_names(split_dim_).layer);
  at::NoGradGuard no_grad;
  const int64_t size = weight.size(split_dim_);
  weight.copy_(full_weight.narrow(split_dim_, offset_, size));
  if (!full_bias.defined()) return;
  bias.copy_(split_dim_ == 0 ? full_bias.narrow(0, offset_, size) : full_bias);
}

std::vector<std::pair<std::string, TensorParallelShard>>
ParallelLinearBase::tensor_parallel_shards() const {
  std::vector<std::pair<std::string, TensorParallelShard>> shards;
  shards.emplace_back("weight",
                      TensorParallelShard({out_features_, in_features_}, split_dim_, tp_));
  if (split_dim_ == 0 && bias.defined()) {
    shards.emplace_back("bias", TensorParallelShard({out_features_}, 0, tp_));
  }
  return shards;
}

void ParallelLinearBase::pretty_print(std::ostream& stream) const {
  const SplitNames names = split_names(split_dim_);
  stream << "muon::distributed::" << names.layer << "(in_features=" << in_features_
         << ", out_features=" << out_features_ << ", " << names.sizes << "="
         << list_text(sizes_per_rank_) << ", tp=" << tp_.name() << " rank " << tp_.rank() << "/"
         << tp_.size() << ", bias=" << (bias.defined() ? "true" : "false") << ")";
}

// ---- ColumnParallelLinear -------------------------------------------------------

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                                                   Group tp, bool bias,
                                                   std::vector<int64_t> rows_per_rank)
    : ParallelLinearBase(in_features, out_features, std::move(tp), bias, std::move(rows_per_rank),
                         /*split_dim=*/0) {}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  return at::linear(copy_to_tensor_parallel(x, tp_), weight, bias);
}

// ---- RowParallelLinear ----------------------------------------------------------

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_features, int64_t out_features, Group tp,
                                             bool bias, std::vector<int64_t> cols_per_rank)
    : ParallelLinearBase(in_features, out_features, std::move(tp), bias, std::move(cols_per_rank),
                         /*split_dim=*/1) {}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x_local) {
  // One rank: torch::nn::Linear's own computation (the bias inside the GEMM).
  if (tp_.size() == 1) return at::linear(x_local, weight, bias);
  auto y = reduce_from_tensor_parallel(at::linear(x_local, weight), tp_);
  return bias.defined() ? y + bias : y;
}

}  // namespace muon::distributed
