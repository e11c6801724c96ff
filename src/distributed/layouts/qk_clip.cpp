// QK-clip over a Layout: the MAX all-reduce of the maxima and the row
// scaling of parameters and master rows.
#include "muon/distributed/layouts/qk_clip.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <string>
#include <vector>

#include "util/names.h"

namespace muon::distributed {

at::Tensor all_reduce_max(const at::Tensor& values, const Group& group) {
  TORCH_CHECK_VALUE(values.defined(), "[muon::distributed::all_reduce_max] values is undefined");
  auto local = values.detach().to(at::kCPU, at::kDouble).contiguous().clone();
  if (!group.valid() || group.size() == 1) return local;
  const auto all = group.all_gather(local.to(group.device()));  // NCCL: on the GPU
  // at::maximum propagates NaN: a NaN on any rank is seen by every rank.
  for (const auto& other : all) local = at::maximum(local, other.to(at::kCPU));
  return local;
}

at::Tensor qk_clip_(const std::vector<QkClipWeight>& weights, const at::Tensor& max_logits,
                    const QkClipOptions& options, const Group& group) {
  options.validate();
  TORCH_CHECK_VALUE(
      max_logits.defined() && max_logits.dim() == 1 && max_logits.numel() == options.num_heads(),
      "[muon::distributed::qk_clip_] max_logits must be 1-D with num_heads = ", options.num_heads(),
      " elements, got shape ", max_logits.defined() ? max_logits.sizes() : at::IntArrayRef{});
  return muon::qk_clip_(weights, all_reduce_max(max_logits, group), options);
}

at::Tensor qk_clip_(Layout& layout, const std::vector<QkClipParam>& params,
                    const at::Tensor& max_logits, const QkClipOptions& options,
                    const Group& group) {
  constexpr const char* kWho = "[muon::distributed::qk_clip_] ";
  options.validate();
  TORCH_CHECK_VALUE(
      max_logits.defined() && max_logits.dim() == 1 && max_logits.numel() == options.num_heads(),
      kWho, "max_logits must be 1-D with num_heads = ", options.num_heads(),
      " elements, got shape ", max_logits.defined() ? max_logits.sizes() : at::IntArrayRef{});
  const auto reduced = all_reduce_max(max_logits, group);
  const auto gamma = qk_clip_gamma(reduced, options);
  std::vector<at::Tensor> factors;
  for (const auto i : c10::irange(params.size())) {
    const auto& p = params[i];
    const auto* tensor = layout.parameters().find(p.name);
    TORCH_CHECK_VALUE(tensor != nullptr, kWho, "params[", i,
                      "]: the layout has no parameter named '", muon::detail::clip(p.name), "'");
    const int64_t global = qk_clip_global_rows(p.rows, options);
    const int64_t n = tensor->dim() >= 1 ? tensor->size(0) : 0;
    int64_t end = 0;  // printed only when it fits int64
    const bool fits = !__builtin_add_overflow(p.row_begin, n, &end);
    TORCH_CHECK_VALUE(tensor->dim() >= 1 && p.row_begin >= 0 && p.row_begin <= global - n, kWho,
                      "params[", i, "] '", muon::detail::clip(p.name), "' holds rows [",
                      p.row_begin, ", ", fits ? c10::str(end) : c10::str(p.row_begin, " + ", n),
                      ") of a ", to_string(p.rows), " weight of ", global, " rows");
    factors.push_back(qk_clip_row_factors(gamma, p.rows, options, p.row_begin, n));
  }
  if ((gamma == 1.0).all().item<bool>()) return gamma;
  for (const auto i : c10::irange(params.size())) layout.scale_rows(params[i].name, factors[i]);
  return gamma;
}

}  // namespace muon::distributed
