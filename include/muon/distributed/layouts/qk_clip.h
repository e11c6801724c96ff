#pragma once

/// QK-clip (muon/qk_clip.h) over processes: the step's maximum logits
/// all-reduced with MAX over the ranks that saw different data, then the
/// query and key rows scaled in every tensor that holds them: a Layout's
/// parameters and its master rows, in every layout.
///
///     layout.step();
///     auto gamma = muon::distributed::qk_clip_(
///         layout, {{"blocks.0.attn.qkv.weight", muon::QkvRows::kGrouped, row_begin}},
///         max_logits, muon::QkClipOptions(heads, head_dim).threshold(100), layout.world());
///
/// Where each rank's parameter holds which rows:
///   none, layerwise         the whole weight on every rank: row_begin 0.
///   tensor_parallel         this rank's heads (a block of rows): row_begin = its first row.
///   sharded                 the whole weight (row_begin 0); the layout scales
///                           its master rows too, whose edges may cut a head.
///   sharded, 2-D            this rank's tensor-parallel block: row_begin = its first row;
///                           the layout scales the master rows of the block.
///   sharded + row_shards    the parameter is an FSDP row shard: row_begin = its first row.
/// The maxima every rank passes are of every query head (a tensor-parallel
/// rank's other heads may hold any value at most their maximum, e.g. −∞,
/// when `group` covers the tensor-parallel ranks too).
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/runtime/group.h"
#include "muon/qk_clip.h"

namespace muon::distributed {

/// The element-wise maximum of `values` over the ranks of `group`, as
/// float64 on the CPU (the same on every rank: an all-gather, then the
/// maximum in rank order). An invalid group or one of one rank: `values`
/// as float64. Collective over `group`; every rank passes the same shape.
at::Tensor all_reduce_max(const at::Tensor& values, const Group& group);

/// QK-clip of tensors held outside a Layout (each rank its rows of the
/// weights, e.g. its heads): `max_logits` all-reduced with MAX over `group`
/// (invalid: none), then muon::qk_clip_ on `weights`. Every rank ends with
/// the same γ; checked as muon::qk_clip_, after the reduction. Collective
/// over `group`.
at::Tensor qk_clip_(const std::vector<QkClipWeight>& weights, const at::Tensor& max_logits,
                    const QkClipOptions& options, const Group& group);

/// One parameter of a Layout holding query or key rows: its name, its rows
/// and the first global row of the tensor given to the layout for it.
struct QkClipParam {
  std::string name;
  QkvRows rows = QkvRows::kGrouped;
  int64_t row_begin = 0;
};

/// QK-clip of one step of `layout`, after its step: `max_logits`
/// (num_heads) all-reduced with MAX over `group` (invalid: none), then γ
/// (muon::qk_clip_gamma) and each parameter's rows scaled with
/// Layout::scale_rows (its master rows too). Every rank ends with the same
/// γ. Checked before anything changes (options, maxima after the
/// reduction, each name and its row range), raising the same
/// c10::ValueError on every rank that passed the same arguments. Returns γ
/// per query head (float64). Collective over `group`.
at::Tensor qk_clip_(Layout& layout, const std::vector<QkClipParam>& params,
                    const at::Tensor& max_logits, const QkClipOptions& options,
                    const Group& group = Group());

}  // namespace muon::distributed
