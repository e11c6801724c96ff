// muon::plan's models, machines, names and output (include/muon/plan.h).
// Where each preset's figures come from: docs/scale.md.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "muon/plan.h"
#include "plan_checks.h"

namespace muon::plan {
namespace {

using json = nlohmann::json;
constexpr const char* kWho = "[muon::plan] ";

std::string clip(const std::string& s) { return detail::shown(s); }

Tensor tensor(std::string name, std::vector<int64_t> shape, Route route, Split split = Split::kNone) {
  Tensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.route = route;
  t.split = split;
  return t;
}

void add_layers(Model& m, int64_t layers, const std::vector<Tensor>& per_layer) {
  for (int64_t l = 0; l < layers; ++l) {
    for (auto t : per_layer) {
      t.name = "layers." + std::to_string(l) + "." + t.name;
      m.tensors.push_back(t);
    }
  }
}

// Each layer's experts of this rank: gate and up (experts × e × h), down
// (experts × h × e), stacked, all Muon's.
void add_experts(Model& m, int64_t layers, int64_t experts, int64_t e, int64_t h) {
  for (int64_t l = 0; l < layers; ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".experts.";
    for (const auto& [w, shape] : {std::pair<const char*, std::vector<int64_t>>{"gate", {experts, e, h}},
                                   {"up", {experts, e, h}},
                                   {"down", {experts, h, e}}}) {
      auto t = tensor(prefix + w, shape, Route::kMuon);
      t.expert = true;
      m.tensors.push_back(t);
    }
  }
}

// Transformer presets of published setups: one pipeline stage's tensors of
// one rank (experts: this rank's own), bf16 training accounted in fp32
// master weights and state (as the layouts hold them).
Model kimi_k2() {
  // moonshotai/Kimi-K2 config: hidden 7168, 61 layers (1 dense), MLA (q rank
  // 1536, kv rank 512, 64 heads of 128 + 64 rope), 384 experts of 2048, one
  // shared expert, vocab 163840. Setup (NVIDIA): 256 GPUs, PP4 · DP64 · EP64:
  // a stage holds 15 MoE layers (+ the dense one and the embedding on the
  // first), a rank 384 / 64 = 6 experts of each.
  Model m;
  m.name = "kimi-k2";
  m.description = "Kimi-K2 shape, one PP stage (15 MoE layers) of PP4·DP64·EP64 on 256 GPUs, 6 experts per rank";
  const int64_t h = 7168, e = 2048, experts = 6;
  add_layers(m, 15,
             {tensor("attn.q_a", {1536, h}, Route::kMuon), tensor("attn.q_b", {64 * 192, 1536}, Route::kMuon),
              tensor("attn.kv_a", {576, h}, Route::kMuon), tensor("attn.kv_b", {64 * 256, 512}, Route::kMuon),
              tensor("attn.o", {h, 64 * 128}, Route::kMuon), tensor("router", {384, h}, Route::kMuon),
              tensor("shared.gate", {e, h}, Route::kMuon), tensor("shared.up", {e, h}, Route::kMuon),
              tensor("shared.down", {h, e}, Route::kMuon), tensor("norm1", {h}, Route::kAdamW),
              tensor("norm2", {h}, Route::kAdamW)});
  add_experts(m, 15, experts, e, h);
  m.expert_data_parallel = 1;  // DP64 · TP1 / EP64
  m.pipeline_stages = 4;
  // Active parameters per token 32B, a stage a quarter; the benchmark's
  // global batch 4096 × 4096 tokens over DP64.
  m.train_flops = 6.0 * 32e9 / 4 * (4096.0 * 4096 / 64);
  m.train_flops_per_s = 1051e12;  // NVIDIA's AdamW figure for this setup
  return m;
}

Model qwen3_30b_a3b() {
  // Qwen/Qwen3-30B-A3B config: hidden 2048, 48 layers, 32 q / 4 kv heads of
  // 128, 128 experts of 768, vocab 151936. Setup (NVIDIA): 8 GPUs, DP8 ·
  // EP8: a rank holds 16 experts of each layer.
  Model m;
  m.name = "qwen3-30b-a3b";
  m.description = "Qwen3-30B-A3B shape, DP8·EP8 on 8 GPUs, 16 experts per rank";
  const int64_t h = 2048, e = 768, experts = 16;
  m.tensors.push_back(tensor("embed", {151936, h}, Route::kAdamW));
  add_layers(m, 48,
             {tensor("attn.q", {4096, h}, Route::kMuon), tensor("attn.k", {512, h}, Route::kMuon),
              tensor("attn.v", {512, h}, Route::kMuon), tensor("attn.o", {h, 4096}, Route::kMuon),
              tensor("router", {128, h}, Route::kMuon), tensor("norm1", {h}, Route::kAdamW),
              tensor("norm2", {h}, Route::kAdamW)});
  add_experts(m, 48, experts, e, h);
  m.tensors.push_back(tensor("lm_head", {151936, h}, Route::kAdamW));
  m.expert_data_parallel = 1;  // DP8 / EP8
  // 3.3B active parameters; global batch 512 × 4096 tokens over DP8.
  m.train_flops = 6.0 * 3.3e9 * (512.0 * 4096 / 8);
  m.train_flops_per_s = 713e12;  // NVIDIA's AdamW figure for this setup
  return m;
}

// DeepSeek-V3-like dense proxies of the Megatron-FSDP seed (1B-8B): MLA
// attention, SwiGLU MLP, vocab 129280; width and depth by size.
Model dsv3_proxy(int64_t billions) {
  int64_t h = 2048, layers = 16, heads = 16, ffn = 5632;
  if (billions >= 8) {
    h = 4096, layers = 32, heads = 32, ffn = 11008;
  } else if (billions >= 3) {
    h = 3072, layers = 24, heads = 24, ffn = 8192;
  }
  Model m;
  m.name = "dsv3-proxy-" + std::to_string(billions) + "b";
  m.description = "DeepSeek-V3-like dense proxy, " + std::to_string(billions) + "B (width " + std::to_string(h) +
                  ", " + std::to_string(layers) + " layers)";
  m.tensors.push_back(tensor("embed", {129280, h}, Route::kAdamW));
  add_layers(m, layers,
             {tensor("attn.q_a", {1536, h}, Route::kMuon), tensor("attn.q_b", {heads * 192, 1536}, Route::kMuon),
              tensor("attn.kv_a", {576, h}, Route::kMuon), tensor("attn.kv_b", {heads * 256, 512}, Route::kMuon),
              tensor("attn.o", {h, heads * 128}, Route::kMuon), tensor("mlp.gate", {ffn, h}, Route::kMuon),
              tensor("mlp.up", {ffn, h}, Route::kMuon), tensor("mlp.down", {h, ffn}, Route::kMuon),
              tensor("norm1", {h}, Route::kAdamW), tensor("norm2", {h}, Route::kAdamW)});
  m.tensors.push_back(tensor("lm_head", {129280, h}, Route::kAdamW));
  // 8 GPUs, 8 × 4096 tokens per GPU per step, at 40% of an H100's bf16 peak.
  m.train_flops = 6.0 * static_cast<double>(m.parameters()) * (8.0 * 4096);
  m.train_flops_per_s = 0.4 * 989e12;
  return m;
}

// dion#96's NorDion2 sweep: width 5120, 8 layers, unfused q/k/v, MLP 4x.
Model dion_5120() {
  Model m;
  m.name = "dion-5120x8";
  m.description = "dion#96's model: width 5120, 8 layers, unfused QKV, MLP 20480";
  const int64_t h = 5120;
  m.tensors.push_back(tensor("embed", {50304, h}, Route::kAdamW));
  add_layers(m, 8,
             {tensor("attn.q", {h, h}, Route::kMuon), tensor("attn.k", {h, h}, Route::kMuon),
              tensor("attn.v", {h, h}, Route::kMuon), tensor("attn.o", {h, h}, Route::kMuon),
              tensor("mlp.fc1", {4 * h, h}, Route::kMuon), tensor("mlp.fc2", {h, 4 * h}, Route::kMuon),
              tensor("norm1", {h}, Route::kAdamW), tensor("norm2", {h}, Route::kAdamW)});
  m.tensors.push_back(tensor("lm_head", {50304, h}, Route::kAdamW));
  return m;
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

}  // namespace

Model Model::gpt(int64_t layers, int64_t width, int64_t heads, int64_t vocab, int64_t context, int64_t global_batch,
                 int64_t mlp_ratio, int64_t experts) {
  const auto in = [](const char* flag, int64_t v, int64_t lo, int64_t hi) {
    TORCH_CHECK_VALUE(v >= lo && v <= hi, kWho, "gpt: ", flag, " must be in [", lo, ", ", hi, "], got ", v);
  };
  in("layers", layers, 1, (detail::kMaxTensors - 4) / 8);
  in("width", width, 1, int64_t{1} << 20);
  in("heads", heads, 1, width);
  TORCH_CHECK_VALUE(width % heads == 0, kWho, "gpt: heads must divide width, got heads ", heads, ", width ", width);
  in("vocab", vocab, 1, int64_t{1} << 40);
  in("context", context, 1, int64_t{1} << 40);
  in("batch", global_batch, 1, int64_t{1} << 40);
  in("mlp_ratio", mlp_ratio, 1, 1024);
  in("experts", experts, 0, int64_t{1} << 20);
  // Each size fits; the products are checked whole (in double, exact enough
  // to compare against 2^50 and 2^53).
  const double w = static_cast<double>(width), h = static_cast<double>(mlp_ratio) * w;
  const double block = 3 * w * w + w * w + 2 * w +
                       (experts > 0 ? static_cast<double>(experts) * (w + 2 * h * w) : 2 * h * w + h + w);
  const double elements =
      static_cast<double>(2 * vocab + context) * w + w + static_cast<double>(layers) * block;
  TORCH_CHECK_VALUE(elements <= static_cast<double>(detail::kMaxElements), kWho, "gpt: layers ", layers, ", width ",
                    width, ", vocab ", vocab, ", context ", context, ", mlp_ratio ", mlp_ratio, ", experts ", experts,
                    ": the model holds about ", elements, " elements, more than ", detail::kMaxElements);
  const double tokens = static_cast<double>(global_batch) * static_cast<double>(context);
  TORCH_CHECK_VALUE(tokens * w <= static_cast<double>(detail::kMaxCount), kWho, "gpt: batch ", global_batch,
                    " × context ", context, " × width ", width, " activation elements are more than ",
                    detail::kMaxCount);
  Model m;
  m.name = "gpt";
  m.description = "muon-train-gpt's model: " + std::to_string(layers) + " layers, width " + std::to_string(width) +
                  (experts > 0 ? ", " + std::to_string(experts) + " experts" : "");
  const int64_t hidden = mlp_ratio * width;
  m.tensors.push_back(tensor("wte.weight", {vocab, width}, Route::kAdamW));
  m.tensors.push_back(tensor("wpe.weight", {context, width}, Route::kAdamW));
  for (int64_t l = 0; l < layers; ++l) {
    const auto b = "blocks." + std::to_string(l) + ".";
    m.tensors.push_back(tensor(b + "norm1.norm.weight", {width}, Route::kAdamW));
    m.tensors.push_back(tensor(b + "attn.qkv.weight", {3 * width, width}, Route::kMuon, Split::kRows));
    m.tensors.push_back(tensor(b + "attn.proj.weight", {width, width}, Route::kMuon, Split::kCols));
    m.tensors.push_back(tensor(b + "norm2.norm.weight", {width}, Route::kAdamW));
    if (experts > 0) {
      m.tensors.push_back(tensor(b + "moe.router.weight", {experts, width}, Route::kMuon));
      m.tensors.push_back(tensor(b + "moe.experts_fc1", {experts, hidden, width}, Route::kMuon));
      m.tensors.push_back(tensor(b + "moe.experts_fc2", {experts, width, hidden}, Route::kMuon));
    } else {
      m.tensors.push_back(tensor(b + "fc1.weight", {hidden, width}, Route::kMuon, Split::kRows));
      m.tensors.push_back(tensor(b + "fc1.bias", {hidden}, Route::kAdamW, Split::kRows));
      m.tensors.push_back(tensor(b + "fc2.weight", {width, hidden}, Route::kMuon, Split::kCols));
      m.tensors.push_back(tensor(b + "fc2.bias", {width}, Route::kAdamW));
    }
  }
  m.tensors.push_back(tensor("norm_f.norm.weight", {width}, Route::kAdamW));
  m.tensors.push_back(tensor("lm_head.weight", {vocab, width}, Route::kAdamW));
  // Per block: the attention's and the MLP's column-parallel inputs
  // (backward) and row-parallel outputs (forward).
  m.activation_all_reduces = experts > 0 ? 2 * layers : 4 * layers;
  m.activation_elements = global_batch * context * width;
  m.train_flops = 6.0 * static_cast<double>(m.parameters()) * tokens;
  return m;
}

Model Model::preset(const std::string& name) {
  if (name == "kimi-k2") return kimi_k2();
  if (name == "qwen3-30b-a3b") return qwen3_30b_a3b();
  if (name == "dsv3-proxy-1b") return dsv3_proxy(1);
  if (name == "dsv3-proxy-3b") return dsv3_proxy(3);
  if (name == "dsv3-proxy-8b") return dsv3_proxy(8);
  if (name == "dion-5120x8") return dion_5120();
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  TORCH_CHECK_VALUE(false, kWho, "no model preset '", clip(name), "' (there are: ", names, ")");
}

std::vector<std::string> Model::preset_names() {
  return {"kimi-k2", "qwen3-30b-a3b", "dsv3-proxy-1b", "dsv3-proxy-3b", "dsv3-proxy-8b", "dion-5120x8"};
}

namespace {

// An accelerator node from its datasheet: dense bf16 and fp32 (TF32) peaks
// scaled by the sustained fraction per shape class, element-wise work as
// HBM traffic (40 bytes per element for Muon, 56 for AdamW), links at what
// NCCL's ring reaches.
struct Datasheet {
  const char* name;
  const char* source;
  double bf16_peak, fp32_peak;
  double efficiency[kShapeClasses];
  double hbm_bytes_per_s, memory_bytes;
  int64_t ranks_per_node;
  Link intra, inter;
};

Machine accelerator(const Datasheet& d) {
  Machine m;
  m.name = d.name;
  m.source = d.source;
  for (int c = 0; c < kShapeClasses; ++c) {
    m.gemm_bf16[c] = d.bf16_peak * d.efficiency[c];
    m.gemm_fp32[c] = d.fp32_peak * d.efficiency[c];
  }
  m.muon_elementwise_s = 40.0 / d.hbm_bytes_per_s;
  m.adamw_elementwise_s = 56.0 / d.hbm_bytes_per_s;
  m.memory_bytes = d.memory_bytes;
  m.ranks_per_node = d.ranks_per_node;
  m.intra = d.intra;
  m.inter = d.inter;
  m.overlap = 0.8;
  return m;
}

}  // namespace

Machine Machine::preset(const std::string& name) {
  // NVIDIA H100 SXM5: 989 TFLOP/s dense bf16, 494 TF32, 3.35 TB/s HBM3, 80
  // GB; DGX H100: 8 GPUs on NVLink 4 (450 GB/s per direction), 8 × 400 Gb/s
  // InfiniBand (50 GB/s per GPU). Sustained: 10-70% of peak by shape class;
  // NCCL's ring at ~80% of a link.
  if (name == "h100") {
    return accelerator({"h100", "NVIDIA H100 SXM5 / DGX H100 datasheets (docs/scale.md)", 989e12, 494e12,
                        {0.10, 0.35, 0.60, 0.70}, 3.35e12, 80e9, 8, {5e-6, 360e9}, {10e-6, 40e9}});
  }
  // NVIDIA GB300 NVL72: ~2.5 PFLOP/s dense bf16 per GPU, 288 GB HBM3e at 8
  // TB/s, NVLink 5 at 900 GB/s per direction across the rack's 72 GPUs,
  // ConnectX-8 at 800 Gb/s (100 GB/s) per GPU between racks.
  if (name == "gb300") {
    return accelerator({"gb300", "NVIDIA GB300 NVL72 datasheet (docs/scale.md)", 2.5e15, 1.25e15,
                        {0.08, 0.30, 0.55, 0.70}, 8e12, 288e9, 72, {4e-6, 720e9}, {10e-6, 80e9}});
  }
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  TORCH_CHECK_VALUE(false, kWho, "no machine preset '", clip(name),
                    "' (there are: ", names, "; this machine: muon-plan calibrate writes one)");
}

std::vector<std::string> Machine::preset_names() { return {"h100", "gb300"}; }

std::string Machine::to_json() const {
  json j;
  j["name"] = name;
  j["source"] = source;
  j["gemm_fp32"] = std::vector<double>(gemm_fp32, gemm_fp32 + kShapeClasses);
  j["gemm_bf16"] = std::vector<double>(gemm_bf16, gemm_bf16 + kShapeClasses);
  j["rank_gemm_fp32"] = std::vector<double>(rank_gemm_fp32, rank_gemm_fp32 + kShapeClasses);
  j["rank_gemm_bf16"] = std::vector<double>(rank_gemm_bf16, rank_gemm_bf16 + kShapeClasses);
  j["muon_elementwise_s"] = muon_elementwise_s;
  j["adamw_elementwise_s"] = adamw_elementwise_s;
  j["muon_tensor_s"] = muon_tensor_s;
  j["adamw_tensor_s"] = adamw_tensor_s;
  j["ns_call_s"] = ns_call_s;
  j["memory_bytes"] = memory_bytes;
  j["ranks_per_node"] = ranks_per_node;
  j["cores_per_node"] = cores_per_node;
  j["overlap"] = overlap;
  auto link = [](const Link& l) {
    return json{{"latency_s", l.latency_s},
                {"bytes_per_s", l.bytes_per_s},
                {"all_gather_bytes_per_s", l.all_gather_bytes_per_s},
                {"all_to_all_bytes_per_s", l.all_to_all_bytes_per_s}};
  };
  j["intra"] = link(intra);
  j["inter"] = link(inter);
  return j.dump(2);
}

std::string to_string(LayoutKind kind) {
  switch (kind) {
    case LayoutKind::kReplicated: return "replicated";
    case LayoutKind::kLayerwise: return "layerwise";
    case LayoutKind::kSharded: return "sharded";
    case LayoutKind::kShardedReplicated: return "sharded-replicated";
    case LayoutKind::kTensorParallel: return "tp";
    case LayoutKind::kTensorParallelSharded: return "tp,sharded";
  }
  return "?";
}

std::vector<LayoutKind> all_layouts() {
  return {LayoutKind::kReplicated, LayoutKind::kLayerwise, LayoutKind::kSharded, LayoutKind::kShardedReplicated,
          LayoutKind::kTensorParallel, LayoutKind::kTensorParallelSharded};
}

LayoutKind parse_layout(const std::string& name) {
  for (const auto k : all_layouts()) {
    if (to_string(k) == name) return k;
  }
  TORCH_CHECK_VALUE(false, kWho, "no layout '", clip(name),
                    "' (there are: replicated, layerwise, sharded, sharded-replicated, tp, tp,sharded)");
}

std::string format_table(const std::vector<Prediction>& predictions) {
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof(line), "%-19s %5s %4s %4s %10s %10s %10s %10s %12s %11s %11s %9s %s\n", "layout", "world",
                "tp", "dp", "step ms", "NS ms", "elem ms", "comm ms", "sent/step", "opt state", "params",
                "vs AdamW", "fits");
  out << line;
  for (const auto& p : predictions) {
    std::snprintf(line, sizeof(line), "%-19s %5lld %4lld %4lld %10.3f %10.3f %10.3f %10.3f %12s %11s %11s %8.2fx %s\n",
                  to_string(p.layout).c_str(), static_cast<long long>(p.world), static_cast<long long>(p.tp),
                  static_cast<long long>(p.dp), 1e3 * p.step_s, 1e3 * p.newton_schulz_s, 1e3 * p.elementwise_s,
                  1e3 * p.communication_s, bytes_text(static_cast<double>(p.bytes_sent)).c_str(),
                  bytes_text(static_cast<double>(p.state_bytes)).c_str(),
                  bytes_text(static_cast<double>(p.parameter_bytes)).c_str(), p.vs_adamw, p.fits ? "yes" : "no");
    out << line;
  }
  return out.str();
}

std::string to_json(const std::vector<Prediction>& predictions) {
  json all = json::array();
  for (const auto& p : predictions) {
    json c = json::array();
    for (const auto& x : p.collectives) {
      c.push_back({{"what", x.what}, {"kind", x.kind}, {"group", x.group}, {"calls", x.calls}, {"bytes", x.bytes},
                   {"seconds", x.seconds}, {"overlapped", x.overlapped}});
    }
    all.push_back({{"layout", to_string(p.layout)},
                   {"world", p.world},
                   {"tp", p.tp},
                   {"dp", p.dp},
                   {"adamw", p.adamw},
                   {"step_s", p.step_s},
                   {"newton_schulz_s", p.newton_schulz_s},
                   {"newton_schulz_flops", p.newton_schulz_flops},
                   {"elementwise_s", p.elementwise_s},
                   {"communication_s", p.communication_s},
                   {"bytes_sent", p.bytes_sent},
                   {"bytes_per_rank", p.bytes_per_rank},
                   {"state_bytes", p.state_bytes},
                   {"parameter_bytes", p.parameter_bytes},
                   {"gradient_bytes", p.gradient_bytes},
                   {"fits", p.fits},
                   {"adamw_step_s", p.adamw_step_s},
                   {"vs_adamw", p.vs_adamw},
                   {"adamw_bytes_sent", p.adamw_bytes_sent},
                   {"adamw_state_bytes", p.adamw_state_bytes},
                   {"train_s", p.train_s},
                   {"share_of_training", p.share_of_training},
                   {"throughput_cost", p.throughput_cost},
                   {"iteration_ratio", p.iteration_ratio},
                   {"collectives", c}});
  }
  return all.dump(2);
}

}  // namespace muon::plan
