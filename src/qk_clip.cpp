// QK-clip (MuonClip): γ per head from the step's maximum logits and the
// row-wise rescaling of query and key projections.
#include "muon/qk_clip.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "util/names.h"

namespace muon {
namespace {

constexpr const char* kWho = "[muon::qk_clip_] ";

constexpr detail::EnumName<QkvRows> kRowNames[] = {
    {QkvRows::kQuery, "query"},
    {QkvRows::kKey, "key"},
    {QkvRows::kGrouped, "grouped"},
    {QkvRows::kBlocked, "blocked"},
};

void check_max_logits(const at::Tensor& max_logits, const QkClipOptions& o) {
  TORCH_CHECK_VALUE(max_logits.defined(), kWho, "max_logits is undefined");
  TORCH_CHECK_VALUE(max_logits.dim() == 1 && max_logits.numel() == o.num_heads(), kWho,
                    "max_logits must be 1-D with num_heads = ", o.num_heads(),
                    " elements, got shape ", max_logits.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(max_logits.scalar_type()), kWho,
                    "max_logits must be floating, got ", max_logits.scalar_type());
  const auto m = max_logits.detach().to(at::kCPU, at::kDouble).contiguous();
  const double* v = m.data_ptr<double>();
  for (const auto h : c10::irange(o.num_heads())) {
    // NaN's sign bit is arbitrary (a difference of NaNs prints "-nan"): name it one way.
    TORCH_CHECK_VALUE(std::isfinite(v[h]), kWho, "max_logits[", h, "] must be finite, got ",
                      std::isnan(v[h]) ? std::string("nan") : c10::str(v[h]));
  }
}

// "begin, end" of the rows [begin, begin + count), whose end may not fit int64.
std::string row_end_text(int64_t row_begin, int64_t count) {
  int64_t end = 0;
  if (__builtin_add_overflow(row_begin, count, &end)) {
    return c10::str(row_begin, ", ", row_begin, " + ", count);
  }
  return c10::str(row_begin, ", ", end);
}

}  // namespace

MUON_DEFINE_ENUM_NAMES(QkvRows, parse_qkv_rows, kRowNames, kWho, "qkv rows");

void QkClipOptions::validate() const {
  TORCH_CHECK_VALUE(num_heads_ >= 1, kWho, "num_heads must be >= 1, got ", num_heads_);
  TORCH_CHECK_VALUE(head_dim_ >= 1, kWho, "head_dim must be >= 1, got ", head_dim_);
  TORCH_CHECK_VALUE(num_kv_heads_ >= 0 && (num_kv_heads_ == 0 || num_heads_ % num_kv_heads_ == 0),
                    kWho, "num_kv_heads must divide num_heads = ", num_heads_,
                    " (0: num_heads), got ", num_kv_heads_);
  TORCH_CHECK_VALUE(std::isfinite(threshold_) && threshold_ > 0, kWho,
                    "threshold must be finite and > 0, got ", threshold_);
  TORCH_CHECK_VALUE(alpha_ >= 0 && alpha_ <= 1, kWho, "alpha must be in [0, 1], got ", alpha_);
  // The largest weight, a fused QKV projection, has (H + 2G)·d rows: each
  // row index of every layout must fit int64 (G <= H, so H·d and G·d do).
  const int64_t g = kv_heads();
  int64_t heads = 0;
  int64_t rows = 0;
  const bool overflow = __builtin_mul_overflow(g, int64_t{2}, &heads) ||
                        __builtin_add_overflow(heads, num_heads_, &heads) ||
                        __builtin_mul_overflow(heads, head_dim_, &rows);
  TORCH_CHECK_VALUE(!overflow, kWho, "num_heads ", num_heads_, ", num_kv_heads ", g,
                    " and head_dim ", head_dim_,
                    ": a fused weight's (num_heads + 2 * num_kv_heads) * head_dim rows exceed "
                    "int64");
}

int64_t qk_clip_global_rows(QkvRows rows, const QkClipOptions& o) {
  o.validate();  // no product below overflows
  const int64_t h = o.num_heads();
  const int64_t g = o.kv_heads();
  switch (rows) {
    case QkvRows::kQuery:
      return h * o.head_dim();
    case QkvRows::kKey:
      return g * o.head_dim();
    case QkvRows::kGrouped:
    case QkvRows::kBlocked:
      return (h + 2 * g) * o.head_dim();
  }
  TORCH_INTERNAL_ASSERT(false, "unknown QkvRows");
}

at::Tensor qk_clip_gamma(const at::Tensor& max_logits, const QkClipOptions& o) {
  o.validate();
  check_max_logits(max_logits, o);
  const int64_t r = o.num_heads() / o.kv_heads();
  const auto m = max_logits.detach().to(at::kCPU, at::kDouble).contiguous();
  auto gamma = at::ones({o.num_heads()}, at::kDouble);
  const double* v = m.data_ptr<double>();
  double* out = gamma.data_ptr<double>();
  for (const auto g : c10::irange(o.kv_heads())) {
    double largest = v[g * r];
    for (const auto i : c10::irange(1, r)) largest = std::max(largest, v[g * r + i]);
    // Only a maximum above τ (> 0) is clipped: γ in (0, 1), never negative.
    const double gamma_g = largest > o.threshold() ? o.threshold() / largest : 1.0;
    for (const auto i : c10::irange(r)) out[g * r + i] = gamma_g;
  }
  return gamma;
}

at::Tensor qk_clip_row_factors(const at::Tensor& gamma, QkvRows rows, const QkClipOptions& o) {
  return qk_clip_row_factors(gamma, rows, o, 0, qk_clip_global_rows(rows, o));
}

at::Tensor qk_clip_row_factors(const at::Tensor& gamma, QkvRows rows, const QkClipOptions& o,
                               int64_t row_begin, int64_t count) {
  const int64_t global = qk_clip_global_rows(rows, o);  // validates o
  TORCH_CHECK_VALUE(gamma.defined() && gamma.dim() == 1 && gamma.numel() == o.num_heads(), kWho,
                    "gamma must be 1-D with num_heads = ", o.num_heads(), " elements");
  TORCH_CHECK_VALUE(row_begin >= 0 && count >= 0 && row_begin <= global - count, kWho, "rows [",
                    row_end_text(row_begin, count), ") are not rows of a ", to_string(rows),
                    " weight of ", global, " rows");
  const int64_t h = o.num_heads();
  const int64_t g = o.kv_heads();
  const int64_t r = h / g;
  const int64_t d = o.head_dim();
  const auto gm = gamma.detach().to(at::kCPU, at::kDouble).contiguous();
  const double* gv = gm.data_ptr<double>();
  auto q = [&](int64_t i) { return gv[i] == 1.0 ? 1.0 : std::pow(gv[i], o.alpha()); };
  // A key head's factor: its group's γ (the γ of any of its query heads).
  auto k = [&](int64_t j) { return gv[j * r] == 1.0 ? 1.0 : std::pow(gv[j * r], 1.0 - o.alpha()); };
  // The factor of global row x (x < global: no product or index below overflows).
  auto factor = [&](int64_t x) {
    const int64_t head = x / d;
    switch (rows) {
      case QkvRows::kQuery:
        return q(head);
      case QkvRows::kKey:
        return k(head);
      case QkvRows::kGrouped: {
        const int64_t group = head / (r + 2);
        const int64_t slot = head % (r + 2);
        return slot < r ? q(group * r + slot) : slot == r ? k(group) : 1.0;
      }
      case QkvRows::kBlocked:
        return head < h ? q(head) : head < h + g ? k(head - h) : 1.0;
    }
    TORCH_INTERNAL_ASSERT(false, "unknown QkvRows");
  };
  auto factors = at::empty({count}, at::kDouble);
  double* f = factors.data_ptr<double>();
  for (const auto i : c10::irange(count)) f[i] = factor(row_begin + i);
  return factors;
}

void scale_rows_(at::Tensor& tensor, const at::Tensor& factors) {
  TORCH_CHECK_VALUE(tensor.defined() && tensor.dim() >= 1,
                    "[muon::scale_rows_] tensor must be "
                    "defined with at least 1 dimension");
  TORCH_CHECK_VALUE(at::isFloatingType(tensor.scalar_type()),
                    "[muon::scale_rows_] tensor must be "
                    "floating, got ",
                    tensor.scalar_type());
  TORCH_CHECK_VALUE(factors.defined() && factors.dim() == 1 && factors.numel() == tensor.size(0),
                    "[muon::scale_rows_] factors must be 1-D with one element per row (",
                    tensor.size(0), "), got shape ",
                    factors.defined() ? factors.sizes() : at::IntArrayRef{});
  TORCH_CHECK_VALUE(at::isfinite(factors).all().item<bool>(),
                    "[muon::scale_rows_] factors must be finite");
  at::NoGradGuard no_grad;
  const auto rows = (factors != 1.0).nonzero().squeeze(1).to(tensor.device());
  if (rows.numel() == 0) return;
  std::vector<int64_t> shape(static_cast<size_t>(tensor.dim()), 1);
  shape[0] = rows.numel();
  // The factor rounded to the tensor's dtype, then one rounded product per element.
  const auto f = factors.detach()
                     .index_select(0, rows.to(factors.device()))
                     .to(tensor.device(), tensor.scalar_type())
                     .view(shape);
  tensor.index_copy_(0, rows, tensor.index_select(0, rows) * f);
}

at::Tensor qk_clip_(const std::vector<QkClipWeight>& weights, const at::Tensor& max_logits,
                    const QkClipOptions& o) {
  // Everything is checked before the first weight changes.
  const auto gamma = qk_clip_gamma(max_logits, o);
  for (const auto i : c10::irange(weights.size())) {
    const auto& w = weights[i];
    TORCH_CHECK_VALUE(w.weight().defined() && w.weight().dim() >= 1, kWho, "weights[", i,
                      "] must be a defined tensor with at least 1 dimension");
    TORCH_CHECK_VALUE(at::isFloatingType(w.weight().scalar_type()), kWho, "weights[", i,
                      "] must be floating, got ", w.weight().scalar_type());
    const int64_t global = qk_clip_global_rows(w.rows(), o);
    const int64_t n = w.weight().size(0);
    TORCH_CHECK_VALUE(w.row_begin() >= 0 && w.row_begin() <= global - n, kWho, "weights[", i,
                      "] holds rows [", row_end_text(w.row_begin(), n), ") of a ",
                      to_string(w.rows()), " weight of ", global, " rows (num_heads ",
                      o.num_heads(), ", num_kv_heads ", o.kv_heads(), ", head_dim ", o.head_dim(),
                      ")");
  }
  if ((gamma == 1.0).all().item<bool>()) return gamma;
  for (const auto& w : weights) {
    const auto factors = qk_clip_row_factors(gamma, w.rows(), o, w.row_begin(), w.weight().size(0));
    auto weight = w.weight();
    scale_rows_(weight, factors);
  }
  return gamma;
}

at::Tensor qk_clip_(at::Tensor& q_weight, at::Tensor& k_weight, const at::Tensor& max_logits,
                    const QkClipOptions& options) {
  return qk_clip_({QkClipWeight(q_weight, QkvRows::kQuery), QkClipWeight(k_weight, QkvRows::kKey)},
                  max_logits, options);
}

}  // namespace muon
