// Per-head Newton–Schulz (MuonOptions::num_heads, microsoft/dion's per-group
// num_heads): the rows of a matrix in H equal blocks of consecutive rows,
// each orthogonalized and scaled from its own shape. Against an fp64
// reference that runs Newton–Schulz per head block with the same
// coefficients and steps, plain and with fused-QKV splits (per head within
// each split block; the main job's [q_h, k_h, v_h] rows per head);
// validation that changes nothing; the archive and the config key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "archive_util.h"
#include "dist_util.h"
#include "expect_util.h"
#include "muon/config.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/muon.h"
#include "muon/registry.h"
#include "reference.h"

namespace muon::test {
namespace {

constexpr double kLr = 0.02;
constexpr double kMu = 0.95;

// Rows `rows` of `m` (fp64), each head block of `heads` consecutive-row
// blocks orthogonalized by the textbook quintic (5 steps) and scaled by
// shape_scaling from the head block's shape.
at::Tensor ref_heads(const at::Tensor& m, int64_t heads) {
  const int64_t hr = m.size(0) / heads;
  std::vector<at::Tensor> out;
  for (int64_t h = 0; h < heads; ++h) {
    const auto block = m.narrow(0, h * hr, hr);
    out.push_back(
        reference_newton_schulz(block, kQuintic, 5) *
        std::sqrt(std::max(1.0, static_cast<double>(hr) / static_cast<double>(m.size(1)))));
  }
  return at::cat(out, 0);
}

// The orthogonalized update of matrix `u`: split blocks (block i gathers,
// from every query group g, rows g·Σsplit + offset_i + [0, split_i)), each
// in head blocks; no split: the matrix in head blocks.
at::Tensor ref_orth(const at::Tensor& u, int64_t heads, const std::vector<int64_t>& split,
                    int64_t groups) {
  if (split.empty()) return ref_heads(u, heads);
  int64_t total = 0;
  for (const auto s : split) total += s;
  auto out = at::zeros_like(u);
  int64_t offset = 0;
  for (const auto s : split) {
    std::vector<int64_t> idx;
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t r = 0; r < s; ++r) idx.push_back(g * total + offset + r);
    }
    const auto index = at::tensor(idx, at::kLong);
    out.index_copy_(0, index, ref_heads(u.index_select(0, index), heads));
    offset += s;
  }
  return out;
}

struct Case {
  std::vector<int64_t> shape;
  int64_t heads;
  std::vector<int64_t> split;
  int64_t groups;
};

void expect_matches_reference(const Case& c, const std::string& what) {
  auto p = seeded_randn(c.shape, 11).requires_grad_(true);
  auto ref = p.detach().to(at::kDouble);
  auto buf = at::zeros_like(ref);
  Muon opt(
      {p},
      MuonOptions(kLr).weight_decay(0.1).num_heads(c.heads).split_sizes(c.split).num_query_groups(
          c.groups));
  for (int s = 0; s < 5; ++s) {
    const auto g = seeded_randn(c.shape, 200 + s);
    p.mutable_grad() = g;
    opt.step();
    const auto gd = g.to(at::kDouble);
    ref = ref * (1 - kLr * 0.1);
    buf = kMu * buf + (1 - kMu) * gd;
    ref = ref - kLr * ref_orth((1 - kMu) * gd + kMu * buf, c.heads, c.split, c.groups);
  }
  // fp32 Newton–Schulz of blocks of ≤ 24 rows against fp64: ~1e-7 relative
  // per product, five NS steps at spectral norm ≤ 1, five optimizer steps:
  // ~1e-6 of the parameters on any CPU, under 1e-5. The whole matrix
  // orthogonalized at once differs by far more (OffIsTheWholeMatrixAndHeadsDiffer).
  const double err = (p.detach().to(at::kDouble) - ref).abs().max().item<double>() /
                     ref.abs().max().item<double>();
  EXPECT_LE(err, 1e-5) << what;
}

TEST(MuonHeads, MatchesPerHeadFp64Reference) {
  expect_matches_reference({{12, 8}, 3, {}, 1}, "12x8, 3 heads of 4 rows");
  expect_matches_reference({{24, 16}, 4, {}, 1}, "24x16, 4 heads of 6 rows");
  expect_matches_reference({{8, 20}, 2, {}, 1}, "8x20, 2 heads (wide)");
  // The main job's fused QKV (examples/train_gpt/gpt.h): rows per head
  // [q_h, k_h, v_h], head_dim 3, 4 heads: num_heads 4 orthogonalizes each
  // head's [q_h; k_h; v_h] ...
  expect_matches_reference({{36, 12}, 4, {}, 1}, "QKV per head");
  // ... and with split_sizes [3, 3, 3] × 4 query groups each of q_h, k_h,
  // v_h alone (per head within each split block).
  expect_matches_reference({{36, 12}, 4, {3, 3, 3}, 4}, "QKV per head and block");
  // Two heads per split block of 4 query groups: 2 groups' rows per head.
  expect_matches_reference({{24, 10}, 2, {2, 1, 3}, 4}, "split, 2 heads per block");
}

TEST(MuonHeads, OffIsTheWholeMatrixAndHeadsDiffer) {
  // num_heads 0 and 1 are the plain step (the fused passes take both).
  auto a = seeded_randn({12, 8}, 1).requires_grad_(true);
  auto b = a.detach().clone().requires_grad_(true);
  auto c = a.detach().clone().requires_grad_(true);
  Muon oa({a}, MuonOptions(kLr));
  Muon ob({b}, MuonOptions(kLr).num_heads(1));
  Muon oc({c}, MuonOptions(kLr).num_heads(3));
  const auto g = seeded_randn({12, 8}, 2);
  for (auto* t : {&a, &b, &c}) t->mutable_grad() = g.clone();
  oa.step();
  ob.step();
  oc.step();
  EXPECT_TRUE(at::equal(a.detach(), b.detach()));
  EXPECT_GT((a.detach() - c.detach()).abs().max().item<double>(), 1e-3);
}

TEST(MuonHeads, BadOptionsAreNamedAndChangeNothing) {
  auto p = seeded_randn({12, 8}, 1).requires_grad_(true);
  expect_value_error([&] { Muon({p}, MuonOptions().num_heads(5)); }, {"num_heads 5", "[12, 8]"});
  expect_value_error([&] { Muon({p}, MuonOptions().num_heads(-1)); }, {"num_heads", "-1"});
  auto conv = seeded_randn({6, 2, 3}, 2).requires_grad_(true);
  expect_value_error([&] { Muon({conv}, MuonOptions().num_heads(2)); },
                     {"num_heads 2", "[6, 2, 3]"});
  expect_value_error([&] { Muon({conv}, MuonOptions().num_heads(2).stacked_experts(true)); },
                     {"num_heads 2", "[6, 2, 3]"});
  expect_value_error(
      [&] {
        MuonOptions().split_sizes({2, 3}).num_query_groups(2).num_heads(4).validate();
      },
      {"num_heads 4", "block 1", "split_sizes"});
  expect_value_error([&] { AdaptiveMuon({p}, MuonOptions().num_heads(2)); },
                     {"AdaptiveMuon", "num_heads 2"});
  // Set between steps: the step raises before anything changes.
  Muon opt({p}, MuonOptions(kLr));
  p.mutable_grad() = seeded_randn({12, 8}, 3);
  opt.step();
  const auto before = p.detach().clone();
  const auto buf =
      static_cast<const MuonParamState&>(*opt.state().begin()->second).momentum_buffer().clone();
  static_cast<MuonOptions&>(opt.param_groups()[0].options()).num_heads(5);
  expect_value_error([&] { opt.step(); }, {"num_heads 5", "[12, 8]"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_TRUE(at::equal(
      static_cast<const MuonParamState&>(*opt.state().begin()->second).momentum_buffer(), buf));
}

TEST(MuonHeads, ArchiveAndConfig) {
  auto p = seeded_randn({12, 8}, 1).requires_grad_(true);
  Muon opt({p}, MuonOptions(kLr).num_heads(3));
  p.mutable_grad() = seeded_randn({12, 8}, 2);
  opt.step();
  auto q = p.detach().clone().requires_grad_(true);
  Muon resumed({q}, MuonOptions(kLr));
  load_from_string(resumed, save_to_string(opt));
  EXPECT_EQ(static_cast<const MuonOptions&>(resumed.param_groups()[0].options()).num_heads(), 3);
  p.mutable_grad() = seeded_randn({12, 8}, 3);
  q.mutable_grad() = p.grad().clone();
  opt.step();
  resumed.step();
  EXPECT_TRUE(at::equal(p.detach(), q.detach()));

  auto named = seeded_params({{"attn.weight", {12, 8}}}, 4);
  OptimizerConfig config;
  apply_config_json(config, R"({"optimizer": "muon", "muon_num_heads": 3})");
  auto built = make_optimizer(named, config);
  auto* muon = dynamic_cast<Muon*>(built->find_part("muon"));
  ASSERT_NE(muon, nullptr);
  EXPECT_EQ(static_cast<const MuonOptions&>(muon->param_groups()[0].options()).num_heads(), 3);
  OptimizerConfig bad;
  expect_value_error([&] { apply_config_json(bad, R"({"muon_num_heads": -2})"); },
                     {"muon_num_heads"});

  // The main job's way (a --runs FILE.json config): an override rule gives
  // the fused QKV its heads; the MLP's 10 rows stay whole.
  auto model = seeded_params(
      {{"blocks.0.attn.qkv.weight", {36, 12}}, {"blocks.0.mlp.fc.weight", {10, 12}}}, 5);
  OptimizerConfig per_name;
  apply_config_json(per_name,
                    R"({"optimizer": "muon", "overrides": [{"match": {"name": "*.attn.qkv.weight"},
                                                                      "set": {"muon_num_heads": 4}}]})");
  auto routed = make_optimizer(model, per_name);
  auto* part = dynamic_cast<Muon*>(routed->find_part("muon"));
  ASSERT_NE(part, nullptr);
  for (const auto& group : part->param_groups()) {
    const auto heads = static_cast<const MuonOptions&>(group.options()).num_heads();
    for (const auto& t : group.params()) EXPECT_EQ(heads, t.size(0) == 36 ? 4 : 0) << t.sizes();
  }
  for (auto& item : model) item.value().mutable_grad() = at::ones_like(item.value());
  routed->step();
}

}  // namespace
}  // namespace muon::test
