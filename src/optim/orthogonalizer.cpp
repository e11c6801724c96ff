// The orthogonalization strategy interface and its local (single-process) strategy.
#include "muon/optim/orthogonalizer.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "muon/newton_schulz.h"
#include "muon/optim/muon.h"
#include "muon/scaling.h"
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

namespace {

using detail::MatrixView;

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

// Items whose matrices share one shape, dtype, device and set of
// Newton–Schulz options are orthogonalized as one batch (at most
// kMaxBatchElements elements), as Muon's fused passes batch theirs: the
// fixed costs of a call are paid once per batch. Each matrix gives the bits
// it would alone.
constexpr int64_t kMaxBatchElements = int64_t{1} << 21;

bool batchable(const OrthogonalizeItem& item) { return item.options->split_sizes().empty(); }

bool same_batch(const OrthogonalizeItem& a, const MatrixView& va, const OrthogonalizeItem& b,
                const MatrixView& vb) {
  return va.rows == vb.rows && va.cols == vb.cols &&
         a.update.scalar_type() == b.update.scalar_type() &&
         a.update.device() == b.update.device() &&
         (a.options == b.options || a.options->ns() == b.options->ns());
}

class LocalOrthogonalizer final : public Orthogonalizer {
 public:
  std::string name() const override { return "local"; }
  bool fuses() const override { return true; }
  bool batches() const override { return true; }
  int64_t max_pending_elements() const override { return 4 * kMaxBatchElements; }
  void orthogonalize(std::vector<OrthogonalizeItem>& items) override {
    std::vector<MatrixView> views;
    views.reserve(items.size());
    for (auto& item : items) views.push_back(detail::matrix_view(item.param, *item.options));
    std::vector<bool> done(items.size(), false);
    for (size_t i = 0; i < items.size(); ++i) {
      if (done[i]) continue;
      auto& first = items[i];
      const auto& v = views[i];
      first.rows = v.rows;
      first.cols = v.cols;
      if (!batchable(first)) {
        first.orth = scaled_orthogonal(first.update, v, *first.options, first.alpha);
        done[i] = true;
        continue;
      }
      // This item and the next ones of its kind, up to the batch's size.
      std::vector<size_t> members{i};
      int64_t matrices = v.batch;
      const int64_t cap = std::max<int64_t>(1, kMaxBatchElements / std::max<int64_t>(v.rows * v.cols, 1));
      for (size_t j = i + 1; j < items.size() && matrices < cap; ++j) {
        if (done[j] || !batchable(items[j]) || !same_batch(first, v, items[j], views[j]) ||
            matrices + views[j].batch > cap) {
          continue;
        }
        members.push_back(j);
        matrices += views[j].batch;
      }
      std::vector<at::Tensor> mats;
      for (const size_t j : members) mats.push_back(items[j].update.reshape({views[j].batch, v.rows, v.cols}));
      const auto orth = newton_schulz(mats.size() == 1 ? mats[0] : at::cat(mats), first.options->ns());
      int64_t offset = 0;
      for (const size_t j : members) {
        auto& item = items[j];
        item.rows = v.rows;
        item.cols = v.cols;
        item.alpha = scale_factor(v.rows, v.cols, item.options->scale_mode(),
                                  item.options->extra_scale_factor());
        item.orth = orth.narrow(0, offset, views[j].batch);
        offset += views[j].batch;
        done[j] = true;
      }
    }
  }
};

}  // namespace

std::shared_ptr<Orthogonalizer> make_local_orthogonalizer() {
  return std::make_shared<LocalOrthogonalizer>();
}

}  // namespace muon
