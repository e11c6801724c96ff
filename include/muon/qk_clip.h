#pragma once

/// QK-clip (MuonClip; Kimi Team, "Kimi K2: Open Agentic Intelligence",
/// arXiv 2507.20534, §2.1): after each optimizer step, the query and key
/// projections of every attention head whose largest pre-softmax logit of
/// the step exceeded a threshold τ are scaled down so that the same inputs
/// would give τ:
///
///     S_max^h = max over the batch of q_i·k_j / √d   (positions attention uses)
///     γ_h     = τ / S_max^h if S_max^h > τ, else 1
///     W_q^h ← γ_h^α · W_q^h,   W_k^h ← γ_h^(1−α) · W_k^h,   V untouched.
///
/// Every logit of the head is scaled by exactly γ_h (q by γ^α, k by γ^(1−α)),
/// so the step's maximum would be τ. Grouped-query attention (num_kv_heads <
/// num_heads; query group g = the num_heads / num_kv_heads consecutive query
/// heads sharing key head g): as Megatron-Core (SelfAttention.clip_qk,
/// megatron/core/transformer/attention.py), one γ per group from the largest
/// maximum of its heads, γ_g = min(1, τ / max_{h∈g} S_max^h); every query
/// head of the group is scaled by γ_g^α and the group's key head by
/// γ_g^(1−α), so each logit of the group is scaled by γ_g.
///
///     // after optimizer.step(), with the step's maxima (num_heads,)
///     auto gamma = muon::qk_clip_(
///         {muon::QkClipWeight(attn->qkv->weight, muon::QkvRows::kGrouped)}, max_logits,
///         muon::QkClipOptions(/*num_heads=*/8, /*head_dim=*/64).threshold(100));
///
/// The distributed layer (muon/distributed/layouts/qk_clip.h) all-reduces the maxima
/// with MAX and scales a layout's parameters together with its master rows.
#include <ATen/ATen.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "muon/enum_names.h"

namespace muon {

/// Which rows of a weight hold which heads (the weight's dim 0 is its output
/// features; d = head_dim, H = num_heads, G = num_kv_heads, r = H / G).
enum class QkvRows {
  /// A separate query projection: H·d rows, head h's rows [h·d, (h+1)·d).
  kQuery,
  /// A separate key projection: G·d rows, key head g's rows [g·d, (g+1)·d).
  kKey,
  /// A fused QKV projection stored per query group: (H + 2G)·d rows, group
  /// g's (r + 2)·d rows [q heads of g; k_g; v_g]. Megatron-Core's
  /// `linear_qkv`; with G = H, per head [q_h; k_h; v_h] (examples/train_gpt's
  /// fused weight). A tensor-parallel rank's heads are one block of rows.
  kGrouped,
  /// A fused QKV projection stored blocked: (H + 2G)·d rows [Q; K; V].
  kBlocked,
};

/// "query" | "key" | "grouped" | "blocked".
MUON_ENUM_NAMES(QkvRows, parse_qkv_rows);

/// The attention's shape and the clip's settings.
struct QkClipOptions {
  QkClipOptions(int64_t num_heads, int64_t head_dim) : num_heads_(num_heads), head_dim_(head_dim) {}
  /// Query heads H (>= 1).
  TORCH_ARG(int64_t, num_heads);
  /// Rows per head d (>= 1).
  TORCH_ARG(int64_t, head_dim);
  /// Key/value heads G (query groups); 0 (the default): num_heads. Must divide num_heads.
  TORCH_ARG(int64_t, num_kv_heads) = 0;
  /// τ: the largest logit a head keeps (finite, > 0). Kimi K2 uses 100.
  TORCH_ARG(double, threshold) = 100.0;
  /// α: the share of the scale the query takes (γ^α on q, γ^(1−α) on k), in [0, 1].
  TORCH_ARG(double, alpha) = 0.5;

 public:
  /// G with the default resolved.
  int64_t kv_heads() const { return num_kv_heads_ > 0 ? num_kv_heads_ : num_heads_; }
  /// Raises c10::ValueError naming the first invalid field and its value,
  /// or all three counts when a fused weight's (H + 2G)·d rows exceed int64.
  void validate() const;
};

/// This process's rows of one weight that holds query or key rows: the rows
/// [row_begin, row_begin + weight.size(0)) of the global weight `rows`
/// describes (whole: row_begin 0 and every row; a tensor-parallel rank's
/// heads; a row shard, where a head may straddle the shard's edges).
struct QkClipWeight {
  QkClipWeight(at::Tensor weight, QkvRows rows, int64_t row_begin = 0)
      : weight_(std::move(weight)), rows_(rows), row_begin_(row_begin) {}
  TORCH_ARG(at::Tensor, weight);
  TORCH_ARG(QkvRows, rows);
  TORCH_ARG(int64_t, row_begin) = 0;
};

/// Rows of the global weight `rows` describes.
int64_t qk_clip_global_rows(QkvRows rows, const QkClipOptions& options);

/// γ per query head (float64, num_heads): for each query group, 1 when its
/// largest maximum is at most τ, else τ over it (see the top of this
/// header). `max_logits`: the step's maximum logit of every query head (1-D,
/// num_heads, floating, finite; a negative maximum needs no clip). Raises
/// c10::ValueError naming the argument and its value for invalid options or
/// maxima.
at::Tensor qk_clip_gamma(const at::Tensor& max_logits, const QkClipOptions& options);

/// The factor of every row of the global weight `rows` describes (float64,
/// qk_clip_global_rows): γ^α on query rows, γ^(1−α) on key rows (the
/// group's γ), 1 on value rows. `gamma` as qk_clip_gamma returns it.
at::Tensor qk_clip_row_factors(const at::Tensor& gamma, QkvRows rows, const QkClipOptions& options);
/// The factors of the global rows [row_begin, row_begin + count) only
/// (float64, count): qk_clip_row_factors(gamma, rows, options).narrow(0,
/// row_begin, count) without the global rows. A range outside the global
/// weight raises c10::ValueError.
at::Tensor qk_clip_row_factors(const at::Tensor& gamma, QkvRows rows, const QkClipOptions& options,
                               int64_t row_begin, int64_t count);

/// Multiplies row i of `tensor` (dim 0) by `factors[i]` in place, rounded
/// once to the tensor's dtype (the factor is rounded to it first). Rows
/// whose factor is 1 are not touched (bit for bit unchanged); with every
/// factor 1 nothing is. `factors`: 1-D, tensor.size(0) elements, finite.
/// Raises c10::ValueError for a mismatch, changing nothing.
void scale_rows_(at::Tensor& tensor, const at::Tensor& factors);

/// QK-clip of one step on one process: computes γ from `max_logits`
/// (qk_clip_gamma) and scales this process's rows of every weight in
/// `weights` in place (its rows of qk_clip_row_factors). Every argument is
/// checked before any weight changes: invalid options or maxima, an
/// undefined, non-floating or 0-d weight, a row range outside the global
/// weight raise c10::ValueError naming the argument and its value. Returns
/// γ per query head (float64, num_heads), for logging.
at::Tensor qk_clip_(const std::vector<QkClipWeight>& weights, const at::Tensor& max_logits,
                    const QkClipOptions& options);

/// Separate query and key projections (whole): qk_clip_ over
/// {q_weight: kQuery, k_weight: kKey}.
at::Tensor qk_clip_(at::Tensor& q_weight, at::Tensor& k_weight, const at::Tensor& max_logits,
                    const QkClipOptions& options);

}  // namespace muon
