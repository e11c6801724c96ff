// Tensor-parallel layers (muon/distributed/layouts/tensor_parallel_layers.h) against
// the single-process computation on the whole weights, with ranks as threads
// over real Gloo process groups.
//
// Tolerances. u = 2⁻²⁴ is fp32's unit roundoff. A single layer computes, on
// the ranks, the same sums of the same fp32 products as one process, in
// another order (other GEMM blocking, partial sums added by the
// all-reduce). Two evaluations of a sum of K products in any orders differ
// by at most 2·γ_K·Σ|aᵢbᵢ|, γ_K = K·u/(1 − K·u) (Higham, "Accuracy and
// Stability of Numerical Algorithms", §3.1), so the single-layer tests check
// every element against that bound, with Σ|aᵢbᵢ| computed from |inputs|
// (check_sum). Chains of layers (the MLP, the attention block) pass such
// errors through GELU, softmax and further products; there the tests use
// max|got − ref| ≤ 1e-5·max|ref|: rounding errors of random sign grow like
// √K·u per product (≈ 4.8e-7 at K = 64, the longest sum here), a few chained
// give ~1e-6, and a missing all-reduce or a wrong block gives errors of
// order 1. The optimizer test measures the error of one step relative to
// the largest change it made (as test_dist_tensor_parallel.cpp), with the
// looser kStepTolerance explained at its definition.
// Measured largest values are printed by each test ("measured: ...").
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dist_util.h"
#include "expect_util.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/tensor_parallel_layers.h"
#include "muon/registry.h"
#include "tensor_parallel_util.h"

namespace muon::test {
namespace {

using muon::distributed::ColumnParallelLinear;
using muon::distributed::Group;
using muon::distributed::RowParallelLinear;
using muon::distributed::TensorParallelShard;

constexpr double kUnit = 5.9604644775390625e-08;  // 2^-24
// Relative bound of the chained computations (header).
constexpr double kChainTolerance = 1e-5;
// One optimizer step after the layers' own backward, relative to the
// largest change the step made: the gradients already differ from one
// process's by rounding (≈ 2e-7 relative, the chained tests), and
// Newton–Schulz amplifies a perturbation of the gradient along its small
// singular values; measured ≤ 1.8e-5 here, while a wrong block, gradient or
// shard gives errors of order 1.
constexpr double kStepTolerance = 1e-4;

// kNoCollectives: a body that runs no collective ends with a barrier.
// Group::create can return on one rank before its peers have finished
// connecting; a rank that then destroys its group at once makes a peer's
// creation fail ("Connection closed by peer").

// The largest value seen by any rank, for the "measured" line.
class Worst {
 public:
  void update(double v) {
    std::lock_guard<std::mutex> lock(mutex_);
    value_ = std::max(value_, v);
  }
  double value() const { return value_; }

 private:
  std::mutex mutex_;
  double value_ = 0;
};

// Checks |got − ref| ≤ 2·γ_K·abs_sum elementwise (abs_sum = Σ|aᵢbᵢ| of each
// element's sum of `k` terms); records the largest |got − ref| / bound.
void check_sum(const at::Tensor& got, const at::Tensor& ref, const at::Tensor& abs_sum, int64_t k,
               const std::string& what, Worst& worst) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.sizes(), ref.sizes()) << what;
  const double gamma = 2.0 * static_cast<double>(k) * kUnit / (1.0 - static_cast<double>(k) * kUnit);
  const auto diff = (got.detach() - ref).abs();
  const auto bound = abs_sum * gamma;
  EXPECT_TRUE(diff.le(bound).all().item<bool>())
      << what << ": max |diff| " << diff.max().item<double>() << ", K = " << k;
  if (diff.numel() > 0) {
    worst.update((diff / bound.clamp_min(std::numeric_limits<float>::min())).max().item<double>());
  }
}

// max|got − ref| / max|ref| ≤ kChainTolerance.
void check_chain(const at::Tensor& got, const at::Tensor& ref, const std::string& what, Worst& worst) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.sizes(), ref.sizes()) << what;
  if (ref.numel() == 0) return;
  const double rel = (got.detach() - ref).abs().max().item<double>() / ref.abs().max().item<double>();
  EXPECT_LE(rel, kChainTolerance) << what;
  worst.update(rel);
}

// Rows (…, k) of a tensor as an (N, k) matrix.
at::Tensor flat(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// Leaf tensors requiring grad, copies of `t`.
at::Tensor leaf(const at::Tensor& t) { return t.clone().requires_grad_(true); }

// Leaf copies of each of `ts`, for std::tie.
template <typename... T>
auto leaves(const T&... ts) {
  return std::make_tuple(leaf(ts)...);
}

// ---- 1. single layers ------------------------------------------------------------

// One process's linear layer on whole data: weight, bias, input, the
// gradient of the output, and the output and gradients of at::linear.
struct LinearReference {
  LinearReference(int64_t in, int64_t out, uint64_t seed)
      : w(seeded_randn({out, in}, seed)),
        b(seeded_randn({out}, seed + 1)),
        x(seeded_randn({2, 5, in}, seed + 2)),
        g(seeded_randn({2, 5, out}, seed + 3)),
        y(at::linear(x, w, b)),
        n(x.numel() / in) {
    at::Tensor xr, wr, br;
    std::tie(xr, wr, br) = leaves(x, w, b);
    at::linear(xr, wr, br).backward(g);
    dx = xr.grad();
    dw = wr.grad();
    db = br.grad();
  }
  at::Tensor w, b, x, g, y;
  int64_t n;  // products in a weight gradient
  at::Tensor dx, dw, db;
};

// This rank's block of a layer whose weight is split into uneven blocks.
struct RankBlock {
  std::vector<int64_t> sizes;  // every rank's block along the split dimension
  int64_t offset;              // this rank's first row (or column)
  int64_t size;                // this rank's rows (or columns)
  std::string where;           // " at W ranks, rank R", for the messages
};

// At 2 and 3 ranks, every rank builds a `Layer` (ref's in → out features,
// with bias) whose weight is split along `split_dim` into uneven blocks (3,
// 7 and 1, 3, 6), checks that it holds its block (offset, weight shape),
// loads ref's whole weight and bias into it and runs `body(layer, block)`.
template <typename Layer, typename Body>
void run_uneven_layer(const LinearReference& ref, int64_t split_dim, const Body& body) {
  const int64_t in = ref.w.size(1);
  const int64_t out = ref.w.size(0);
  for (const int world : {2, 3}) {
    run_ranks(world, [&](Group& tp) {
      RankBlock block;
      block.sizes = uneven_sizes(ref.w.size(split_dim), world);
      block.offset = muon::distributed::split_offset(block.sizes, tp.rank());
      block.size = block.sizes[static_cast<size_t>(tp.rank())];
      block.where = " at " + std::to_string(world) + " ranks, rank " + std::to_string(tp.rank());
      Layer layer(in, out, tp, /*bias=*/true, block.sizes);
      auto block_shape = ref.w.sizes().vec();
      block_shape[static_cast<size_t>(split_dim)] = block.size;
      ASSERT_EQ(layer->offset(), block.offset);
      ASSERT_EQ(layer->weight.sizes(), block_shape);
      layer->load_full(ref.w, ref.b);
      body(layer, block);
    });
  }
}

// At 2 and 3 ranks (run_uneven_layer), a ColumnParallelLinear or a
// RowParallelLinear of `in` → `out` features loaded with a LinearReference's
// whole weight and bias: its output and the input, weight and bias gradients
// of its backward equal at::linear's on the whole weight within check_sum's
// bound, each cut to the rank's block where the layer cuts it.
template <typename Layer>
void expect_layer_equals_linear(int64_t in, int64_t out, uint64_t seed) {
  constexpr bool kColumn = std::is_same_v<Layer, ColumnParallelLinear>;
  const LinearReference ref(in, out, seed);
  Worst worst;
  run_uneven_layer<Layer>(
      ref, /*split_dim=*/kColumn ? 0 : 1, [&](Layer& layer, const RankBlock& block) {
        const auto& [w, b, x0, g, y_ref, n, dx_ref, dw_ref, db_ref] = ref;
        const auto& [sizes, off, r, where] = block;
        if constexpr (kColumn) {
          ASSERT_EQ(layer->rows_per_rank(), sizes);
          auto x = leaf(x0);
          auto y = layer(x);
          const auto g_r = g.narrow(-1, off, r);
          y.backward(g_r);
          check_sum(y, y_ref.narrow(-1, off, r),
                    at::linear(x0.abs(), w.abs(), b.abs()).narrow(-1, off, r), in + 1,
                    "output" + where, worst);
          // The whole input gradient Σ_r g_r·W_r (the all-reduce of the backward).
          check_sum(x.grad(), dx_ref, at::matmul(g.abs(), w.abs()), out, "input grad" + where,
                    worst);
          check_sum(layer->weight.grad(), dw_ref.narrow(0, off, r),
                    at::matmul(flat(g_r).abs().t(), flat(x0).abs()), n, "weight grad" + where,
                    worst);
          check_sum(layer->bias.grad(), db_ref.narrow(0, off, r), flat(g_r).abs().sum(0), n,
                    "bias grad" + where, worst);
        } else {
          ASSERT_EQ(layer->cols_per_rank(), sizes);
          ASSERT_EQ(layer->bias.sizes(), (std::vector<int64_t>{out}));
          auto x = leaf(x0.narrow(-1, off, r));
          auto y = layer(x);
          y.backward(g);
          // The whole output: partial products summed over the ranks, bias once.
          check_sum(y, y_ref, at::linear(x0.abs(), w.abs(), b.abs()), in + 1, "output" + where,
                    worst);
          check_sum(x.grad(), dx_ref.narrow(-1, off, r),
                    at::matmul(g.abs(), w.abs()).narrow(-1, off, r), out, "input grad" + where,
                    worst);
          check_sum(layer->weight.grad(), dw_ref.narrow(1, off, r),
                    at::matmul(flat(g).abs().t(), flat(x0).abs()).narrow(1, off, r), n,
                    "weight grad" + where, worst);
          check_sum(layer->bias.grad(), db_ref, flat(g).abs().sum(0), n, "bias grad" + where,
                    worst);
        }
      });
  std::printf("measured: largest |diff| / bound %.3g\n", worst.value());
}

TEST(TensorParallelLayers, ColumnParallelEqualsLinearOnTheWholeWeight) {
  expect_layer_equals_linear<ColumnParallelLinear>(/*in=*/7, /*out=*/10, /*seed=*/1);
}

TEST(TensorParallelLayers, RowParallelEqualsLinearOnTheWholeWeight) {
  expect_layer_equals_linear<RowParallelLinear>(/*in=*/10, /*out=*/7, /*seed=*/11);
}

// ---- 2. MLP and fused-QKV attention ----------------------------------------------

// Causal attention over `heads` heads of a fused projection whose rows are
// ordered per head (q, k, v of head 0, then head 1, ...): qkv (B, T,
// heads·3·head_dim) → (B, T, heads·head_dim). The same function runs on the
// whole projection and on a rank's heads.
at::Tensor attention(const at::Tensor& qkv, int64_t heads, int64_t head_dim) {
  const int64_t batch = qkv.size(0);
  const int64_t seq = qkv.size(1);
  const auto parts = qkv.reshape({batch, seq, heads, 3, head_dim}).permute({3, 0, 2, 1, 4});
  const auto scores = at::matmul(parts[0], parts[1].transpose(-2, -1)) /
                      std::sqrt(static_cast<double>(head_dim));
  const auto causal = at::ones({seq, seq}, at::TensorOptions(at::kBool)).triu(1);
  const auto probs = at::softmax(scores.masked_fill(causal, -std::numeric_limits<float>::infinity()), -1);
  return at::matmul(probs, parts[2]).transpose(1, 2).reshape({batch, seq, heads * head_dim});
}

TEST(TensorParallelLayers, MlpEqualsSingleProcess) {
  constexpr int64_t kD = 8;
  const auto w1 = seeded_randn({4 * kD, kD}, 21) / std::sqrt(8.0);
  const auto b1 = seeded_randn({4 * kD}, 22) * 0.1;
  const auto w2 = seeded_randn({kD, 4 * kD}, 23) / std::sqrt(32.0);
  const auto b2 = seeded_randn({kD}, 24) * 0.1;
  const auto x0 = seeded_randn({2, 5, kD}, 25);
  const auto g = seeded_randn({2, 5, kD}, 26);
  at::Tensor xr, w1r, b1r, w2r, b2r;
  std::tie(xr, w1r, b1r, w2r, b2r) = leaves(x0, w1, b1, w2, b2);
  const auto y_ref = at::linear(at::gelu(at::linear(xr, w1r, b1r)), w2r, b2r);
  y_ref.backward(g);
  Worst worst;
  for (const int world : {2, 3}) {
    run_ranks(world, [&](Group& tp) {
      ColumnParallelLinear fc1(kD, 4 * kD, tp);  // balanced: 16, 16 and 11, 11, 10 rows
      RowParallelLinear fc2(4 * kD, kD, tp);
      EXPECT_EQ(fc1->rows_per_rank(), muon::distributed::balanced_split_sizes(4 * kD, world));
      EXPECT_EQ(fc2->cols_per_rank(), fc1->rows_per_rank());
      fc1->load_full(w1, b1);
      fc2->load_full(w2, b2);
      auto x = leaf(x0);
      auto y = fc2(at::gelu(fc1(x)));
      y.backward(g);
      const int64_t off = fc1->offset();
      const int64_t r = fc1->weight.size(0);
      const std::string where = " at " + std::to_string(world) + " ranks, rank " + std::to_string(tp.rank());
      check_chain(y, y_ref.detach(), "output" + where, worst);
      check_chain(x.grad(), xr.grad(), "input grad" + where, worst);
      check_chain(fc1->weight.grad(), w1r.grad().narrow(0, off, r), "fc1 weight grad" + where, worst);
      check_chain(fc1->bias.grad(), b1r.grad().narrow(0, off, r), "fc1 bias grad" + where, worst);
      check_chain(fc2->weight.grad(), w2r.grad().narrow(1, off, r), "fc2 weight grad" + where, worst);
      check_chain(fc2->bias.grad(), b2r.grad(), "fc2 bias grad" + where, worst);
    });
  }
  std::printf("measured: largest max|diff| / max|ref| %.3g\n", worst.value());
}

TEST(TensorParallelLayers, FusedQkvAttentionSplitPerHeadEqualsSingleProcess) {
  constexpr int64_t kHeadDim = 4;
  Worst worst;
  // 5 heads: 3, 2 and 2, 2, 1 per rank; 2 heads over 3 ranks: the last rank
  // holds no head (empty blocks) and still joins every collective.
  for (const auto& heads_world : std::vector<std::pair<int64_t, int>>{{5, 2}, {5, 3}, {2, 3}}) {
    const int64_t heads = heads_world.first;
    const int world = heads_world.second;
    const int64_t d = heads * kHeadDim;
    const auto wqkv = seeded_randn({3 * d, d}, 31) / std::sqrt(static_cast<double>(d));
    const auto bqkv = seeded_randn({3 * d}, 32) * 0.1;
    const auto wo = seeded_randn({d, d}, 33) / std::sqrt(static_cast<double>(d));
    const auto bo = seeded_randn({d}, 34) * 0.1;
    const auto x0 = seeded_randn({2, 6, d}, 35);
    const auto g = seeded_randn({2, 6, d}, 36);
    at::Tensor xr, wqkvr, bqkvr, wor, bor;
    std::tie(xr, wqkvr, bqkvr, wor, bor) = leaves(x0, wqkv, bqkv, wo, bo);
    const auto y_ref = at::linear(attention(at::linear(xr, wqkvr, bqkvr), heads, kHeadDim), wor, bor);
    y_ref.backward(g);
    run_ranks(world, [&](Group& tp) {
      const auto qkv_rows = muon::distributed::rows_per_rank_by_heads(heads, 3 * kHeadDim, world);
      const auto proj_cols = muon::distributed::rows_per_rank_by_heads(heads, kHeadDim, world);
      ColumnParallelLinear qkv(d, 3 * d, tp, true, qkv_rows);
      RowParallelLinear proj(d, d, tp, true, proj_cols);
      qkv->load_full(wqkv, bqkv);
      proj->load_full(wo, bo);
      const int64_t local_heads = qkv_rows[static_cast<size_t>(tp.rank())] / (3 * kHeadDim);
      auto x = leaf(x0);
      auto y = proj(attention(qkv(x), local_heads, kHeadDim));
      y.backward(g);
      const std::string where = " (" + std::to_string(heads) + " heads, " + std::to_string(world) +
                             " ranks, rank " + std::to_string(tp.rank()) + ")";
      const int64_t off = qkv->offset();
      const int64_t r = qkv->weight.size(0);
      check_chain(y, y_ref.detach(), "output" + where, worst);
      check_chain(x.grad(), xr.grad(), "input grad" + where, worst);
      check_chain(qkv->weight.grad(), wqkvr.grad().narrow(0, off, r), "qkv weight grad" + where, worst);
      check_chain(qkv->bias.grad(), bqkvr.grad().narrow(0, off, r), "qkv bias grad" + where, worst);
      check_chain(proj->weight.grad(), wor.grad().narrow(1, proj->offset(), proj->weight.size(1)),
                  "proj weight grad" + where, worst);
      check_chain(proj->bias.grad(), bor.grad(), "proj bias grad" + where, worst);
    });
  }
  std::printf("measured: largest max|diff| / max|ref| %.3g\n", worst.value());
}

// ---- 3. shards by name, and the optimizer ---------------------------------------

// The QKV projection has no bias here: the gradient of a key bias is zero in
// exact arithmetic (softmax is invariant to a constant added to one query's
// scores), so AdamW's first step, ≈ lr·sign(g), would move it by ±lr on
// rounding noise alone, differently in every summation order. The 1-D shard
// is fc1's bias.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t d, int64_t heads, const Group& tp) : head_dim(d / heads) {
    const auto rows = muon::distributed::rows_per_rank_by_heads(heads, 3 * head_dim, tp.size());
    qkv = register_module("qkv", ColumnParallelLinear(d, 3 * d, tp, /*bias=*/false, rows));
    proj = register_module(
        "proj", RowParallelLinear(d, d, tp, true, muon::distributed::rows_per_rank_by_heads(heads, head_dim, tp.size())));
    local_heads = rows[static_cast<size_t>(tp.rank())] / (3 * head_dim);
  }
  at::Tensor forward(const at::Tensor& x) { return proj(attention(qkv(x), local_heads, head_dim)); }
  int64_t head_dim;
  int64_t local_heads = 0;
  ColumnParallelLinear qkv{nullptr};
  RowParallelLinear proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t d, const Group& tp)
      : fc1(register_module("fc1", ColumnParallelLinear(d, 4 * d, tp))),
        fc2(register_module("fc2", RowParallelLinear(4 * d, d, tp))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(at::gelu(fc1(x))); }
  ColumnParallelLinear fc1;
  RowParallelLinear fc2;
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t heads, const Group& tp)
      : attn(register_module("attn", Attention(d, heads, tp))),
        mlp(register_module("mlp", Mlp(d, tp))) {}
  at::Tensor forward(at::Tensor x) {
    x = x + attn(x);
    return x + mlp(x);
  }
  Attention attn;
  Mlp mlp;
};
TORCH_MODULE(Block);

// Two TP blocks and a replicated head (a plain torch::nn::Linear).
struct ModelImpl : torch::nn::Module {
  static constexpr int64_t kD = 16;
  static constexpr int64_t kHeads = 4;
  static constexpr int64_t kOut = 11;
  explicit ModelImpl(const Group& tp)
      : blocks(register_module("blocks", torch::nn::ModuleList(Block(kD, kHeads, tp), Block(kD, kHeads, tp)))),
        head(register_module("head", torch::nn::Linear(kD, kOut))) {}
  at::Tensor forward(at::Tensor x) {
    for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x);
    return head(x);
  }
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Model);

// The same whole weights into the TP model (each rank's block) and into the
// single-process one: module k of named_modules gets seeds 100 + k, 200 + k.
void load_whole(Model& model) {
  int64_t k = 0;
  for (const auto& item : model->named_modules()) {
    ++k;
    const auto full = [k](int64_t out, int64_t in) {
      return std::make_pair(seeded_randn({out, in}, static_cast<uint64_t>(100 + k)) /
                                std::sqrt(static_cast<double>(in)),
                            seeded_randn({out}, static_cast<uint64_t>(200 + k)) * 0.1);
    };
    if (auto* col = item.value()->as<muon::distributed::ColumnParallelLinearImpl>()) {
      const auto [w, b] = full(col->out_features(), col->in_features());
      col->load_full(w, col->bias.defined() ? b : at::Tensor());
    } else if (auto* row = item.value()->as<muon::distributed::RowParallelLinearImpl>()) {
      const auto [w, b] = full(row->out_features(), row->in_features());
      row->load_full(w, b);
    } else if (auto* lin = item.value()->as<torch::nn::LinearImpl>()) {
      const auto [w, b] = full(lin->weight.size(0), lin->weight.size(1));
      at::NoGradGuard no_grad;
      lin->weight.copy_(w);
      lin->bias.copy_(b);
    }
  }
}

// Forward and backward of a fixed batch and loss.
void forward_backward(Model& model) {
  const auto x = seeded_randn({2, 6, ModelImpl::kD}, 41);
  const auto target = seeded_randn({2, 6, ModelImpl::kOut}, 42);
  (model(x) * target).sum().backward();
}

muon::OptimizerConfig muon_config(const std::string& layout, const std::string& tp_mode) {
  muon::OptimizerConfig c;
  c.set("optimizer", "muon").set("lr", 0.02).set("weight_decay", 0.01).set("layout", layout);
  if (layout == "tensor_parallel") c.set("muon_tp_mode", tp_mode);
  return c;
}

TEST(TensorParallelLayers, ShardsByFullNameOfANestedModel) {
  run_ranks(3, [](Group& tp) {
    Model model(tp);
    const auto shards = muon::distributed::tensor_parallel_shards(*model);
    constexpr int64_t d = ModelImpl::kD;
    const std::map<std::string, std::pair<std::vector<int64_t>, int64_t>> expected{
        {"attn.qkv.weight", {{3 * d, d}, 0}}, {"attn.proj.weight", {{d, d}, 1}},
        {"mlp.fc1.weight", {{4 * d, d}, 0}},  {"mlp.fc1.bias", {{4 * d}, 0}},
        {"mlp.fc2.weight", {{d, 4 * d}, 1}}};
    ASSERT_EQ(shards.size(), 2 * expected.size());
    const auto named = model->named_parameters();
    for (const std::string block : {"blocks.0.", "blocks.1."}) {
      for (const auto& [name, shape_dim] : expected) {
        const auto it = shards.find(block + name);
        ASSERT_NE(it, shards.end()) << block + name;
        EXPECT_TRUE(named.contains(block + name)) << block + name;
        EXPECT_EQ(it->second.global_shape(), shape_dim.first) << block + name;
        EXPECT_EQ(it->second.partition_dim(), shape_dim.second) << block + name;
        EXPECT_EQ(it->second.group().name(), tp.name()) << block + name;
        EXPECT_EQ(it->second.group().world_ranks(), tp.world_ranks()) << block + name;
        EXPECT_EQ(it->second.group().rank(), tp.rank()) << block + name;
        // This rank's block has the shard's shape but along the partition dim.
        const auto& local = named[block + name];
        for (int64_t dim = 0; dim < local.dim(); ++dim) {
          if (dim != shape_dim.second) {
            EXPECT_EQ(local.size(dim), shape_dim.first[static_cast<size_t>(dim)]);
          }
        }
      }
    }
    // The replicated parameters are not shards.
    for (const std::string name : {"blocks.0.attn.proj.bias", "blocks.1.mlp.fc2.bias", "head.weight",
                                   "head.bias"}) {
      EXPECT_TRUE(named.contains(name)) << name;
      EXPECT_EQ(shards.count(name), 0U) << name;
    }
    tp.barrier();  // see kNoCollectives
  });
}

TEST(TensorParallelLayers, OptimizerFromTheShardsEqualsSingleProcessMuon) {
  for (const std::string mode : {"duplicated", "distributed"}) {
    // Single process: the same model on one rank, whole matrices.
    Model whole(Group::single());
    load_whole(whole);
    std::map<std::string, at::Tensor> before;
    for (const auto& item : whole->named_parameters()) before[item.key()] = item.value().detach().clone();
    forward_backward(whole);
    auto reference = muon::make_optimizer(whole->named_parameters(), muon_config("none", mode));
    reference->step();
    std::map<std::string, at::Tensor> after;
    for (const auto& item : whole->named_parameters()) after[item.key()] = item.value().detach().clone();

    Worst worst;
    for (const int world : {2, 3}) {
      run_ranks(world, [&](Group& tp) {
        Model model(tp);
        load_whole(model);
        forward_backward(model);
        muon::distributed::DistributedLayout layout;
        layout.tensor_parallel = muon::distributed::tensor_parallel_shards(*model);
        auto opt = muon::distributed::make_optimizer(model->named_parameters(),
                                              muon_config("tensor_parallel", mode), layout);
        opt->step();
        // Every parameter against the same part of the single-process
        // result, relative to the largest change the step made.
        for (const auto& item : model->named_parameters()) {
          const auto& name = item.key();
          auto expected = after.at(name);
          auto start = before.at(name);
          const auto it = layout.tensor_parallel.find(name);
          if (it != layout.tensor_parallel.end()) {
            const int64_t dim = it->second.partition_dim();
            std::vector<int64_t> sizes;
            for (const auto& s : tp.all_gather_ints({item.value().size(dim)})) sizes.push_back(s.at(0));
            const int64_t off = muon::distributed::split_offset(sizes, tp.rank());
            expected = expected.narrow(dim, off, item.value().size(dim));
            start = start.narrow(dim, off, item.value().size(dim));
          }
          ASSERT_EQ(item.value().sizes(), expected.sizes()) << name;
          const double change = (after.at(name) - before.at(name)).abs().max().item<double>();
          ASSERT_GT(change, 0) << name;
          const double rel = (item.value().detach() - expected).abs().max().item<double>() / change;
          EXPECT_LE(rel, kStepTolerance) << name << " (" << mode << ", " << world << " ranks)";
          worst.update(rel);
        }
      });
    }
    std::printf("measured (%s): largest max|p - p_ref| / max|p_ref - p0| %.3g\n", mode.c_str(),
                worst.value());
  }
}

// ---- 4. one rank, initialization, errors ------------------------------------------

TEST(TensorParallelLayers, OneRankIsTorchLinearExactly) {
  for (const bool bias : {true, false}) {
    at::manual_seed(7);
    torch::nn::Linear linear(torch::nn::LinearOptions(6, 5).bias(bias));
    at::manual_seed(7);
    ColumnParallelLinear col(6, 5, Group::single(), bias);
    at::manual_seed(7);
    RowParallelLinear row(6, 5, Group::single(), bias);
    EXPECT_TRUE(at::equal(col->weight, linear->weight));
    EXPECT_TRUE(at::equal(row->weight, linear->weight));
    if (bias) {
      EXPECT_TRUE(at::equal(col->bias, linear->bias));
      EXPECT_TRUE(at::equal(row->bias, linear->bias));
    } else {
      EXPECT_FALSE(col->bias.defined());
      EXPECT_FALSE(row->bias.defined());
      EXPECT_EQ(col->named_parameters().size(), 1U);
    }
    const auto x0 = seeded_randn({3, 4, 6}, 51);
    const auto g = seeded_randn({3, 4, 5}, 52);
    auto xl = leaf(x0);
    const auto y_ref = linear(xl);
    y_ref.backward(g);
    for (torch::nn::Module* m : {static_cast<torch::nn::Module*>(col.get()), static_cast<torch::nn::Module*>(row.get())}) {
      auto x = leaf(x0);
      const bool is_col = m == col.get();
      auto y = is_col ? col(x) : row(x);
      y.backward(g);
      const auto& w = is_col ? col->weight : row->weight;
      const auto& b = is_col ? col->bias : row->bias;
      const std::string what = std::string(is_col ? "column" : "row") + (bias ? " with bias" : "");
      EXPECT_TRUE(at::equal(y, y_ref)) << what;
      EXPECT_TRUE(at::equal(x.grad(), xl.grad())) << what;
      EXPECT_TRUE(at::equal(w.grad(), linear->weight.grad())) << what;
      if (bias) {
        EXPECT_TRUE(at::equal(b.grad(), linear->bias.grad())) << what;
      }
    }
  }
}

TEST(TensorParallelLayers, InitializationTilesTorchLinearWithTheSameSeed) {
  at::manual_seed(9);
  torch::nn::Linear linear(7, 10);
  std::mutex generator;  // the global generator: one rank at a time
  run_ranks(3, [&](Group& tp) {
    // The layers drawn as rank tp.rank() draws them, one rank at a time.
    const auto [col, row] = [&] {
      std::lock_guard<std::mutex> lock(generator);
      at::manual_seed(9);
      ColumnParallelLinear c(7, 10, tp);
      at::manual_seed(9);
      return std::make_pair(c, RowParallelLinear(7, 10, tp));
    }();
    EXPECT_TRUE(at::equal(col->weight, linear->weight.narrow(0, col->offset(), col->weight.size(0))));
    EXPECT_TRUE(at::equal(col->bias, linear->bias.narrow(0, col->offset(), col->bias.size(0))));
    EXPECT_TRUE(at::equal(row->weight, linear->weight.narrow(1, row->offset(), row->weight.size(1))));
    EXPECT_TRUE(at::equal(row->bias, linear->bias));
    tp.barrier();  // see kNoCollectives (outside the lock: the others wait on it)
  });
}

TEST(TensorParallelLayers, ShardsOfARootLayerAndOfOneNotHeldByASharedPtr) {
  muon::distributed::ColumnParallelLinearImpl col(4, 6, Group::single());
  const auto shards = muon::distributed::tensor_parallel_shards(col);
  ASSERT_EQ(shards.size(), 2U);
  EXPECT_EQ(shards.at("weight").global_shape(), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(shards.at("bias").global_shape(), (std::vector<int64_t>{6}));
  RowParallelLinear row(4, 6, Group::single());
  const auto row_shards = muon::distributed::tensor_parallel_shards(*row);
  ASSERT_EQ(row_shards.size(), 1U);
  EXPECT_EQ(row_shards.at("weight").partition_dim(), 1);
  // Plain modules have none.
  EXPECT_TRUE(muon::distributed::tensor_parallel_shards(*torch::nn::Linear(3, 3)).empty());
}

// A TP module that declares a parameter it does not have.
struct MisnamedImpl : torch::nn::Module, muon::distributed::TensorParallelModule {
  MisnamedImpl() { register_parameter("weight", at::zeros({2, 2})); }
  std::vector<std::pair<std::string, TensorParallelShard>> tensor_parallel_shards() const override {
    return {{"weigth", TensorParallelShard({4, 2}, 0, Group::single())}};
  }
};
TORCH_MODULE(Misnamed);

TEST(TensorParallelLayers, BadArgumentsRaiseNamingThem) {
  const std::string col = "[muon::distributed::ColumnParallelLinear]";
  const std::string row = "[muon::distributed::RowParallelLinear]";
  expect_value_error([] { ColumnParallelLinear(4, 6, Group::single(), true, std::vector<int64_t>{2, 4}); },
                     {col, "rows_per_rank", "[2, 4]", "out_features (6)"});
  expect_value_error([] { RowParallelLinear(4, 6, Group::single(), true, std::vector<int64_t>{3}); },
                     {row, "cols_per_rank", "[3]", "in_features (4)"});
  expect_value_error([] { ColumnParallelLinear(4, 6, Group()); }, {col, "tp", "invalid"});
  expect_value_error([] { RowParallelLinear(0, 6, Group::single()); }, {row, "in_features", "0"});
  // Long lists are clipped in the message.
  expect_value_error([] { ColumnParallelLinear(4, 6, Group::single(), true, std::vector<int64_t>(1000, 1)); },
                     {col, "rows_per_rank", "(1000 entries)"});
  run_ranks(2, [&](Group& tp) {
    expect_value_error([&] { ColumnParallelLinear(4, 6, tp, true, std::vector<int64_t>{4, 3}); },
                       {col, "rows_per_rank", "[4, 3]", "tp (2)", "out_features (6)"});
    expect_value_error([&] { ColumnParallelLinear(4, 6, tp, true, std::vector<int64_t>{7, -1}); },
                       {col, "rows_per_rank", "[7, -1]"});
    expect_value_error([&] { RowParallelLinear(4, 6, tp, true, std::vector<int64_t>{5, 0}); },
                       {row, "cols_per_rank", "[5, 0]"});
    tp.barrier();  // see kNoCollectives
  });
  ColumnParallelLinear layer(4, 6, Group::single());
  expect_value_error([&] { layer->load_full(at::zeros({6, 5})); },
                     {col, "load_full", "weight", "[6, 4]", "[6, 5]"});
  expect_value_error([&] { layer->load_full(at::zeros({6, 4}), at::zeros({5})); },
                     {col, "load_full", "bias", "[6]", "[5]"});
  RowParallelLinear no_bias(4, 6, Group::single(), /*bias=*/false);
  expect_value_error([&] { no_bias->load_full(at::zeros({6, 4}), at::zeros({6})); },
                     {row, "load_full", "bias = false"});
  expect_value_error([] { muon::distributed::rows_per_rank_by_heads(0, 12, 2); },
                     {"[muon::distributed::rows_per_rank_by_heads]", "heads", "0"});
  expect_value_error([] { muon::distributed::tensor_parallel_shards(*Misnamed()); },
                     {"[muon::distributed::tensor_parallel_shards]", "weigth"});
  EXPECT_EQ(muon::distributed::rows_per_rank_by_heads(5, 12, 3), (std::vector<int64_t>{24, 24, 12}));
  EXPECT_EQ(muon::distributed::rows_per_rank_by_heads(2, 6, 3), (std::vector<int64_t>{6, 6, 0}));
}

}  // namespace
}  // namespace muon::test
