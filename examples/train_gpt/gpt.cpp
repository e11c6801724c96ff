// The small GPT: modules and initialization.
#include "gpt.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

namespace train_gpt {

void GptConfig::validate() const {
  TORCH_CHECK_VALUE(vocab_size >= 2, "[train_gpt] vocab_size must be >= 2, got ", vocab_size);
  TORCH_CHECK_VALUE(context >= 2, "[train_gpt] context must be >= 2, got ", context);
  TORCH_CHECK_VALUE(layers >= 1, "[train_gpt] layers must be >= 1, got ", layers);
  TORCH_CHECK_VALUE(width >= 1, "[train_gpt] width must be >= 1, got ", width);
  TORCH_CHECK_VALUE(heads >= 1 && width % heads == 0, "[train_gpt] heads must divide width ",
                    width, ", got ", heads);
  TORCH_CHECK_VALUE(mlp_ratio >= 1, "[train_gpt] mlp_ratio must be >= 1, got ", mlp_ratio);
  TORCH_CHECK_VALUE(norm == "rms" || norm == "layer",
                    "[train_gpt] norm must be 'rms' or 'layer', got '", norm, "'");
  TORCH_CHECK_VALUE(experts >= 0, "[train_gpt] experts must be >= 0, got ", experts);
}

RmsNormImpl::RmsNormImpl(int64_t width, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", at::ones({width}));
}

at::Tensor RmsNormImpl::forward(const at::Tensor& x) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps_) * weight_;
}

NormImpl::NormImpl(const std::string& kind, int64_t width) {
  if (kind == "rms") {
    norm_ = torch::nn::AnyModule(register_module("norm", RmsNorm(width)));
  } else {
    norm_ = torch::nn::AnyModule(register_module(
        "norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}))));
  }
}

at::Tensor NormImpl::forward(const at::Tensor& x) { return norm_.forward(x); }

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& c, const muon::distributed::Group& tp)
    : head_dim_(c.width / c.heads) {
  // Each rank holds whole heads: of the fused QKV weight, the q, k and v
  // rows of its heads; of the output projection, their columns.
  const auto qkv_rows = muon::distributed::rows_per_rank_by_heads(c.heads, 3 * head_dim_, tp.size());
  const auto proj_cols = muon::distributed::rows_per_rank_by_heads(c.heads, head_dim_, tp.size());
  heads_ = qkv_rows.at(static_cast<size_t>(tp.rank())) / (3 * head_dim_);
  head_begin_ = muon::distributed::split_offset(qkv_rows, tp.rank()) / (3 * head_dim_);
  qkv_ = register_module("qkv", muon::distributed::ColumnParallelLinear(c.width, 3 * c.width, tp,
                                                                  /*bias=*/false, qkv_rows));
  proj_ = register_module("proj", muon::distributed::RowParallelLinear(c.width, c.width, tp,
                                                                 /*bias=*/false, proj_cols));
  mask_ = register_buffer(
      "mask", at::full({c.context, c.context}, -INFINITY).triu(1));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0);
  const int64_t t = x.size(1);
  const int64_t hd = head_dim_;
  // (b, t, heads·3·hd), per head q, k, v → three (b, heads, t, hd)
  auto qkv = qkv_->forward(x).view({b, t, heads_, 3, hd}).permute({3, 0, 2, 1, 4});
  const auto q = qkv[0];
  const auto k = qkv[1];
  const auto v = qkv[2];
  auto att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  att = att + mask_.narrow(0, 0, t).narrow(1, 0, t);
  if (at::GradMode::is_enabled()) {
    // The step's largest logit per head (QK-clip): masked pairs are −∞.
    at::NoGradGuard no_grad;
    max_logits_ = att.detach().amax({0, 2, 3}).to(at::kDouble);
  }
  att = at::softmax(att, -1);
  auto y = at::matmul(att, v).transpose(1, 2).reshape({b, t, heads_ * hd});
  return proj_->forward(y);
}

MoeImpl::MoeImpl(const GptConfig& c) {
  const int64_t hidden = c.mlp_ratio * c.width;
  router_ = register_module(
      "router", torch::nn::Linear(torch::nn::LinearOptions(c.width, c.experts).bias(false)));
  fc1_ = register_parameter("experts_fc1", at::zeros({c.experts, hidden, c.width}));
  fc2_ = register_parameter("experts_fc2", at::zeros({c.experts, c.width, hidden}));
}

at::Tensor MoeImpl::forward(const at::Tensor& x) {
  const auto flat = x.reshape({-1, x.size(-1)});
  const auto probs = at::softmax(router_->forward(flat), -1);
  const auto [gate, choice] = probs.max(-1);
  auto out = at::zeros_like(flat);
  for (int64_t e = 0; e < fc1_.size(0); ++e) {
    const auto tokens = (choice == e).nonzero().squeeze(1);
    if (tokens.numel() == 0) continue;
    const auto h = at::gelu(at::matmul(flat.index_select(0, tokens), fc1_[e].t()));
    const auto y = at::matmul(h, fc2_[e].t()) * gate.index_select(0, tokens).unsqueeze(1);
    out = out.index_add(0, tokens, y);
  }
  return out.view_as(x);
}

BlockImpl::BlockImpl(const GptConfig& c, const muon::distributed::Group& tp) {
  norm1_ = register_module("norm1", Norm(c.norm, c.width));
  attn_ = register_module("attn", CausalSelfAttention(c, tp));
  norm2_ = register_module("norm2", Norm(c.norm, c.width));
  if (c.experts > 0) {
    moe_ = register_module("moe", Moe(c));
  } else {
    fc1_ = register_module("fc1", muon::distributed::ColumnParallelLinear(c.width, c.mlp_ratio * c.width, tp));
    fc2_ = register_module("fc2", muon::distributed::RowParallelLinear(c.mlp_ratio * c.width, c.width, tp));
  }
}

at::Tensor BlockImpl::forward(at::Tensor x) {
  x = x + attn_->forward(norm1_->forward(x));
  if (moe_) return x + moe_->forward(norm2_->forward(x));
  return x + fc2_->forward(at::gelu(fc1_->forward(norm2_->forward(x))));
}

GptImpl::GptImpl(const GptConfig& c, const muon::distributed::Group& tp) : config_(c), tp_(tp) {
  c.validate();
  TORCH_CHECK_VALUE(tp.size() <= c.heads, "[train_gpt] a tensor-parallel group of ", tp.size(),
                    " ranks needs at least as many heads, got ", c.heads);
  // The initialization's own stream, drawn first from the global generator:
  // the values do not depend on what building the modules draws.
  const auto seed = at::randint(std::numeric_limits<int64_t>::max(), {1}, at::kLong).item<int64_t>();
  wte_ = register_module("wte", torch::nn::Embedding(c.vocab_size, c.width));
  wpe_ = register_module("wpe", torch::nn::Embedding(c.context, c.width));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (const auto i : c10::irange(c.layers)) {
    (void)i;
    blocks_->push_back(Block(c, tp));
  }
  norm_f_ = register_module("norm_f", Norm(c.norm, c.width));
  lm_head_ = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.width, c.vocab_size).bias(false)));
  initialize(static_cast<uint64_t>(seed));
}

void GptImpl::initialize(uint64_t seed) {
  // GPT-2 initialization of the whole (single-process) model: N(0, 0.02)
  // weights, zero biases, unit norm gains, residual output projections
  // scaled by 1/√(2·layers); then each rank keeps its blocks.
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.layers));
  const auto shards = tensor_parallel_shards();
  std::map<std::string, at::Tensor> whole;
  for (const auto& item : named_parameters()) {
    const auto& name = item.key();
    const auto& p = item.value();
    const auto it = shards.find(name);
    const auto shape = it != shards.end() ? it->second.global_shape() : p.sizes().vec();
    at::Tensor value;
    if (shape.size() < 2) {
      // Norm gains and biases keep their modules' values (1 and 0).
      value = name.find("norm") != std::string::npos ? p.clone() : at::zeros(shape, p.options());
    } else {
      const bool residual = name.find("attn.proj") != std::string::npos ||
                            name.find("fc2") != std::string::npos;
      value = at::empty(shape, p.options()).normal_(0.0, residual ? residual_std : 0.02, gen);
    }
    if (name.find("attn.qkv") != std::string::npos) {
      // Drawn as [q; k; v], stored per head: [q₀ k₀ v₀; q₁ k₁ v₁; ...].
      const int64_t d = config_.width;
      value = value.view({3, config_.heads, d / config_.heads, d}).transpose(0, 1).reshape({3 * d, d});
    }
    whole.emplace(name, value);
  }
  for (const auto& item : named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const auto prefix = item.key() + ".";
    const auto bias = [&] {
      const auto b = whole.find(prefix + "bias");
      return b != whole.end() ? b->second : at::Tensor();
    };
    if (auto* column = item.value()->as<muon::distributed::ColumnParallelLinearImpl>()) {
      column->load_full(whole.at(prefix + "weight"), bias());
    } else if (auto* row = item.value()->as<muon::distributed::RowParallelLinearImpl>()) {
      row->load_full(whole.at(prefix + "weight"), bias());
    }
  }
  for (auto& item : named_parameters()) {
    if (shards.count(item.key()) == 0) item.value().copy_(whole.at(item.key()));
  }
}

std::map<std::string, muon::distributed::TensorParallelShard> GptImpl::tensor_parallel_shards() const {
  if (tp_.size() == 1) return {};
  return muon::distributed::tensor_parallel_shards(*this);
}

at::Tensor GptImpl::forward(const at::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  TORCH_CHECK_VALUE(t <= config_.context, "[train_gpt] sequence of ", t,
                    " tokens exceeds the context ", config_.context);
  auto x = wte_->forward(tokens) + wpe_->forward(at::arange(t, tokens.options()));
  for (const auto& block : *blocks_) x = block->as<Block>()->forward(x);
  return lm_head_->forward(norm_f_->forward(x));
}

at::Tensor GptImpl::loss(const at::Tensor& tokens) {
  const auto input = tokens.narrow(1, 0, tokens.size(1) - 1);
  const auto target = tokens.narrow(1, 1, tokens.size(1) - 1);
  const auto logits = forward(input);
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
}

std::vector<at::Tensor> GptImpl::max_logits() const {
  std::vector<at::Tensor> out;
  for (const auto& block : *blocks_) {
    const auto& attn = *block->as<Block>()->attention();
    if (!attn.max_logits().defined()) {
      out.emplace_back();
      continue;
    }
    auto m = at::full({config_.heads}, -INFINITY, at::kDouble);
    m.narrow(0, attn.head_begin(), attn.max_logits().numel()).copy_(attn.max_logits());
    out.push_back(m);
  }
  return out;
}

int64_t GptImpl::qkv_row_begin() const {
  const auto& attn = *blocks_->at<BlockImpl>(0).attention();
  return attn.head_begin() * 3 * (config_.width / config_.heads);
}

int64_t GptImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace train_gpt
