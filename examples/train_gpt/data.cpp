// The generated corpus, the character vocabulary and batching.
#include "data.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <array>
#include <cctype>

namespace train_gpt {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): the same stream on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n).
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  // Uniform in [0, 1).
  double real() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  bool chance(double p) { return real() < p; }
  // Zipf-like: index i with weight 1/(i+1), over n items.
  int64_t zipf(int64_t n) {
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += 1.0 / static_cast<double>(i + 1);
    double u = real() * total;
    for (int64_t i = 0; i < n; ++i) {
      u -= 1.0 / static_cast<double>(i + 1);
      if (u <= 0) return i;
    }
    return n - 1;
  }

 private:
  uint64_t state_;
};

constexpr const char* kConsonants = "bdfgklmnprstvz";
constexpr const char* kVowels = "aeiou";

std::string make_word(Rng& rng, int64_t min_syllables, int64_t max_syllables) {
  std::string word;
  const int64_t n = min_syllables + rng.below(max_syllables - min_syllables + 1);
  for (int64_t i = 0; i < n; ++i) {
    word += kConsonants[rng.below(14)];
    word += kVowels[rng.below(5)];
    if (rng.chance(0.25)) word += kConsonants[rng.below(14)];
  }
  return word;
}

std::vector<std::string> make_lexicon(Rng& rng, int64_t count, int64_t min_syl, int64_t max_syl) {
  std::vector<std::string> words;
  while (static_cast<int64_t>(words.size()) < count) {
    auto w = make_word(rng, min_syl, max_syl);
    // No word ends in 's' (the plural and agreement marker) and none repeats.
    if (w.back() == 's' || std::find(words.begin(), words.end(), w) != words.end()) continue;
    words.push_back(std::move(w));
  }
  return words;
}

constexpr int64_t kTopics = 6;
constexpr int64_t kTopicNouns = 20;
constexpr int64_t kTopicVerbs = 10;

struct Grammar {
  std::vector<std::string> nouns, verbs, adjectives, names, preps;
  // Per topic, the indices of its preferred nouns and verbs.
  std::array<std::vector<int64_t>, kTopics> topic_nouns, topic_verbs;

  explicit Grammar(Rng& rng) {
    nouns = make_lexicon(rng, 160, 1, 3);
    verbs = make_lexicon(rng, 80, 1, 2);
    adjectives = make_lexicon(rng, 50, 2, 3);
    names = make_lexicon(rng, 60, 2, 3);
    for (auto& n : names) n[0] = static_cast<char>(std::toupper(n[0]));
    preps = {"in", "on", "near", "under", "with", "over"};
    for (auto& t : topic_nouns) {
      for (int64_t i = 0; i < kTopicNouns; ++i) t.push_back(rng.below(160));
    }
    for (auto& t : topic_verbs) {
      for (int64_t i = 0; i < kTopicVerbs; ++i) t.push_back(rng.below(80));
    }
  }
};

// A noun phrase with a determiner that agrees in number.
std::string noun_phrase(Rng& rng, const Grammar& g, int64_t topic, bool plural) {
  std::string out;
  if (plural) {
    out = rng.chance(0.5) ? "the " : "some ";
  } else {
    const int64_t d = rng.below(3);
    out = d == 0 ? "the " : d == 1 ? "a " : "every ";
  }
  if (rng.chance(0.35)) out += g.adjectives[rng.zipf(50)] + " ";
  const int64_t noun = rng.chance(0.8) ? g.topic_nouns[topic][rng.zipf(kTopicNouns)]
                                       : rng.below(static_cast<int64_t>(g.nouns.size()));
  out += g.nouns[noun];
  if (plural) out += "s";
  return out;
}

std::string verb(Rng& rng, const Grammar& g, int64_t topic, bool singular_subject) {
  const int64_t v = rng.chance(0.8) ? g.topic_verbs[topic][rng.zipf(kTopicVerbs)]
                                    : rng.below(static_cast<int64_t>(g.verbs.size()));
  return g.verbs[v] + (singular_subject ? "s" : "");
}

// One sentence; the subject is the document's entity with probability `p_entity`.
std::string sentence(Rng& rng, const Grammar& g, int64_t topic, const std::string& entity,
                     double p_entity) {
  std::string s;
  bool singular = true;
  if (rng.chance(p_entity)) {
    s = entity;
  } else {
    singular = !rng.chance(0.4);
    s = noun_phrase(rng, g, topic, !singular);
    if (rng.chance(0.25)) {  // relative clause: agreement spans it
      s += " that " + verb(rng, g, topic, singular) + " " +
           noun_phrase(rng, g, topic, rng.chance(0.4));
    }
  }
  s += " " + verb(rng, g, topic, singular) + " " + noun_phrase(rng, g, topic, rng.chance(0.4));
  if (rng.chance(0.3)) {
    s += " " + g.preps[rng.below(6)] + " " + noun_phrase(rng, g, topic, rng.chance(0.4));
  }
  s[0] = static_cast<char>(std::toupper(s[0]));
  return s + ".";
}

std::string document(Rng& rng, const Grammar& g) {
  const int64_t topic = rng.below(kTopics);
  const std::string entity = g.names[rng.below(static_cast<int64_t>(g.names.size()))];
  std::string doc = entity + " is " + noun_phrase(rng, g, topic, false) + ".";
  const int64_t sentences = 3 + rng.below(6);
  for (int64_t i = 0; i < sentences; ++i) doc += " " + sentence(rng, g, topic, entity, 0.3);
  if (rng.chance(0.4)) {  // a numbered list
    const int64_t items = 2 + rng.below(4);
    for (int64_t i = 1; i <= items; ++i) {
      doc += "\n" + std::to_string(i) + ". " + sentence(rng, g, topic, entity, 0.2);
    }
  }
  return doc + "\n\n";
}

}  // namespace

std::string generate_corpus(int64_t chars, uint64_t seed) {
  TORCH_CHECK_VALUE(chars > 0, "[train_gpt::generate_corpus] chars must be > 0, got ", chars);
  Rng rng(seed);
  const Grammar grammar(rng);
  std::string text;
  text.reserve(static_cast<size_t>(chars) + 1024);
  while (static_cast<int64_t>(text.size()) < chars) text += document(rng, grammar);
  text.resize(static_cast<size_t>(chars));
  return text;
}

CharVocab CharVocab::from_text(const std::string& text, bool byte_level) {
  std::string symbols;
  if (byte_level) {
    for (int c = 0; c < 256; ++c) symbols += static_cast<char>(c);
    return CharVocab(symbols);
  }
  std::array<bool, 256> seen{};
  for (const char c : text) seen[static_cast<unsigned char>(c)] = true;
  for (int c = 0; c < 256; ++c) {
    if (seen[c]) symbols += static_cast<char>(c);
  }
  return CharVocab(symbols);
}

CharVocab::CharVocab(std::string symbols) : symbols_(std::move(symbols)), index_(256, -1) {
  for (const auto i : c10::irange(symbols_.size())) {
    index_[static_cast<unsigned char>(symbols_[i])] = static_cast<int16_t>(i);
  }
}

at::Tensor CharVocab::encode(const std::string& text) const {
  auto out = at::empty({static_cast<int64_t>(text.size())}, at::kLong);
  auto* data = out.data_ptr<int64_t>();
  for (const auto i : c10::irange(text.size())) {
    const auto c = static_cast<unsigned char>(text[i]);
    TORCH_CHECK_VALUE(index_[c] >= 0, "[train_gpt::CharVocab] byte ", static_cast<int>(c),
                      " at offset ", i, " is not in the vocabulary");
    data[i] = index_[c];
  }
  return out;
}

std::string CharVocab::decode(const at::Tensor& tokens) const {
  const auto t = tokens.to(at::kLong).contiguous();
  std::string out;
  const auto* data = t.data_ptr<int64_t>();
  for (const auto i : c10::irange(t.numel())) out += symbols_.at(static_cast<size_t>(data[i]));
  return out;
}

Dataset make_dataset(const std::string& text, double valid_fraction, bool byte_level) {
  TORCH_CHECK_VALUE(valid_fraction > 0 && valid_fraction < 1,
                    "[train_gpt] valid_fraction must be in (0, 1), got ", valid_fraction);
  Dataset d;
  d.vocab = CharVocab::from_text(text, byte_level);
  const auto tokens = d.vocab.encode(text);
  const auto n_train = static_cast<int64_t>(static_cast<double>(tokens.numel()) * (1 - valid_fraction));
  d.train = tokens.narrow(0, 0, n_train);
  d.valid = tokens.narrow(0, n_train, tokens.numel() - n_train);
  return d;
}

at::Tensor train_batch(const at::Tensor& tokens, int64_t step, int64_t global_batch,
                       int64_t context, int64_t rank, int64_t world, uint64_t seed) {
  TORCH_CHECK_VALUE(world >= 1 && global_batch % world == 0, "[train_gpt] global batch ",
                    global_batch, " must be a multiple of the world size ", world);
  const int64_t span = context + 1;
  TORCH_CHECK_VALUE(tokens.numel() > span, "[train_gpt] the training text has ", tokens.numel(),
                    " tokens, fewer than one window of ", span);
  Rng rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(step) + 1);
  const int64_t local = global_batch / world;
  auto out = at::empty({local, span}, at::kLong);
  for (int64_t row = 0; row < global_batch; ++row) {
    const int64_t start = rng.below(tokens.numel() - span + 1);
    if (row / local == rank) out[row % local].copy_(tokens.narrow(0, start, span));
  }
  return out;
}

at::Tensor valid_windows(const at::Tensor& tokens, int64_t count, int64_t context) {
  const int64_t span = context + 1;
  TORCH_CHECK_VALUE(tokens.numel() >= span, "[train_gpt] the validation text has ",
                    tokens.numel(), " tokens, fewer than one window of ", span);
  const int64_t windows = std::min(count, tokens.numel() / span);
  auto out = at::empty({windows, span}, at::kLong);
  const int64_t stride = (tokens.numel() - span) / std::max<int64_t>(windows - 1, 1);
  for (int64_t i = 0; i < windows; ++i) out[i].copy_(tokens.narrow(0, i * stride, span));
  return out;
}

}  // namespace train_gpt
