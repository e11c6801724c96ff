// muon-train-gpt's --preset (presets.h).
#include "presets.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <filesystem>

namespace train_gpt {

namespace fs = std::filesystem;

std::vector<std::string> preset_names() { return {"small", "kjv"}; }

std::string kjv_corpus_path() {
  if (const char* env = std::getenv("MUON_KJV_CORPUS")) return env;
  const auto self = fs::canonical("/proc/self/exe").parent_path();
  const auto beside = self / "kjv.txt";
  if (fs::exists(beside)) return beside.string();
  const auto installed = self / "../share/muon/kjv.txt";
  if (fs::exists(installed)) return installed.string();
#ifdef MUON_KJV_CORPUS_BUILD_PATH
  if (fs::exists(MUON_KJV_CORPUS_BUILD_PATH)) return MUON_KJV_CORPUS_BUILD_PATH;
#endif
  return beside.string();
}

void apply_preset(const std::string& name, const std::function<bool(const std::string&)>& given,
                  TrainOptions& train, std::string& data_file) {
  if (name == "small") return;  // the flags' defaults
  TORCH_CHECK_VALUE(name == "kjv", "[muon-train-gpt] --preset: '", name.substr(0, 64),
                    "' is not a preset (small, kjv)");
  auto set = [&](const char* flag, auto& field, auto value) {
    if (!given(flag)) field = value;
  };
  // The largest GPT a 2-core machine trains in about 10 minutes a run on 2
  // ranks (docs/train_gpt.md, "At width 384").
  set("--layers", train.model.layers, 6);
  set("--width", train.model.width, 384);
  set("--heads", train.model.heads, 6);
  set("--context", train.model.context, 256);
  set("--batch", train.global_batch, 16);
  set("--steps", train.steps, 200);
  set("--eval-every", train.eval_every, 20);
  set("--eval-windows", train.eval_windows, 64);
  if (given("--data")) return;
  data_file = kjv_corpus_path();
  TORCH_CHECK_VALUE(fs::is_regular_file(data_file), "[muon-train-gpt] --preset kjv: no corpus at '",
                    data_file.substr(0, 200),
                    "'; install Debian's bible-kjv and rebuild (the build writes kjv.txt beside "
                    "the program), or set MUON_KJV_CORPUS");
}

}  // namespace train_gpt
