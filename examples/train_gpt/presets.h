#pragma once

/// muon-train-gpt's --preset: a named model, corpus and budget.
///
///   small  the flags' own defaults: a 0.8M-parameter GPT (4 blocks, width
///          128, context 64) on the generated corpus, 400 steps
///   kjv    a 10.8M-parameter GPT (6 blocks, width 384, 6 heads, context
///          256) on the King James Bible as Debian's bible-kjv ships it
///          (4.1 MB of English prose, one verse a line), with the learning
///          rates of its own sweep (docs/train_gpt.md, "At width 384")
///
/// A flag given on the command line wins over the preset's value.
#include <functional>
#include <string>
#include <vector>

#include "trainer.h"

namespace train_gpt {

/// The presets' names.
std::vector<std::string> preset_names();

/// Applies preset `name` to `train` and `data_file` (--data: "" is the
/// generated corpus), leaving each field whose flag `given(flag)` says was
/// on the command line. An unknown name raises
/// c10::ValueError listing the presets; the kjv preset's corpus missing
/// raises c10::ValueError naming the file and the package.
void apply_preset(const std::string& name, const std::function<bool(const std::string&)>& given,
                  TrainOptions& train, std::string& data_file);

/// The corpus of --preset kjv: $MUON_KJV_CORPUS, else kjv.txt beside the
/// program (the build writes it there from bible-kjv, through
/// examples/train_gpt/kjv_corpus.sh) or installed in ../share/muon/, else
/// the build tree's.
std::string kjv_corpus_path();

}  // namespace train_gpt
