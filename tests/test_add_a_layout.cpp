// Adding a layout, the worked example of docs/architecture.md: a new
// orthogonalization strategy in one file, run through muon::distributed::Layout,
// equal to one process and checkpointed like every built-in layout.
//
// The strategy: parameters are row shards (an FSDP's, gradients already
// reduce-scattered); every rank all-gathers each whole matrix, runs
// Newton–Schulz on it and keeps its own rows (what Moonlight does; the
// built-in owner-compute strategy does the same work once per matrix).
#include <gtest/gtest.h>

#include <c10/util/irange.h>

#include <filesystem>
#include <string>
#include <vector>

#include "dist_util.h"
#include "muon/distributed/checkpoints/checkpoint.h"
#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/row_shard.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/newton_schulz.h"
#include "muon/optim/muon.h"
#include "muon/optim/orthogonalizer.h"
#include "muon/scaling.h"

namespace {

using muon::distributed::Group;
using Named = torch::OrderedDict<std::string, at::Tensor>;

// ---- the new layout: one strategy ------------------------------------------

class GatherWholeOrthogonalizer final : public muon::Orthogonalizer {
 public:
  // One parameter per call, and a rank may hold no rows of one.
  explicit GatherWholeOrthogonalizer(Group group)
      : Orthogonalizer(Traits{/*empty_parts=*/true, /*fuses=*/false, /*call_elements=*/0}),
        group_(std::move(group)) {}

  std::string name() const override { return "gather_whole"; }

  void orthogonalize(std::vector<muon::OrthogonalizeItem>& items) override {
    for (auto& item : items) {
      // Every rank's rows, in rank order: the whole matrix.
      const auto parts = group_.all_gather_uneven(item.update);
      const auto whole = at::cat(parts, 0);
      int64_t offset = 0;
      for (const auto r : c10::irange(group_.rank())) offset += parts[static_cast<size_t>(r)].size(0);
      const auto& o = *item.options;
      item.orth = muon::newton_schulz(whole, o.ns()).narrow(0, offset, item.update.size(0)).contiguous();
      item.rows = whole.size(0);
      item.cols = whole.numel() / std::max<int64_t>(whole.size(0), 1);
      item.alpha = muon::scale_factor(item.rows, item.cols, o.scale_mode(), o.extra_scale_factor());
    }
  }

 private:
  Group group_;
};

// ---- the test --------------------------------------------------------------

const std::vector<std::pair<std::string, std::vector<int64_t>>> kModel{
    {"fc.weight", {9, 6}}, {"proj.weight", {6, 9}}};

at::Tensor full_param(size_t k) { return muon::test::seeded_randn(kModel[k].second, 20 + k); }
at::Tensor rank_grad(size_t k, int64_t step, int64_t rank) {
  return muon::test::seeded_randn(kModel[k].second, 300 + 17 * step + 5 * rank + k);
}

muon::MuonOptions options() { return muon::MuonOptions(0.02).weight_decay(0.1); }

TEST(AddALayout, GatherWholeStrategyEqualsOneProcessAndCheckpoints) {
  constexpr int kWorld = 2;
  constexpr int64_t kSteps = 3;
  // One process on the whole matrices, gradients averaged over the ranks.
  Named whole;
  for (const auto k : c10::irange(kModel.size())) whole.insert(kModel[k].first, full_param(k));
  muon::Muon reference(whole.values(), options());
  for (const auto step : c10::irange(kSteps)) {
    for (const auto k : c10::irange(kModel.size())) {
      whole[k].value().mutable_grad() = (rank_grad(k, step, 0) + rank_grad(k, step, 1)) / kWorld;
    }
    reference.step();
  }
  const auto dir = (std::filesystem::temp_directory_path() /
                    ("muon_add_a_layout_" + std::to_string(::getpid())))
                       .string();
  muon::test::run_ranks(kWorld, [&](Group& group) {
    // This rank's rows of every matrix, laid out as row shards.
    Named shards;
    muon::distributed::DistributedLayout view;
    view.group = group;
    for (const auto k : c10::irange(kModel.size())) {
      const auto rows = muon::distributed::balanced_split_sizes(kModel[k].second[0], kWorld);
      shards.insert(kModel[k].first, muon::distributed::local_rows(full_param(k), rows, group.rank()));
      view.row_shards.emplace(kModel[k].first, muon::distributed::RowShard(kModel[k].second, group));
    }
    auto muon_opt = std::make_unique<muon::Muon>(
        std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(shards.values())},
        options(), std::make_shared<GatherWholeOrthogonalizer>(group));
    // The new layout: the gradients come reduce-scattered (as from an FSDP).
    muon::distributed::Layout layout(shards, std::move(muon_opt),
                              muon::distributed::LayoutGroups().world(group).gradients_reduced(true), view);
    for (const auto step : c10::irange(kSteps)) {
      layout.zero_grad();
      for (const auto k : c10::irange(kModel.size())) {
        const auto rows = muon::distributed::balanced_split_sizes(kModel[k].second[0], kWorld);
        shards[k].value().mutable_grad() =
            muon::distributed::reduce_scatter_rows(rank_grad(k, step, group.rank()), rows, group);
      }
      layout.step();
    }
    // Equal to one process: the same Newton–Schulz on the same whole
    // matrices, so the rows are the reference's to the bit.
    for (const auto k : c10::irange(kModel.size())) {
      const auto rows = muon::distributed::balanced_split_sizes(kModel[k].second[0], kWorld);
      EXPECT_TRUE(at::equal(shards[k].value(), muon::distributed::local_rows(whole[k].value(), rows, group.rank())))
          << kModel[k].first;
    }
    // Checkpointed like every layout (and loaded below by a single-process
    // Layout of the built-in strategy).
    muon::distributed::save_checkpoint(dir, layout, kSteps);
  });
  Named loaded;
  for (const auto k : c10::irange(kModel.size())) loaded.insert(kModel[k].first, at::zeros(kModel[k].second));
  muon::distributed::Layout single(loaded, std::make_unique<muon::Muon>(loaded.values(), options()));
  const auto latest = muon::distributed::latest_checkpoint(dir);
  ASSERT_TRUE(latest.has_value());
  const auto info = muon::distributed::load_checkpoint(latest->path, single);
  EXPECT_EQ(info.step, kSteps);
  EXPECT_EQ(info.world_size, kWorld);
  for (const auto k : c10::irange(kModel.size())) {
    EXPECT_TRUE(at::equal(loaded[k].value(), whole[k].value())) << kModel[k].first;
  }
  // The momentum came along: one more step on both equals.
  for (const auto k : c10::irange(kModel.size())) {
    const auto g = rank_grad(k, kSteps, 0);
    whole[k].value().mutable_grad() = g.clone();
    loaded[k].value().mutable_grad() = g.clone();
  }
  reference.step();
  single.step();
  for (const auto k : c10::irange(kModel.size())) {
    EXPECT_TRUE(at::equal(loaded[k].value(), whole[k].value())) << kModel[k].first;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
