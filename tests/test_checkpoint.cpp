// Checkpoints (muon/distributed/checkpoints/checkpoint.h): resuming in the same layout is
// bit-identical to never stopping; resharding across world sizes and
// layouts (single process, layer-wise, sharded, tensor parallel) equals
// single-process training up to float rounding; damaged, truncated, missing
// and mixed files and other models are errors naming the file and the
// tensor, and leave model and optimizer untouched on every rank; random bit
// flips never load a different state. Ranks are threads over real Gloo
// groups; the kill loop runs real processes (test_checkpoint_kill.cpp).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <torch/optim/adamw.h>

#include "checkpoint_model.h"
#include "distributed/checkpoints/checkpoint_state.h"
#include "process_util.h"

namespace {

namespace fs = std::filesystem;
using namespace muon::test::checkpoint;  // NOLINT(google-build-using-namespace): the tests' model

// The single-process model after `steps` steps.
Named whole_after(int64_t steps, const std::string& optimizer = "muon") {
  Named out;
  muon::test::run_ranks(1, [&](Group& g) {
    Rank r("none", g, optimizer);
    r.train(0, steps);
    out = r.named;
  });
  return out;
}

// `world` thread ranks of layout `kind` train from step 0 and save a
// checkpoint into `dir` (keeping the newest `keep`) after each step of `saves`.
void train_saving(const fs::path& dir, const std::string& kind, int world,
                  const std::vector<int64_t>& saves, int64_t keep = 2) {
  muon::test::run_ranks(world, [&](Group& group) {
    Rank r(kind, group);
    int64_t step = 0;
    for (const int64_t s : saves) {
      r.train(step, s);
      r.save(dir.string(), s, keep);
      step = s;
    }
  });
}

// Largest difference relative to the largest element (absolute where the
// expected part is all zeros: a shard of padding rows only).
double relative(const at::Tensor& got, const at::Tensor& expected) {
  if (expected.numel() == 0) return 0;
  const auto diff = (got - expected).abs().max().item<double>();
  const auto scale = expected.abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

fs::path fresh_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("muon_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

// Every value of the parameters and of every optimizer state field (steps
// as tensors, a missing state or field as an empty marker), to compare
// bit for bit.
std::vector<at::Tensor> snapshot(Rank& r) {
  std::vector<at::Tensor> out;
  for (const auto& item : r.named) out.push_back(item.value().detach().clone());
  for (const auto& slot : muon::distributed::detail::state_slots(*r.opt)) {
    auto* state = muon::distributed::detail::find_state(slot);
    if (state == nullptr) {
      out.push_back(at::full({1}, -1.0));
      continue;
    }
    for (const auto& f : muon::distributed::detail::state_fields(slot, *state)) {
      if (f.integer != nullptr) {
        out.push_back(at::full({}, *f.integer, at::kLong));
      } else {
        out.push_back(f.tensor->defined() ? f.tensor->clone() : at::full({1}, -2.0));
      }
    }
  }
  return out;
}

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].scalar_type() != b[i].scalar_type() || !a[i].sizes().equals(b[i].sizes()) ||
        !at::equal(a[i], b[i])) {
      return false;
    }
  }
  return true;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// ---- resuming in the same layout: bit-identical -------------------------------------

class SameLayout : public ::testing::TestWithParam<std::pair<std::string, int>> {};

TEST_P(SameLayout, ResumingIsBitIdenticalToNeverStopping) {
  const auto [kind, world] = GetParam();
  const auto dir = fresh_dir("same_" + kind + std::to_string(world));
  muon::test::run_ranks(world, [&, kind = kind](Group& group) {
    Rank a(kind, group);
    a.train(0, 3);
    a.save(dir.string(), 3);
    a.train(3, 6);
    Rank b(kind, group);
    b.train(0, 1);  // different state, overwritten by the load
    const auto info = b.load(dir.string());
    EXPECT_EQ(info.step, 3);
    EXPECT_EQ(info.extra, "extra 3");
    EXPECT_EQ(info.world_size, world);
    b.train(3, 6);
    for (const auto& item : a.named) {
      EXPECT_TRUE(at::equal(item.value(), b.named[item.key()])) << kind << " " << item.key();
    }
  });
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, SameLayout,
                         ::testing::Values(std::make_pair(std::string("none"), 1),
                                           std::make_pair(std::string("layerwise"), 2),
                                           std::make_pair(std::string("sharded"), 3),
                                           std::make_pair(std::string("tp"), 2),
                                           std::make_pair(std::string("2d"), 4),
                                           std::make_pair(std::string("padded"), 5)),
                         [](const auto& info) { return info.param.first + std::to_string(info.param.second); });

// Saving creates the state a first step would (zeros, step 0) for every
// parameter that has none, so every parameter is in the checkpoint; the
// training that follows is bit-identical to one that never saved.
TEST(Checkpoint, EagerStateChangesNothingAndEveryParameterIsStored) {
  for (const std::string optimizer : {"muon", "adaptive_muon", "adaptive_muon/namo", "lion", "laprop", "signum",
                                     "sim_ademamix", "soap", "adamw", "adam"}) {
    const auto dir = fresh_dir("eager_" + optimizer.substr(0, optimizer.find('/')) +
                               (optimizer.find('/') == std::string::npos ? "" : "_namo"));
    muon::test::run_ranks(2, [&](Group& group) {
      Rank saved("sharded", group, optimizer);
      saved.save(dir.string(), 0);
      saved.train(0, 3);
      Rank plain("sharded", group, optimizer);
      plain.train(0, 3);
      EXPECT_TRUE(same(snapshot(plain), snapshot(saved))) << optimizer << " rank " << group.rank();
      Rank loaded("sharded", group, optimizer);
      loaded.load(dir.string());
      loaded.train(0, 3);
      EXPECT_TRUE(same(snapshot(plain), snapshot(loaded))) << optimizer << " from step 0, rank " << group.rank();
    });
    const auto m = nlohmann::json::parse(read_file(fs::path(dir) / "step-00000000" / "manifest.json"));
    EXPECT_EQ(m["state"].size(), kModel.size()) << optimizer;
    fs::remove_all(dir);
  }
}

// ---- resharding ------------------------------------------------------------------

// A leg of Muon's reshard chain (reshard_leg); with `reference`, each
// rank's part is checked against it.
void leg(const std::string& kind, int world, const std::string& in, const std::string& out, int64_t from,
         int64_t to, const Named& reference, const std::string& what) {
  reshard_leg(kind, world, in, out, from, to, "muon", what, [&](Rank& r, const Group& group) {
    if (reference.is_empty()) return;
    for (size_t k = 0; k < kModel.size(); ++k) {
      const auto& name = kModel[k].first;
      // Sharded and layer-wise steps are the same computation up to BLAS
      // summation order; 1e-5 of the largest element, as the layout tests.
      EXPECT_LE(relative(r.named[name].detach(), r.local[k](reference[name].detach())), 1e-5)
          << what << " " << name << " rank " << group.rank();
    }
  });
}

TEST(Checkpoint, ReshardsAcrossWorldSizesAndLayouts) {
  const auto reference = whole_after(6);
  const auto dir = fresh_dir("reshard");
  const auto d = [&](const char* leg_name) { return (dir / leg_name).string(); };
  // 4 → 2 → 1 → 3, through sharded, layer-wise, single and back to sharded.
  leg("sharded", 4, "", d("a"), 0, 2, Named(), "sharded W=4");
  leg("layerwise", 2, d("a"), d("b"), 2, 3, Named(), "layer-wise W=2 from sharded W=4");
  leg("none", 1, d("b"), d("c"), 3, 4, Named(), "single from layer-wise W=2");
  leg("sharded", 3, d("c"), d("e"), 4, 5, Named(), "sharded W=3 from single");
  leg("layerwise", 3, d("e"), d("f"), 5, 6, reference, "layer-wise W=3 from sharded W=3");
  leg("none", 1, d("f"), d("g"), 6, 6, reference, "single from layer-wise W=3");
  fs::remove_all(dir);
}

TEST(Checkpoint, ReshardsPaddedAndEmptyShards) {
  const auto reference = whole_after(4);
  const auto dir = fresh_dir("padded");
  leg("padded", 3, "", (dir / "a").string(), 0, 2, Named(), "padded W=3");
  leg("padded", 5, (dir / "a").string(), (dir / "b").string(), 2, 3, Named(), "padded W=5 from padded W=3");
  leg("sharded", 2, (dir / "b").string(), (dir / "c").string(), 3, 4, reference, "sharded W=2 from padded W=5");
  leg("padded", 5, (dir / "c").string(), (dir / "d").string(), 4, 4, reference, "padded W=5 from sharded W=2");
  fs::remove_all(dir);
}

TEST(Checkpoint, ReshardsTensorParallelAndTwoDimensional) {
  const auto reference = whole_after(4);
  const auto dir = fresh_dir("tp");
  leg("tp", 2, "", (dir / "a").string(), 0, 2, Named(), "TP 2");
  leg("none", 1, (dir / "a").string(), (dir / "b").string(), 2, 4, reference, "TP 1 from TP 2");
  leg("tp", 2, (dir / "b").string(), (dir / "c").string(), 4, 4, Named(), "TP 2 from TP 1");
  leg("sharded", 2, (dir / "c").string(), (dir / "d").string(), 4, 4, whole_after(4), "sharded from TP 2");
  leg("2d", 4, (dir / "d").string(), (dir / "e").string(), 4, 5, Named(), "2-D (dp 2 x tp 2) from sharded");
  leg("none", 1, (dir / "e").string(), (dir / "f").string(), 5, 5, whole_after(5), "single from 2-D");
  fs::remove_all(dir);
}

// The reshard chain with real processes: checkpoint_writer under
// muon-launch at 4 ranks (sharded), resumed at 2 (layer-wise), then at 3
// (2-D needs 4: sharded), then one process; the result equals
// single-process training.
TEST(CheckpointProcesses, ReshardsAcrossWorldSizesAndLayouts) {
  const auto dir = fresh_dir("processes");
  const std::string writer = MUON_CHECKPOINT_WRITER_EXE;
  const std::vector<std::tuple<int, std::string, int>> legs{{4, "sharded", 2}, {2, "layerwise", 3}, {3, "sharded", 4},
                                                           {1, "none", 5}};
  for (const auto& [world, kind, steps] : legs) {
    std::vector<std::string> args{writer, dir.string(), std::to_string(world), kind, std::to_string(steps)};
    if (world > 1) args.insert(args.begin(), {MUON_LAUNCH_EXE, "-n", std::to_string(world), "--"});
    muon::test::Child child(args);
    ASSERT_EQ(child.wait(120), 0) << kind << " at " << world << ": " << child.err();
    EXPECT_NE(child.out().find("saved " + std::to_string(steps)), std::string::npos) << child.out();
  }
  const auto reference = whole_after(5);
  muon::test::run_ranks(1, [&](Group& group) {
    Rank r("none", group);
    EXPECT_EQ(r.load(dir.string()).step, 5);
    for (const auto& item : reference) {
      EXPECT_LE(relative(r.named[item.key()].detach(), item.value().detach()), 1e-5) << item.key();
    }
  });
  fs::remove_all(dir);
}

// ---- damage, other models, and what a failed load leaves ---------------------------

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// The data file of rank `rank` in checkpoint directory `step_dir`.
fs::path rank_file(const fs::path& step_dir, int rank) {
  const auto prefix = "rank-0000" + std::to_string(rank) + "-";
  for (const auto& e : fs::directory_iterator(step_dir)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) return e.path();
  }
  ADD_FAILURE() << "no file of rank " << rank << " in " << step_dir;
  return {};
}

// Byte offset of the first chunk of `key` in the manifest of `step_dir`.
int64_t chunk_offset(const fs::path& step_dir, const std::string& key, int chunk) {
  const auto text = read_file(step_dir / "manifest.json");
  const auto m = nlohmann::json::parse(text);
  return m["tensors"][key]["chunks"][chunk]["offset"].get<int64_t>();
}

// Writes manifest `m` (without its seal) to `path` with a valid seal: the
// last line "xxh3": "<XXH3-64 of every byte before it>"} as the library
// writes it (docs/checkpoints.md), so that only the content is wrong.
void reseal(const fs::path& path, nlohmann::ordered_json m) {
  m.erase("xxh3");
  auto body = m.dump(1);
  body.resize(body.rfind('}'));  // the object's closing brace; the seal line closes it
  body.resize(body.find_last_not_of(" \n") + 1);
  body += ",";
  char seal[64];
  std::snprintf(seal, sizeof(seal), "\"xxh3\": \"%016llx\"}\n",
                static_cast<unsigned long long>(XXH3_64bits(body.data(), body.size())));
  write_file(path, body + "\n" + seal);
}

// Loads `dir` into a model in `kind` at `world` ranks that trained one step
// (so its state differs from the checkpoint's); expects every rank to raise
// a message containing each of `expected`, and every rank's parameters and
// optimizer state to be unchanged.
void expect_load_fails(const std::string& kind, int world, const fs::path& dir,
                       const std::vector<std::string>& expected, const std::string& what) {
  const auto errors = muon::test::run_ranks_collect(world, [&](Group& group) {
    Rank r(kind, group);
    r.train(0, 1);
    const auto before = snapshot(r);
    try {
      r.load(dir.string());
    } catch (...) {
      EXPECT_TRUE(same(before, snapshot(r))) << what << ": rank " << group.rank() << " changed";
      throw;
    }
  });
  for (size_t rank = 0; rank < errors.size(); ++rank) {
    ASSERT_FALSE(errors[rank].empty()) << what << ": rank " << rank << " loaded";
    EXPECT_LT(errors[rank].size(), 1000u) << errors[rank];
    for (const auto& e : expected) {
      EXPECT_NE(errors[rank].find(e), std::string::npos) << what << ": rank " << rank << ": '" << e
                                                         << "' not in: " << errors[rank];
    }
  }
}

TEST(Checkpoint, DamageIsAnErrorNamingTheFileAndTensorAndChangesNothingOnAnyRank) {
  const auto dir = fresh_dir("damage");
  muon::test::run_ranks(2, [&](Group& group) {
    Rank r("sharded", group);
    r.train(0, 2);
    r.save((dir / "good").string(), 2);
    r.train(2, 3);
    r.save((dir / "other").string(), 3);
  });
  const auto good = dir / "good" / "step-00000002";
  const auto key = std::string("model/blocks.0.fc1.weight");
  auto damaged = [&](const char* name) {
    const auto d = dir / name;
    fs::create_directories(d);
    fs::copy(good, d / "step-00000002", fs::copy_options::recursive);
    return d / "step-00000002";
  };
  {
    // One flipped bit in rank 1's part of fc1: only rank 1 reads it in the
    // same layout; rank 0 must fail too, and change nothing.
    const auto d = damaged("flip");
    const auto file = rank_file(d, 1);
    auto bytes = read_file(file);
    bytes[static_cast<size_t>(chunk_offset(d, key, 1) + 37)] ^= 0x10;
    write_file(file, bytes);
    expect_load_fails("sharded", 2, d, {file.filename().string(), key, "checksum"}, "bit flip");
    expect_load_fails("none", 1, d, {file.filename().string(), key, "checksum"}, "bit flip, resharded");
  }
  {
    const auto d = damaged("truncated");
    const auto file = rank_file(d, 0);
    fs::resize_file(file, fs::file_size(file) - 100);
    expect_load_fails("sharded", 2, d, {file.filename().string(), "truncated"}, "truncated");
  }
  {
    const auto d = damaged("missing");
    const auto file = rank_file(d, 1);
    fs::remove(file);
    expect_load_fails("sharded", 2, d, {file.filename().string(), "cannot be opened"}, "missing");
  }
  {
    // Rank 1's file of the step-3 save under the step-2 save's name.
    const auto d = damaged("mixed");
    const auto file = rank_file(d, 1);
    fs::copy_file(rank_file(dir / "other" / "step-00000003", 1), file, fs::copy_options::overwrite_existing);
    expect_load_fails("sharded", 2, d, {file.filename().string(), "step 3", "mixed"}, "mixed saves");
  }
  {
    const auto d = damaged("manifest");
    auto text = read_file(d / "manifest.json");
    const auto at = text.find("\"step\": 2");
    ASSERT_NE(at, std::string::npos);
    text[at + 8] = '4';  // "step": 4, still valid JSON
    write_file(d / "manifest.json", text);
    expect_load_fails("sharded", 2, d, {"manifest.json", "checksum"}, "manifest edited");
  }
  {
    // A manifest whose checksum is valid (an outside writer's bug, or a
    // forgery) but whose chunks overlap while their element counts add up:
    // fc1's second chunk moved up one row, so one row is read twice and
    // one row is in no chunk. Refused by name, nothing changed.
    const auto d = damaged("overlap");
    auto m = nlohmann::ordered_json::parse(read_file(d / "manifest.json"));
    auto& second = m["tensors"][key]["chunks"][1]["offsets"][0];
    ASSERT_GT(second.get<int64_t>(), 0);
    second = second.get<int64_t>() - 1;
    reseal(d / "manifest.json", m);
    expect_load_fails("sharded", 2, d, {"manifest.json", key, "overlapping chunks"}, "overlap");
    expect_load_fails("none", 1, d, {"manifest.json", key, "overlapping chunks"}, "overlap, resharded");
  }
  {
    // A chunk offset whose sum with its size passes int64: refused as
    // outside the shape, naming the manifest and the tensor.
    const auto d = damaged("offset");
    auto m = nlohmann::ordered_json::parse(read_file(d / "manifest.json"));
    m["tensors"][key]["chunks"][1]["offsets"][0] = std::numeric_limits<int64_t>::max() - 1;
    reseal(d / "manifest.json", m);
    expect_load_fails("sharded", 2, d, {"manifest.json", key, "outside its shape"}, "offset past int64");
  }
  expect_load_fails("sharded", 2, dir / "nothing", {"nothing", "not a directory"}, "no directory");
  fs::create_directories(dir / "empty" / "step-00000001");
  expect_load_fails("sharded", 2, dir / "empty", {"no complete checkpoint"}, "unfinished only");
  fs::remove_all(dir);
}

// verify_checkpoint reads every byte without a model; the newest checkpoint
// that verifies is found past damaged newer ones (a bit flip in a data file,
// an edited manifest), each reported with its reason; an unfinished save is
// not a checkpoint and is passed over without a word.
TEST(Checkpoint, VerifyFindsTheNewestCheckpointThatIsNotDamaged) {
  const auto dir = fresh_dir("verify");
  train_saving(dir, "sharded", 2, {2, 3, 4}, 3);
  const auto key = std::string("model/blocks.0.fc1.weight");
  for (int64_t step : {2, 3, 4}) {
    EXPECT_EQ(muon::distributed::verify_checkpoint((dir / ("step-0000000" + std::to_string(step))).string()).step, step);
  }
  EXPECT_EQ(muon::distributed::verify_checkpoint(dir.string()).step, 4);
  fs::create_directories(dir / "step-00000005");  // an unfinished save
  std::vector<muon::distributed::SkippedCheckpoint> skipped;
  ASSERT_EQ(muon::distributed::latest_verified_checkpoint(dir.string(), &skipped)->step, 4);
  EXPECT_TRUE(skipped.empty());

  const auto four = dir / "step-00000004";
  const auto file = rank_file(four, 1);
  auto bytes = read_file(file);
  bytes[static_cast<size_t>(chunk_offset(four, key, 1) + 37)] ^= 0x10;
  write_file(file, bytes);
  const auto three = dir / "step-00000003";
  auto text = read_file(three / "manifest.json");
  text[text.find("\"step\": 3") + 8] = '7';
  write_file(three / "manifest.json", text);
  try {
    muon::distributed::verify_checkpoint(four.string());
    ADD_FAILURE() << "a damaged checkpoint verified";
  } catch (const c10::ValueError& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find(file.filename().string()), std::string::npos) << what;
    EXPECT_NE(what.find(key), std::string::npos) << what;
    EXPECT_NE(what.find("checksum"), std::string::npos) << what;
  }
  skipped.clear();
  const auto found = muon::distributed::latest_verified_checkpoint(dir.string(), &skipped);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 2);
  EXPECT_EQ(found->path, (dir / "step-00000002").string());
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0].path, four.string());
  EXPECT_NE(skipped[0].reason.find("checksum"), std::string::npos) << skipped[0].reason;
  EXPECT_EQ(skipped[1].path, three.string());
  EXPECT_NE(skipped[1].reason.find("manifest"), std::string::npos) << skipped[1].reason;
  for (const auto& s : skipped) EXPECT_EQ(s.reason.find('\n'), std::string::npos) << s.reason;

  fs::remove(dir / "step-00000002" / "manifest.json");
  skipped.clear();
  EXPECT_FALSE(muon::distributed::latest_verified_checkpoint(dir.string(), &skipped).has_value());
  EXPECT_EQ(skipped.size(), 2u);
  EXPECT_FALSE(muon::distributed::latest_verified_checkpoint((dir / "nothing").string()).has_value());
  EXPECT_THROW(muon::distributed::verify_checkpoint((dir / "nothing").string()), c10::ValueError);
  fs::remove_all(dir);
}

TEST(Checkpoint, AnotherModelOrOptimizerIsAnErrorNamingTheFirstDifference) {
  const auto dir = fresh_dir("other_model");
  train_saving(dir, "none", 1, {1});
  auto load_into = [&](const Named& named, const std::string& optimizer) {
    auto opt = muon::make_optimizer(named, config("none", optimizer));
    const auto before = named[kModel[0].first].detach().clone();
    try {
      muon::distributed::load_checkpoint(dir.string(), named, *opt);
    } catch (const c10::Error& e) {
      EXPECT_TRUE(at::equal(before, named[kModel[0].first])) << "the model changed";
      EXPECT_TRUE(opt->state().empty()) << "the optimizer changed";
      return std::string(e.what_without_backtrace());
    }
    return std::string("loaded");
  };
  Named wider;
  for (size_t k = 0; k < kModel.size(); ++k) {
    auto shape = kModel[k].second;
    if (kModel[k].first == "blocks.0.fc1.weight") shape[0] = 72;
    wider.insert(kModel[k].first, at::zeros(shape).requires_grad_(true));
  }
  const auto wide = load_into(wider, "muon");
  EXPECT_NE(wide.find("parameter 'blocks.0.fc1.weight' has shape [72, 16] in this model, [64, 16] in the "
                      "checkpoint"),
            std::string::npos)
      << wide;
  Named fewer;
  for (size_t k = 0; k + 1 < kModel.size(); ++k) fewer.insert(kModel[k].first, full_param(k).requires_grad_(true));
  const auto few = load_into(fewer, "muon");
  EXPECT_NE(few.find("the checkpoint has parameter 'lm_head.weight', which this model does not"), std::string::npos)
      << few;
  Named same_model;
  for (size_t k = 0; k < kModel.size(); ++k) same_model.insert(kModel[k].first, full_param(k).requires_grad_(true));
  const auto kind = load_into(same_model, "lion");
  EXPECT_NE(kind.find("has adamw state in the checkpoint, but this optimizer steps it with lion"), std::string::npos)
      << kind;
  fs::remove_all(dir);
}

// LibTorch's own AdamW, alone (no composite): saved without amsgrad, loaded
// with it on, the missing maximum starts from zeros and the step runs.
TEST(Checkpoint, LibTorchAdamWAloneAndAmsgradTurnedOn) {
  const auto dir = fresh_dir("adamw");
  Named named;
  named.insert("w", full_param(1).requires_grad_(true));
  torch::optim::AdamW plain({named["w"]}, torch::optim::AdamWOptions(1e-2));
  named["w"].mutable_grad() = full_grad(1, 0);
  plain.step();
  muon::distributed::save_checkpoint(dir.string(), named, plain, 1);
  Named other;
  other.insert("w", at::zeros_like(full_param(1)).requires_grad_(true));
  torch::optim::AdamW ams({other["w"]}, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  EXPECT_EQ(muon::distributed::load_checkpoint(dir.string(), other, ams).step, 1);
  EXPECT_TRUE(at::equal(other["w"], named["w"]));
  const auto& st = static_cast<torch::optim::AdamWParamState&>(*ams.state().begin()->second);
  EXPECT_EQ(st.step(), 1);
  ASSERT_TRUE(st.max_exp_avg_sq().defined());
  other["w"].mutable_grad() = full_grad(1, 1);
  EXPECT_NO_THROW(ams.step());
  fs::remove_all(dir);
}

TEST(Checkpoint, RandomBitFlipsNeverLoadADifferentState) {
  const auto dir = fresh_dir("flips");
  std::vector<at::Tensor> clean;
  muon::test::run_ranks(1, [&](Group& group) {
    Rank r("none", group);
    r.train(0, 2);
    r.save((dir / "good").string(), 2);
    Rank loaded("none", group);
    loaded.load((dir / "good").string());
    clean = snapshot(loaded);
  });
  const auto good = dir / "good" / "step-00000002";
  std::vector<std::pair<std::string, std::string>> files;
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(good)) {
    files.emplace_back(e.path().filename().string(), read_file(e.path()));
    total += static_cast<int64_t>(files.back().second.size());
  }
  std::mt19937_64 rng(1234);
  int errors = 0;
  int equal = 0;
  constexpr int kTrials = 200;
  for (int trial = 0; trial < kTrials; ++trial) {
    auto damaged = files;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      auto at = static_cast<int64_t>(rng() % static_cast<uint64_t>(total));
      for (auto& [name, bytes] : damaged) {
        if (at < static_cast<int64_t>(bytes.size())) {
          bytes[static_cast<size_t>(at)] ^= static_cast<char>(1 << (rng() % 8));
          break;
        }
        at -= static_cast<int64_t>(bytes.size());
      }
    }
    const auto d = dir / ("t" + std::to_string(trial)) / "step-00000002";
    fs::create_directories(d);
    for (const auto& [name, bytes] : damaged) write_file(d / name, bytes);
    muon::test::run_ranks(1, [&](Group& group) {
      Rank r("none", group);
      try {
        r.load(d.string());
      } catch (const c10::Error&) {
        ++errors;
        return;
      }
      // Loaded: only bytes no reader uses (alignment padding, reserved header
      // bytes) may have changed, and the state is the clean one.
      EXPECT_TRUE(same(clean, snapshot(r))) << "trial " << trial << ": a damaged checkpoint loaded another state";
      ++equal;
    });
    fs::remove_all(d.parent_path());
  }
  EXPECT_EQ(errors + equal, kTrials);
  EXPECT_GT(errors, kTrials * 9 / 10);
  std::printf("bit flips: %d of %d trials raised, %d loaded the clean state (flips in unused bytes)\n", errors,
              kTrials, equal);
  fs::remove_all(dir);
}

// ---- the directory: keep K, unfinished saves, unwritable paths ----------------------

TEST(Checkpoint, KeepsTheNewestKAndIgnoresUnfinishedSaves) {
  const auto dir = fresh_dir("keep");
  train_saving(dir, "layerwise", 2, {1, 2, 3, 4, 5}, 2);
  auto steps = [&]() {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(steps(), (std::vector<std::string>{"step-00000004", "step-00000005"}));
  // A save killed before its commit: data files, no manifest. Ignored.
  fs::create_directories(dir / "step-00000009");
  fs::copy_file(rank_file(dir / "step-00000005", 0), dir / "step-00000009" / "rank-00000-0000000000000000.bin");
  fs::create_directories(dir / "step-00000003");
  const auto latest = muon::distributed::latest_checkpoint(dir.string());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 5);
  muon::test::run_ranks(1, [&](Group& group) {
    Rank r("none", group);
    EXPECT_EQ(r.load(dir.string()).step, 5);
    // Saving step 5 again replaces it: one manifest, one set of files.
    r.save(dir.string(), 5, 2);
    EXPECT_EQ(r.load(dir.string()).world_size, 1);
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir / "step-00000005")) files += e.path().extension() == ".bin";
    EXPECT_EQ(files, 1);
    r.train(5, 6);
    r.save(dir.string(), 6, 2);
  });
  // The older unfinished save is removed; the newer one (after the newest
  // complete checkpoint) stays until a save passes it.
  EXPECT_EQ(steps(), (std::vector<std::string>{"step-00000005", "step-00000006", "step-00000009"}));
  fs::remove_all(dir);
}

TEST(Checkpoint, AnUnwritableDirectoryIsAnErrorOnEveryRankBeforeAnythingIsWritten) {
  const auto dir = fresh_dir("unwritable");
  fs::create_directories(dir);
  write_file(dir / "file", "x");
  const auto bad = (dir / "file" / "ckpt").string();
  try {
    muon::distributed::check_checkpoint_dir(bad);
    ADD_FAILURE() << "check_checkpoint_dir accepted a path under a file";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(bad), std::string::npos) << e.what_without_backtrace();
  }
  EXPECT_NO_THROW(muon::distributed::check_checkpoint_dir((dir / "ok").string()));
  EXPECT_TRUE(fs::is_empty(dir / "ok"));
  const auto errors = muon::test::run_ranks_collect(2, [&](Group& group) {
    Rank r("sharded", group);
    r.save(bad, 1);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("cannot create"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(Checkpoint, RanksThatDisagreeAreAnErrorOnEveryRankNotAHang) {
  const auto dir = fresh_dir("disagree");
  auto errors = muon::test::run_ranks_collect(2, [&](Group& group) {
    Rank r("sharded", group);
    r.save(dir.string(), 1 + group.rank());
  });
  for (const auto& e : errors) EXPECT_NE(e.find("rank 1 saves step 2"), std::string::npos) << e;
  EXPECT_FALSE(muon::distributed::latest_checkpoint(dir.string()).has_value());
  // 2-D with only the data-parallel group: the TP peers would write a
  // second manifest into the same directory.
  errors = muon::test::run_ranks_collect(4, [&](Group& group) {
    Rank r("2d", group);
    const auto dp = r.layout.row_shards.begin()->second.group();
    muon::distributed::save_checkpoint(dir.string(), r.named, *r.opt, 1, r.layout, "",
                                CheckpointOptions().group(dp));
  });
  for (const auto& e : errors) EXPECT_NE(e.find("pass the world as CheckpointOptions::group"), std::string::npos) << e;
  fs::remove_all(dir);
}

// ---- kills at random moments (real processes) ---------------------------------------

// Whether no process runs `exe` (within `limit_s`): ranks killed with their
// launcher are gone before the directory is read.
bool writers_gone(const std::string& exe, double limit_s) {
  const auto target = fs::canonical(exe);
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit_s) {
    bool any = false;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc", ec)) {
      std::error_code link_error;
      const auto linked = fs::read_symlink(e.path() / "exe", link_error);
      if (!link_error && linked == target && !muon::test::process_gone(std::stoi(e.path().filename().string()))) {
        any = true;
      }
    }
    if (!any) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Whether `dir` holds what a save killed before its commit leaves: a step
// directory without a manifest, or files its manifest does not name.
bool save_interrupted(const fs::path& dir) {
  if (!fs::exists(dir)) return false;
  for (const auto& step : fs::directory_iterator(dir)) {
    if (!fs::exists(step.path() / "manifest.json")) return true;
    const auto m = nlohmann::json::parse(read_file(step.path() / "manifest.json"));
    std::set<std::string> named{"manifest.json"};
    for (const auto& f : m["files"]) named.insert(f["name"].get<std::string>());
    for (const auto& f : fs::directory_iterator(step.path())) {
      if (named.count(f.path().filename().string()) == 0) return true;
    }
  }
  return false;
}

// checkpoint_writer (2 ranks, sharded: threads of one process, or two
// processes under muon-launch) saves after every step and,
// after the last step, saves that step again and again; it is killed with
// SIGKILL at a random moment 50 times, resuming each time from what it
// left. After every kill the newest complete checkpoint loads, is never
// older than the one before the kill, and holds exactly the state of an
// uninterrupted run at its step.
TEST(CheckpointKill, ThePreviousCheckpointSurvivesKillsAtRandomMoments) {
  const auto dir = fresh_dir("kill");
  const std::string writer = MUON_CHECKPOINT_WRITER_EXE;
  constexpr int64_t kSteps = 12;
  // 1M more elements (12 MB with their AdamW state): writing the files is
  // most of a save, so most kills land inside one.
  constexpr int64_t kExtra = int64_t{1} << 20;
  {
    muon::test::Child ref({writer, (dir / "ref").string(), "2", "sharded", std::to_string(kSteps), "--keep", "100",
                           "--extra", std::to_string(kExtra)});
    ASSERT_EQ(ref.wait(120), 0) << ref.err();
  }
  std::vector<std::vector<at::Tensor>> expected(kSteps + 1);
  muon::test::run_ranks(1, [&](Group& group) {
    for (int64_t s = 1; s <= kSteps; ++s) {
      Rank r("none", group, "muon", kExtra);
      char name[32];
      std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(s));
      r.load((dir / "ref" / name).string());
      expected[static_cast<size_t>(s)] = snapshot(r);
    }
  });
  std::mt19937_64 rng(99);
  int64_t newest = 0;
  int loaded = 0;
  int during_saves = 0;
  int interrupted = 0;
  constexpr int kKills = 50;
  for (int i = 0; i < kKills; ++i) {
    // Even kills: the ranks are threads of one process; odd: two processes
    // under muon-launch (killed with it: its ranks die with their parent).
    std::vector<std::string> args{writer, (dir / "run").string(), "2", "sharded", std::to_string(kSteps), "--forever",
                                  "--extra", std::to_string(kExtra)};
    if (i % 2 == 1) args.insert(args.begin(), {MUON_LAUNCH_EXE, "-n", "2", "--"});
    muon::test::Child child(args);
    // A quarter of the kills at a random moment from the start (loading,
    // training, saving), the rest a random moment after a save finished
    // (inside the next ones).
    const bool after_save = i % 4 != 0;
    const double delay = static_cast<double>(rng() % 1000) / 1000.0 * (after_save ? 0.04 : 0.6);
    if (after_save) {
      child.read_until([&]() { return child.out().find("saved") != std::string::npos; }, 60);
    }
    // Sleep rather than wait for output: kills timed by output would all
    // land just after a save.
    std::this_thread::sleep_for(std::chrono::duration<double>(after_save ? delay : std::max(0.0, delay - child.seconds())));
    if (child.out().find("saved") != std::string::npos) ++during_saves;
    kill(child.pid(), SIGKILL);
    EXPECT_EQ(child.wait(30), 128 + SIGKILL) << child.err();
    ASSERT_TRUE(writers_gone(writer, 10)) << "kill " << i << ": a writer process survived";
    if (save_interrupted(dir / "run")) ++interrupted;
    const auto latest = muon::distributed::latest_checkpoint((dir / "run").string());
    if (!latest.has_value()) {
      EXPECT_EQ(newest, 0) << "kill " << i << ": the checkpoints are gone";
      continue;
    }
    EXPECT_GE(latest->step, newest) << "kill " << i << ": the newest checkpoint went back";
    newest = latest->step;
    muon::test::run_ranks(1, [&](Group& group) {
      Rank r("none", group, "muon", kExtra);
      EXPECT_EQ(r.load((dir / "run").string()).step, newest) << "kill " << i;
      EXPECT_TRUE(same(expected[static_cast<size_t>(newest)], snapshot(r)))
          << "kill " << i << ": step " << newest << " differs from the uninterrupted run";
    });
    ++loaded;
  }
  EXPECT_EQ(newest, kSteps);
  EXPECT_GE(loaded, kKills - 5);
  EXPECT_GE(during_saves, kKills / 2);
  // Kills that left files of an unfinished save (seen here: 32 of 50; the
  // rest landed before a save's first file, after its clean-up, or outside
  // saves). The floor leaves room for slower or faster disks.
  EXPECT_GE(interrupted, 10);
  std::printf("kills: %d, loaded after %d, %d inside a save (files of an uncommitted save left), newest step %lld\n",
              kKills, loaded, interrupted, static_cast<long long>(newest));
  fs::remove_all(dir);
}

}  // namespace
