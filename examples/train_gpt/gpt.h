#pragma once

/// A small decoder-only transformer (GPT-2 shape) in LibTorch's C++ module
/// API: token and position embeddings, pre-norm blocks of causal
/// self-attention with a fused QKV projection and an MLP, a final norm and an
/// untied output head. Parameter names follow GPT-2 (`wte`, `wpe`,
/// `blocks.N.attn.qkv`, `lm_head`) so that muon's default routing sends the
/// embeddings and the head to AdamW and the hidden matrices to Muon.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

namespace train_gpt {

/// Model shape.
struct GptConfig {
  /// Tokens in the vocabulary.
  int64_t vocab_size = 64;
  /// Context length (positions).
  int64_t context = 64;
  /// Transformer blocks.
  int64_t layers = 4;
  /// Attention heads; must divide `width`.
  int64_t heads = 4;
  /// Model width d.
  int64_t width = 128;
  /// MLP hidden width = mlp_ratio · d.
  int64_t mlp_ratio = 4;
  /// "rms" (RMSNorm) or "layer" (LayerNorm).
  std::string norm = "rms";

  /// Raises c10::ValueError naming the first invalid field.
  void validate() const;
};

/// Root-mean-square normalization with a learned gain (Zhang & Sennrich 2019).
class RmsNormImpl : public torch::nn::Module {
 public:
  explicit RmsNormImpl(int64_t width, double eps = 1e-6);
  at::Tensor forward(const at::Tensor& x);

 private:
  at::Tensor weight_;
  double eps_;
};
TORCH_MODULE(RmsNorm);

/// LayerNorm or RMSNorm, chosen by name.
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(const std::string& kind, int64_t width);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::AnyModule norm_;
};
TORCH_MODULE(Norm);

/// Causal multi-head self-attention with one fused QKV projection (no bias).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t heads_;
  torch::nn::Linear qkv_{nullptr};
  torch::nn::Linear proj_{nullptr};
  at::Tensor mask_;  // (context, context) additive causal mask, a buffer
};
TORCH_MODULE(CausalSelfAttention);

/// Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& config);
  at::Tensor forward(at::Tensor x);

 private:
  Norm norm1_{nullptr};
  CausalSelfAttention attn_{nullptr};
  Norm norm2_{nullptr};
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};
TORCH_MODULE(Block);

/// The model: logits (batch, time, vocab) from token ids (batch, time).
class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptConfig& config);
  /// Logits for `tokens` (int64, batch × time, time ≤ context).
  at::Tensor forward(const at::Tensor& tokens);
  /// Mean cross-entropy of next-token prediction: `tokens` (batch × (time+1)).
  at::Tensor loss(const at::Tensor& tokens);
  /// The configuration it was built with.
  const GptConfig& config() const { return config_; }
  /// Number of parameter elements.
  int64_t num_parameters() const;

 private:
  GptConfig config_;
  torch::nn::Embedding wte_{nullptr};
  torch::nn::Embedding wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  Norm norm_f_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace train_gpt
