// The run in a checkpoint's manifest, as JSON.
#include "checkpoint_run.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

namespace train_gpt {
namespace {

using json = nlohmann::json;

constexpr const char* kRunFormat = "muon-train-gpt";
// Version 2: the fused QKV weight's rows per head; experts.
constexpr int64_t kRunVersion = 2;

// JSON has no NaN: the training loss of step 0 is stored as null.
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
double number_of(const json& j) {
  return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>();
}

}  // namespace

std::string run_to_json(const CheckpointRun& run) {
  const auto& m = run.model;
  json log = json::array();
  for (const auto& p : run.points) {
    log.push_back({{"step", p.step},
                   {"tokens", p.tokens},
                   {"train_loss", number(p.train_loss)},
                   {"valid_loss", number(p.valid_loss)},
                   {"seconds", p.seconds},
                   {"optimizer_seconds", p.optimizer_seconds}});
  }
  const json j{
      {"format", kRunFormat},
      {"version", kRunVersion},
      {"model",
       {{"vocab_size", m.vocab_size},
        {"context", m.context},
        {"layers", m.layers},
        {"heads", m.heads},
        {"width", m.width},
        {"mlp_ratio", m.mlp_ratio},
        {"experts", m.experts},
        {"norm", m.norm}}},
      {"layout", run.layout},
      {"world_size", run.world},
      {"device", run.device},
      {"log", log},
      {"tokens", run.tokens},
      {"seconds", run.seconds},
      {"optimizer_seconds", run.optimizer_seconds},
      {"since_last_point", {{"train_loss_sum", run.train_loss_sum}, {"steps", run.train_steps}}}};
  return j.dump();
}

CheckpointRun run_from_json(const std::string& text, const std::string& path) {
  CheckpointRun run;
  try {
    const auto j = json::parse(text);
    TORCH_CHECK_VALUE(j.is_object() && j.value("format", "") == kRunFormat,
                      "[train_gpt] checkpoint ", path,
                      " was not written by muon-train-gpt (its manifest does not describe a run); "
                      "start a new run");
    TORCH_CHECK_VALUE(j.at("version").get<int64_t>() == kRunVersion, "[train_gpt] checkpoint ",
                      path, " describes its run in version ", j.at("version").dump(),
                      "; this program reads ", kRunVersion);
    const auto& m = j.at("model");
    run.model.vocab_size = m.at("vocab_size").get<int64_t>();
    run.model.context = m.at("context").get<int64_t>();
    run.model.layers = m.at("layers").get<int64_t>();
    run.model.heads = m.at("heads").get<int64_t>();
    run.model.width = m.at("width").get<int64_t>();
    run.model.mlp_ratio = m.at("mlp_ratio").get<int64_t>();
    run.model.norm = m.at("norm").get<std::string>();
    run.model.experts = m.at("experts").get<int64_t>();
    run.layout = j.at("layout").get<std::string>();
    run.world = j.at("world_size").get<int64_t>();
    run.device = j.value("device", std::string());
    for (const auto& p : j.at("log")) {
      run.points.push_back({p.at("step").get<int64_t>(), p.at("tokens").get<int64_t>(),
                            number_of(p.at("train_loss")), number_of(p.at("valid_loss")),
                            p.at("seconds").get<double>(),
                            p.at("optimizer_seconds").get<double>()});
    }
    run.tokens = j.at("tokens").get<int64_t>();
    run.seconds = j.at("seconds").get<double>();
    run.optimizer_seconds = j.at("optimizer_seconds").get<double>();
    run.train_loss_sum = j.at("since_last_point").at("train_loss_sum").get<double>();
    run.train_steps = j.at("since_last_point").at("steps").get<int64_t>();
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, "[train_gpt] checkpoint ", path,
                      ": its manifest's description of the run is damaged (", e.what(),
                      "); start a new run");
  }
  TORCH_CHECK_VALUE(!run.points.empty(), "[train_gpt] checkpoint ", path,
                    " has no log point; start a new run");
  return run;
}

// The checkpoint's model against this run's, naming the first difference
// in the flags that set it.
void check_model(const GptConfig& saved, const std::string& path, const GptConfig& model) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> shape[] = {
      {"--layers", {saved.layers, model.layers}},
      {"--width", {saved.width, model.width}},
      {"--heads", {saved.heads, model.heads}},
      {"--context", {saved.context, model.context}},
      {"mlp_ratio", {saved.mlp_ratio, model.mlp_ratio}},
      {"--experts", {saved.experts, model.experts}}};
  for (const auto& [flag, values] : shape) {
    TORCH_CHECK_VALUE(values.first == values.second, "[train_gpt] checkpoint ", path,
                      " was written with ", flag, " ", values.first, ", this run has ", flag, " ",
                      values.second);
  }
  TORCH_CHECK_VALUE(saved.norm == model.norm, "[train_gpt] checkpoint ", path,
                    " was written with --norm ", saved.norm, ", this run has --norm ", model.norm);
  TORCH_CHECK_VALUE(saved.vocab_size == model.vocab_size, "[train_gpt] checkpoint ", path,
                    " was written with a vocabulary of ", saved.vocab_size,
                    " tokens, this run has ", model.vocab_size,
                    " (the data: --data, --chars, --byte-level)");
}

}  // namespace train_gpt
