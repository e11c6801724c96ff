#pragma once

/// A small decoder-only transformer (GPT-2 shape) in LibTorch's C++ module
/// API: token and position embeddings, pre-norm blocks of causal
/// self-attention with a fused QKV projection and an MLP, a final norm and an
/// untied output head. Parameter names follow GPT-2 (`wte`, `wpe`,
/// `blocks.N.attn.qkv`, `lm_head`) so that muon's default routing sends the
/// embeddings and the head to AdamW and the hidden matrices to Muon.
///
/// Tensor parallel: given a tensor-parallel group of p ranks, the attention
/// and MLP matrices are Megatron-style column- and row-parallel layers
/// (muon/distributed/layouts/tensor_parallel_layers.h) and each rank holds its
/// block: the fused QKV projection and the attention output split by heads,
/// fc1 by rows and fc2 by columns. The embeddings, norms, head and experts
/// are whole on every rank. With one rank (the default) the same code is the
/// single-process model; its parameters are the blocks' whole matrices, and
/// the initialization is the same for every p (a rank's blocks are the
/// blocks of the single-process model's values).
///
/// The fused QKV weight holds its rows per head (head h: its q, k and v
/// rows), so that a rank's heads are one block of rows.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "muon/distributed/layouts/tensor_parallel_layers.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"

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
  /// Experts of a mixture-of-experts MLP in every block (0: a dense MLP).
  /// Top-1 routing; the expert matrices are stacked (experts, out, in).
  int64_t experts = 0;

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

/// Causal multi-head self-attention with one fused QKV projection (no
/// bias), this rank's heads of the tensor-parallel group `tp`.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GptConfig& config, const muon::distributed::Group& tp);
  at::Tensor forward(const at::Tensor& x);
  /// The largest pre-softmax logit q_i·k_j/√d (causal pairs j <= i) of each
  /// of this rank's heads over the batch of the last forward run with
  /// gradients on (a training step's; float64, local heads; undefined
  /// before the first). Computed under no_grad from the logits the forward
  /// forms.
  const at::Tensor& max_logits() const { return max_logits_; }
  /// The global index of this rank's first head.
  int64_t head_begin() const { return head_begin_; }

 private:
  int64_t heads_;     // this rank's
  int64_t head_begin_ = 0;
  int64_t head_dim_;
  at::Tensor max_logits_;
  muon::distributed::ColumnParallelLinear qkv_{nullptr};
  muon::distributed::RowParallelLinear proj_{nullptr};
  at::Tensor mask_;  // (context, context) additive causal mask, a buffer
};
TORCH_MODULE(CausalSelfAttention);

/// Mixture of experts with top-1 routing: a router (experts × d) picks one
/// expert per token, whose GELU MLP output is scaled by the router's
/// probability of it. Expert weights are stacked: `experts_fc1` (experts,
/// hidden, d) and `experts_fc2` (experts, d, hidden), without biases.
class MoeImpl : public torch::nn::Module {
 public:
  explicit MoeImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::Linear router_{nullptr};
  at::Tensor fc1_;
  at::Tensor fc2_;
};
TORCH_MODULE(Moe);

/// Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)),
/// the MLP dense (fc1, fc2: column- and row-parallel over `tp`) or a
/// mixture of experts (`moe`).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GptConfig& config, const muon::distributed::Group& tp);
  at::Tensor forward(at::Tensor x);
  /// Its attention.
  const CausalSelfAttention& attention() const { return attn_; }

 private:
  Norm norm1_{nullptr};
  CausalSelfAttention attn_{nullptr};
  Norm norm2_{nullptr};
  muon::distributed::ColumnParallelLinear fc1_{nullptr};
  muon::distributed::RowParallelLinear fc2_{nullptr};
  Moe moe_{nullptr};
};
TORCH_MODULE(Block);

/// The model: logits (batch, time, vocab) from token ids (batch, time).
class GptImpl : public torch::nn::Module {
 public:
  /// The model, this rank's blocks over the tensor-parallel group `tp`
  /// (Group::single(): the whole model), initialized from the global
  /// generator's state (at::manual_seed) the same way for every `tp`.
  /// Collective over `tp` only through forward and backward. Raises
  /// c10::ValueError for an invalid config or more ranks in `tp` than heads.
  explicit GptImpl(const GptConfig& config,
                   const muon::distributed::Group& tp = muon::distributed::Group::single());
  /// Logits for `tokens` (int64, batch × time, time ≤ context).
  at::Tensor forward(const at::Tensor& tokens);
  /// Mean cross-entropy of next-token prediction: `tokens` (batch × (time+1)).
  at::Tensor loss(const at::Tensor& tokens);
  /// The configuration it was built with.
  const GptConfig& config() const { return config_; }
  /// Number of parameter elements (this rank's).
  int64_t num_parameters() const;
  /// The tensor-parallel blocks by parameter name (empty with one rank), as
  /// muon::distributed::DistributedLayout::tensor_parallel takes them.
  std::map<std::string, muon::distributed::TensorParallelShard> tensor_parallel_shards() const;
  /// The tensor-parallel group it was built over.
  const muon::distributed::Group& tensor_parallel_group() const { return tp_; }
  /// Per block, the largest attention logit of every head (float64,
  /// config().heads) in the last training forward: this rank's heads, −∞
  /// for the heads other tensor-parallel ranks hold (a MAX over the ranks
  /// completes it). Undefined tensors before the first training forward.
  std::vector<at::Tensor> max_logits() const;
  /// The first global row of this rank's block of every fused QKV weight
  /// (rows per head [q_h; k_h; v_h]; 0 with one tensor-parallel rank).
  int64_t qkv_row_begin() const;

 private:
  void initialize(uint64_t seed);

  GptConfig config_;
  muon::distributed::Group tp_;
  torch::nn::Embedding wte_{nullptr};
  torch::nn::Embedding wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  Norm norm_f_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace train_gpt
