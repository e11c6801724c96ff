#pragma once

/// Training data for the small GPT: a deterministic generated corpus (no
/// network, no file) or any text file, a character-level vocabulary, a
/// train/validation split, and batches that are the same for every world
/// size at a fixed global batch.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace train_gpt {

/// Generates `chars` characters of the synthetic corpus from `seed`.
///
/// The corpus is a sequence of documents, each with structure at several
/// ranges, so that a model (and the optimizer training it) has something to
/// learn at each:
///  - spelling (a few characters): words are built from a fixed syllable
///    inventory into a lexicon of a few hundred pseudo-words;
///  - syntax (a sentence): a small grammar (determiner, adjectives, noun,
///    verb with number agreement, object, optional relative clause,
///    punctuation and capitalization);
///  - topic (a document): each document draws one of several topics, which
///    reweights the nouns and verbs it uses;
///  - copying (a document): each document introduces a named entity in its
///    first sentence and mentions it again later ("Name ..."), and lists
///    count upward ("1. ... 2. ... 3. ...");
/// The generator uses its own splitmix64 stream, so the text is the same on
/// every platform and standard library.
std::string generate_corpus(int64_t chars, uint64_t seed = 1234);

/// A character-level tokenizer over the distinct bytes of a text.
class CharVocab {
 public:
  /// The vocabulary of the bytes present in `text` (sorted), or all 256 bytes
  /// when `byte_level`.
  static CharVocab from_text(const std::string& text, bool byte_level = false);
  /// A vocabulary from its symbols (as `symbols()` returns them).
  explicit CharVocab(std::string symbols);

  /// Tokens of `text` (int64, 1-D). A byte outside the vocabulary raises c10::ValueError.
  at::Tensor encode(const std::string& text) const;
  /// Text of `tokens`.
  std::string decode(const at::Tensor& tokens) const;
  /// Number of tokens.
  int64_t size() const { return static_cast<int64_t>(symbols_.size()); }
  /// The symbols in token order.
  const std::string& symbols() const { return symbols_; }

 private:
  std::string symbols_;
  std::vector<int16_t> index_;  // byte → token, -1 when absent
};

/// Token streams for training and validation.
struct Dataset {
  CharVocab vocab{std::string()};
  at::Tensor train;  // int64, 1-D
  at::Tensor valid;  // int64, 1-D
};

/// Splits `text` at `1 - valid_fraction` (the tail is validation).
Dataset make_dataset(const std::string& text, double valid_fraction = 0.1, bool byte_level = false);

/// The rows of global training batch `step` that rank `rank` of `world` takes:
/// the global batch (global_batch windows of context + 1 tokens at positions
/// drawn from a generator seeded by (seed, step)) is the same for every world
/// size; rank r takes rows [r·B/W, (r+1)·B/W). `global_batch` must be a
/// multiple of `world`.
at::Tensor train_batch(const at::Tensor& tokens, int64_t step, int64_t global_batch,
                       int64_t context, int64_t rank, int64_t world, uint64_t seed);

/// Fixed validation windows: `count` windows of context + 1 tokens, evenly
/// spaced over `tokens`.
at::Tensor valid_windows(const at::Tensor& tokens, int64_t count, int64_t context);

}  // namespace train_gpt
