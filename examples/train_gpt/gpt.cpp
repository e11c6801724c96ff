// The small GPT: modules and initialization.
#include "gpt.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>

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

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& c) : heads_(c.heads) {
  qkv_ = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(c.width, 3 * c.width).bias(false)));
  proj_ = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(c.width, c.width).bias(false)));
  mask_ = register_buffer(
      "mask", at::full({c.context, c.context}, -INFINITY).triu(1));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0);
  const int64_t t = x.size(1);
  const int64_t d = x.size(2);
  const int64_t hd = d / heads_;
  // (b, t, 3d) → three (b, h, t, hd)
  auto qkv = qkv_->forward(x).view({b, t, 3, heads_, hd}).permute({2, 0, 3, 1, 4});
  const auto q = qkv[0];
  const auto k = qkv[1];
  const auto v = qkv[2];
  auto att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  att = at::softmax(att + mask_.narrow(0, 0, t).narrow(1, 0, t), -1);
  auto y = at::matmul(att, v).transpose(1, 2).reshape({b, t, d});
  return proj_->forward(y);
}

BlockImpl::BlockImpl(const GptConfig& c) {
  norm1_ = register_module("norm1", Norm(c.norm, c.width));
  attn_ = register_module("attn", CausalSelfAttention(c));
  norm2_ = register_module("norm2", Norm(c.norm, c.width));
  fc1_ = register_module("fc1", torch::nn::Linear(c.width, c.mlp_ratio * c.width));
  fc2_ = register_module("fc2", torch::nn::Linear(c.mlp_ratio * c.width, c.width));
}

at::Tensor BlockImpl::forward(at::Tensor x) {
  x = x + attn_->forward(norm1_->forward(x));
  return x + fc2_->forward(at::gelu(fc1_->forward(norm2_->forward(x))));
}

GptImpl::GptImpl(const GptConfig& c) : config_(c) {
  c.validate();
  wte_ = register_module("wte", torch::nn::Embedding(c.vocab_size, c.width));
  wpe_ = register_module("wpe", torch::nn::Embedding(c.context, c.width));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (const auto i : c10::irange(c.layers)) {
    (void)i;
    blocks_->push_back(Block(c));
  }
  norm_f_ = register_module("norm_f", Norm(c.norm, c.width));
  lm_head_ = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.width, c.vocab_size).bias(false)));

  // GPT-2 initialization: N(0, 0.02) weights, zero biases, residual output
  // projections scaled by 1/√(2·layers).
  at::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (auto& item : named_parameters()) {
    auto& p = item.value();
    const auto& name = item.key();
    if (p.dim() < 2) {
      if (name.find("norm") == std::string::npos) p.zero_();
      continue;
    }
    const bool residual = name.find("attn.proj") != std::string::npos ||
                          name.find("fc2") != std::string::npos;
    p.normal_(0.0, residual ? residual_std : 0.02);
  }
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

int64_t GptImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace train_gpt
