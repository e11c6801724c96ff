// The orthogonalization strategy interface and its local (single-process) strategy.
#include "muon/optim/orthogonalizer.h"

#include <c10/util/Exception.h>

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

class LocalOrthogonalizer final : public Orthogonalizer {
 public:
  std::string name() const override { return "local"; }
  bool fuses() const override { return true; }
  void orthogonalize(std::vector<OrthogonalizeItem>& items) override {
    for (auto& item : items) {
      const auto view = detail::matrix_view(item.param, *item.options);
      item.orth = scaled_orthogonal(item.update, view, *item.options, item.alpha);
      item.rows = view.rows;
      item.cols = view.cols;
    }
  }
};

}  // namespace

std::shared_ptr<Orthogonalizer> make_local_orthogonalizer() {
  return std::make_shared<LocalOrthogonalizer>();
}

}  // namespace muon
