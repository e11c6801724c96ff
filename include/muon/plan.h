#pragma once

/// A cost model of every distributed layout (`muon::plan`): from a model
/// description (its tensors: shapes, which go to Muon, tensor-parallel
/// splits, experts) and a machine description (GEMM rate per dtype and shape
/// class, element-wise bandwidth, memory, ranks per node, an alpha-beta
/// model of the intra- and inter-node links, overlap), it predicts for each
/// layout and world size the optimizer step's time (Newton–Schulz,
/// element-wise, each collective), the bytes each rank sends, the optimizer
/// state and parameter bytes per rank, and Muon's step against AdamW's, and
/// recommends a layout. docs/scale.md validates it against measured runs and
/// projects published setups; the command is `muon-plan`.
///
/// Bytes follow muon::distributed::Group::bytes_sent (the ring model) and the
/// layouts' own bucketing, padding and owner packing, so that a prediction
/// for a model this library runs is exact, byte for byte. Times are a model:
/// an alpha-beta cost per collective and a rate per GEMM shape class.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "muon/enum_names.h"

namespace muon::plan {

/// Model and machine JSON texts are at most this long (8 MiB); the other
/// input ranges: docs/scale.md#input-ranges.
constexpr int64_t kMaxInputBytes = int64_t{8} << 20;

/// Which optimizer updates a tensor.
enum class Route { kMuon, kAdamW };

/// How tensor parallelism splits a tensor: `kRows` (a column-parallel
/// linear: its output rows), `kCols` (a row-parallel linear: its input
/// columns), or not at all (replicated over the tensor-parallel group).
enum class Split { kNone, kRows, kCols };

/// One parameter of the model (fp32 unless `dtype_bytes` says otherwise).
/// A Muon tensor of 3 dimensions is a stack of matrices (experts): each
/// [rows, cols] slice is orthogonalized on its own.
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  Route route = Route::kMuon;
  Split split = Split::kNone;
  int64_t dtype_bytes = 4;
  /// Expert weights of an expert-parallel model (Model::expert_parallel):
  /// their gradients are reduced over the expert-data-parallel group.
  bool expert = false;

  /// Refused (ValueError naming the tensor) where int64 cannot hold them.
  int64_t numel() const;
  int64_t bytes() const;
};

/// A model: its tensors in parameter order (bucketing follows the order),
/// and what one training step of it moves besides the optimizer's traffic.
struct Model {
  std::string name;
  std::string description;
  std::vector<Tensor> tensors;
  /// Tensor-parallel all-reduces of activations per training step (forward
  /// and backward), each of `activation_elements` fp32 elements for the
  /// whole data-parallel replica (the main job's TP linears: 4 per block).
  int64_t activation_all_reduces = 0;
  int64_t activation_elements = 0;
  /// Floating-point operations of one forward and backward pass of one data
  /// replica's batch (6 · parameters · tokens for a dense transformer), for
  /// the optimizer's share of a training step; 0: unknown.
  double train_flops = 0;
  /// The model FLOP/s a rank sustains in forward and backward (a published
  /// AdamW throughput); 0: the machine's large bf16 GEMM rate.
  double train_flops_per_s = 0;
  /// Expert parallelism of a published setup: the expert tensors listed are
  /// one rank's own experts (already divided by the expert-parallel size),
  /// reduced over `expert_data_parallel` ranks; 0: the expert tensors are
  /// ordinary parameters of the data-parallel group.
  int64_t expert_data_parallel = 0;
  /// Pipeline stages the listed tensors are one stage of (1: none).
  int64_t pipeline_stages = 1;

  int64_t parameters() const;
  int64_t muon_parameters() const;

  /// The main job's model (examples/train_gpt: muon-train-gpt's flags),
  /// tensors in its parameter order, with its TP splits; `global_batch`
  /// sequences of `context` tokens per step.
  static Model gpt(int64_t layers, int64_t width, int64_t heads, int64_t vocab, int64_t context,
                   int64_t global_batch, int64_t mlp_ratio = 4, int64_t experts = 0);
  /// A named model: "kimi-k2", "qwen3-30b-a3b", "dsv3-proxy-1b" ...
  /// "dsv3-proxy-8b", "dion-1b" (docs/scale.md says where each comes from).
  static Model preset(const std::string& name);
  static std::vector<std::string> preset_names();
  /// From JSON: {"name": ..., "tensors": [{"name", "shape", "route":
  /// "muon"|"adamw", "split": "none"|"rows"|"cols", "count", "expert",
  /// "dtype_bytes"}], "activation_all_reduces", "activation_elements",
  /// "train_flops", "expert_data_parallel", "pipeline_stages"}; a
  /// tensor's "count" repeats it (layers).
  static Model from_json(const std::string& text);
};

/// A link of the alpha-beta model: a message costs `latency_s` per hop
/// plus its bytes over `bytes_per_s` (per rank, one direction).
struct Link {
  double latency_s = 0;
  /// An all-reduce's bytes per second; all-gathers and all-to-alls may move
  /// bytes at other rates (Gloo's all-gather copies into fresh outputs):
  /// 0 means the all-reduce's.
  double bytes_per_s = 1;
  double all_gather_bytes_per_s = 0;
  double all_to_all_bytes_per_s = 0;
};

/// The GEMM shape classes: by a matrix's smaller side m, ≤ 128, ≤ 512,
/// ≤ 2048, larger.
constexpr int kShapeClasses = 4;
int shape_class(int64_t smaller_side);

/// A machine: what one rank computes and how ranks talk.
struct Machine {
  std::string name;
  /// Where the figures come from (a calibration run, a datasheet).
  std::string source;
  /// Sustained Newton–Schulz rate in FLOP/s per shape class, fp32 and bf16:
  /// one accelerator's, or a whole CPU node's (all its cores).
  double gemm_fp32[kShapeClasses] = {1, 1, 1, 1};
  double gemm_bf16[kShapeClasses] = {1, 1, 1, 1};
  /// A CPU node's rate per rank when `cores_per_node` one-thread ranks run
  /// Newton–Schulz at once (0: the node's rate divided among them); more
  /// ranks than cores divide the cores.
  double rank_gemm_fp32[kShapeClasses] = {0, 0, 0, 0};
  double rank_gemm_bf16[kShapeClasses] = {0, 0, 0, 0};
  /// Seconds per element of the element-wise part of a step (momentum,
  /// scaling, weight decay, the update), Muon's and AdamW's (an
  /// accelerator's, or one CPU thread's: a rank's).
  double muon_elementwise_s = 0;
  double adamw_elementwise_s = 0;
  /// Seconds per tensor per step beyond its elements (kernel launches,
  /// bookkeeping; Muon's includes a small matrix's Newton–Schulz calls).
  double muon_tensor_s = 0;
  double adamw_tensor_s = 0;
  /// Seconds per batched Newton–Schulz call beyond its FLOPs (one call per
  /// distinct matrix shape a rank orthogonalizes).
  double ns_call_s = 0;
  /// Memory per rank in bytes.
  double memory_bytes = 0;
  /// Ranks on one node, and a CPU node's cores (0 for accelerators: a rank
  /// each). A CPU node's ranks share it: alone, a rank runs at the node's
  /// rates; several run at rank_gemm_* each; beyond one rank per core they
  /// share the cores (rates scaled by cores / ranks).
  int64_t ranks_per_node = 1;
  int64_t cores_per_node = 0;
  Link intra;
  Link inter;
  /// Fraction of the smaller of a pipelined stage's compute and its
  /// communication that is hidden behind the other (0: none).
  double overlap = 0;

  /// "h100" (DGX H100), "gb300" (GB300 NVL72), "this" (this machine's
  /// calibration, when one was written); docs/scale.md names the figures.
  static Machine preset(const std::string& name);
  static std::vector<std::string> preset_names();
  static Machine from_json(const std::string& text);
  std::string to_json() const;
};

/// The layouts, as muon-train-gpt names them (--parallel, --optimizer-layout).
enum class LayoutKind {
  kReplicated,         ///< ddp, every rank runs the whole optimizer
  kLayerwise,          ///< ddp, one owner per parameter, all-gather
  kSharded,            ///< ZeRO row shards, owner-compute Muon
  kShardedReplicated,  ///< ZeRO row shards, every rank gathers and orthogonalizes every matrix
  kTensorParallel,     ///< tensor parallel over the whole world (duplicated NS)
  kTensorParallelSharded,  ///< 2-D: tensor parallel × sharded data parallel
};
MUON_ENUM_NAMES(LayoutKind, parse_layout);
std::vector<LayoutKind> all_layouts();

/// What is being planned.
struct Options {
  int64_t world = 1;
  /// Ranks per node of this job (0: the machine's ranks_per_node); a CPU
  /// node's ranks beyond its cores share them.
  int64_t ranks_per_node = 0;
  /// Tensor-parallel size of the TP layouts (0: the whole world for
  /// tensor_parallel, 2 for the 2-D layout).
  int64_t tp = 0;
  int64_t ns_steps = 5;
  /// Newton–Schulz in bf16 (the accelerators' default) or fp32.
  bool ns_bf16 = false;
  /// Fraction of each Muon matrix's rows orthogonalized (1: Muon; Dion2's
  /// selected fraction, as an approximation of its Newton–Schulz work).
  double row_fraction = 1.0;
  /// Bucket sizes (the layouts' defaults: 32 MiB all-reduce, 4 MiB
  /// reduce-scatter / all-gather of row shards, 8 MiB layer-wise gather).
  int64_t all_reduce_bucket_bytes = int64_t{32} << 20;
  int64_t row_bucket_bytes = int64_t{4} << 20;
  int64_t layerwise_bucket_bytes = int64_t{8} << 20;
  /// AdamW instead of Muon for every tensor (the baseline).
  bool adamw_only = false;
  /// Count the activations' tensor-parallel all-reduces (a training step)
  /// or only the gradient reduction and the optimizer (an optimizer step).
  bool training_step = true;
};

/// One collective of a step on the most loaded rank.
struct Collective {
  std::string what;     ///< "gradients all-reduce", "owner exchange", ...
  std::string kind;     ///< "all_reduce", "all_gather" or "all_to_all" 
  int64_t group = 1;    ///< ranks in its group
  int64_t calls = 0;    ///< collectives issued
  int64_t bytes = 0;    ///< bytes this rank sends (Group::bytes_sent's model)
  double seconds = 0;   ///< alpha-beta time
  bool overlapped = false;  ///< pipelined with compute
  int64_t hops = 0;     ///< latency terms (ring steps) of all its calls
};

/// A prediction for one layout at one world size.
struct Prediction {
  LayoutKind layout = LayoutKind::kReplicated;
  int64_t world = 1;
  int64_t tp = 1;
  int64_t dp = 1;
  bool adamw = false;
  /// Seconds on the most loaded rank.
  double newton_schulz_s = 0;
  double elementwise_s = 0;
  double communication_s = 0;
  double step_s = 0;
  /// Newton–Schulz FLOPs of the most loaded rank.
  double newton_schulz_flops = 0;
  std::vector<Collective> collectives;
  /// Bytes the most loaded rank sends per step (what muon-train-gpt's
  /// "sent/step" measures: the maximum over ranks).
  int64_t bytes_sent = 0;
  /// Every rank's bytes per step.
  std::vector<int64_t> bytes_per_rank;
  int64_t state_bytes = 0;      ///< optimizer state, most loaded rank
  int64_t parameter_bytes = 0;  ///< parameters (and row shards), most loaded rank
  int64_t gradient_bytes = 0;
  bool fits = true;             ///< parameters, gradients and state fit the memory
  /// AdamW's step in the same layout, and Muon's against it.
  double adamw_step_s = 0;
  double vs_adamw = 0;
  int64_t adamw_bytes_sent = 0;
  int64_t adamw_state_bytes = 0;
  /// With the model's train_flops: forward and backward's seconds, the
  /// optimizer step's share of a training step, Muon's throughput cost
  /// against AdamW ((Muon step − AdamW step) / AdamW's training step) and
  /// the training step's ratio (Muon's / AdamW's).
  double train_s = 0;
  double share_of_training = 0;
  double throughput_cost = 0;
  double iteration_ratio = 0;
  std::string why_not;  ///< non-empty: this layout cannot run this model here
};

/// Predicts one layout.
Prediction predict(const Model& model, const Machine& machine, LayoutKind layout, const Options& options);

/// Every layout that can run at `options.world`, fastest first among those
/// that fit; `recommend(...)` is the first of them.
std::vector<Prediction> plan(const Model& model, const Machine& machine, const Options& options);
Prediction recommend(const Model& model, const Machine& machine, const Options& options);

/// Newton–Schulz FLOPs of one m×n matrix (the library's count:
/// muon::newton_schulz_flops with the default options and `steps`).
double newton_schulz_flops(int64_t rows, int64_t cols, int64_t steps);

/// The predictions as a table (one line per layout) and as JSON.
std::string format_table(const std::vector<Prediction>& predictions);
std::string to_json(const std::vector<Prediction>& predictions);

}  // namespace muon::plan
