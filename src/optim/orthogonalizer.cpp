// The orthogonalization strategy interface and its local (single-process) strategy.
#include "muon/optim/orthogonalizer.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "muon/newton_schulz.h"
#include "muon/optim/muon.h"
#include "muon/scaling.h"
#include "muon/spectral.h"
#include "optim/muon_fused.h"

namespace muon {

void Orthogonalizer::attach(const std::vector<torch::optim::OptimizerParamGroup>& /*groups*/) {}

void Orthogonalizer::begin_step(const std::vector<torch::optim::OptimizerParamGroup>& /*groups*/) {}

std::pair<int64_t, int64_t> Orthogonalizer::max_over_processes(int64_t code) const {
  return {code, 0};
}

void Orthogonalizer::check_options(const MuonOptions& /*options*/, size_t /*group*/) const {}

void Orthogonalizer::sum_parts(const OrthogonalizeItem& /*item*/, at::Tensor& /*partial*/,
                               PartSum /*what*/) const {}

void UpdateStage::check_options(const MuonOptions& /*options*/, size_t /*group*/) const {}

void UpdateStage::after_update(std::vector<OrthogonalizeItem>& /*items*/,
                               Orthogonalizer& /*parts*/) const {}

namespace {

using detail::MatrixView;

// Step 4 of a batch of matrices: Newton–Schulz under the group's ns options,
// or the spectral update the options ask for (muon/spectral.h, which runs
// its own Newton–Schulz: polar_express, 8 steps, as Emerging-Optimizers).
at::Tensor step_four(const at::Tensor& mats, const MuonOptions& o) {
  switch (o.spectral_update()) {
    case SpectralUpdate::kClip:
      return spectral_clip(mats, o.spectral_sigma_min(), o.spectral_sigma_max());
    case SpectralUpdate::kHardcap:
      return spectral_hardcap(mats, o.spectral_hardcap_beta());
    case SpectralUpdate::kNone:
      break;
  }
  return newton_schulz(mats, o.ns());
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
  // Per-head blocks (num_heads H > 1): H blocks of consecutive rows, each a
  // matrix of its own, all of one shape, so one scale.
  const int64_t heads = detail::head_blocks(o);
  if (split.empty()) {
    alpha = scale_factor(v.rows / heads, v.cols, o.scale_mode(), o.extra_scale_factor());
    if (heads == 1) return step_four(mats, o);
    return step_four(mats.reshape({v.batch * heads, v.rows / heads, v.cols}), o)
        .view({v.batch, v.rows, v.cols});
  }
  // Fused QKV: (B, G, sum(split), cols); block i is (B, G·split[i], cols),
  // per head (B·H, G·split[i]/H, cols).
  alpha = 1.0;
  const int64_t groups = o.num_query_groups();
  const int64_t total = std::accumulate(split.begin(), split.end(), int64_t{0});
  const auto grouped = mats.view({v.batch, groups, total, v.cols});
  auto out = at::empty({v.batch, groups, total, v.cols}, update.options());
  int64_t offset = 0;
  for (const int64_t size : split) {
    const auto block =
        grouped.narrow(2, offset, size).reshape({v.batch * heads, groups * size / heads, v.cols});
    auto orth = step_four(block, o);
    orth.mul_(scale_factor(groups * size / heads, v.cols, o.scale_mode(), o.extra_scale_factor()));
    out.narrow(2, offset, size).copy_(orth.view({v.batch, groups, size, v.cols}));
    offset += size;
  }
  return out;
}

// Items whose matrices share one shape, dtype, device and set of
// Newton–Schulz options are orthogonalized as one batch (detail::make_batches),
// as Muon's fused passes batch theirs: the fixed costs of a call are paid
// once per batch. Each matrix gives the bits it would alone. Fused-QKV
// items keep one call per block; items with a spectral update one call each.
detail::BatchKey batch_key(const OrthogonalizeItem& item, const MatrixView& v) {
  detail::BatchKey key{v.rows, v.cols, item.update.scalar_type(), item.update.device(),
                       item.options};
  // A spectral update is a function of its own options, not only of the
  // Newton–Schulz ones: one call per parameter.
  key.alone = !item.options->split_sizes().empty() || detail::head_blocks(*item.options) > 1 ||
              item.options->spectral_update() != SpectralUpdate::kNone;
  return key;
}

class LocalOrthogonalizer final : public Orthogonalizer {
 public:
  // Muon's own update on whole matrices: fused passes where they apply, the
  // rest handed over in batches of a few megabatches.
  LocalOrthogonalizer()
      : Orthogonalizer(Traits{/*empty_parts=*/false, /*fuses=*/true,
                              /*call_elements=*/4 * detail::kMaxBatchElements}) {}
  std::string name() const override { return "local"; }
  void orthogonalize(std::vector<OrthogonalizeItem>& items) override {
    std::vector<MatrixView> views;
    std::vector<detail::BatchKey> keys;
    views.reserve(items.size());
    keys.reserve(items.size());
    for (auto& item : items) {
      views.push_back(detail::matrix_view(item.param, *item.options));
      keys.push_back(batch_key(item, views.back()));
    }
    const auto runs = detail::make_batches(
        keys, [&](size_t i) { return views[i].batch; },
        [&](size_t i) { return views[i].rows * views[i].cols; }, /*ways=*/1);
    for (const auto& run : runs) {
      auto& first = items[run.front()];
      const auto& v = views[run.front()];
      if (run.size() == 1) {
        first.orth = scaled_orthogonal(first.update, v, *first.options, first.alpha);
        first.rows = v.rows / detail::head_blocks(*first.options);  // a head block's rows
        first.cols = v.cols;
        continue;
      }
      std::vector<at::Tensor> mats;
      for (const size_t j : run) {
        mats.push_back(items[j].update.reshape({views[j].batch, v.rows, v.cols}));
      }
      const auto orth = newton_schulz(at::cat(mats), first.options->ns());
      int64_t offset = 0;
      for (const size_t j : run) {
        auto& item = items[j];
        item.rows = v.rows;
        item.cols = v.cols;
        item.alpha = scale_factor(v.rows, v.cols, item.options->scale_mode(),
                                  item.options->extra_scale_factor());
        item.orth = orth.narrow(0, offset, views[j].batch);
        offset += views[j].batch;
      }
    }
  }
};

}  // namespace

std::shared_ptr<Orthogonalizer> make_local_orthogonalizer() {
  return std::make_shared<LocalOrthogonalizer>();
}

}  // namespace muon
