// checkpoint_writer: trains the checkpoint tests' model (tests/checkpoint_model.h)
// on WORLD thread ranks in LAYOUT and saves a checkpoint after every step,
// resuming from the newest complete checkpoint in DIR when there is one.
//
//   checkpoint_writer DIR WORLD LAYOUT STEPS [--keep K] [--forever] [--dump PREFIX] [--extra N]
//
// Under a launcher (muon-launch -n WORLD, torchrun) each process is one rank;
// otherwise the WORLD ranks are threads of this process.
// LAYOUT: none | layerwise | sharded | tp | 2d. Rank 0 prints "saved <step>"
// after each save. --forever: after STEPS, keeps saving step STEPS again
// until killed (the kill-loop test kills it at random moments). --dump:
// after the last save, each rank writes PREFIX.rank<r>.json with its part
// of every parameter and state field (values as text, and the first row
// of the part in the whole tensor) for the Python reader's test. --extra N:
// the model has a vector of N more elements (tests/checkpoint_model.h).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "checkpoint_model.h"
#include "distributed/checkpoints/checkpoint_state.h"
#include "muon/distributed/runtime/group.h"

namespace {

using namespace muon::test::checkpoint;  // NOLINT(google-build-using-namespace): the tests' model

void dump_tensor(std::ofstream& out, bool& first, const std::string& key, const at::Tensor& t, int64_t row) {
  const auto v = t.detach().to(at::kDouble).contiguous();
  out << (first ? "" : ",\n") << "\"" << key << "\": {\"row_offset\": " << row << ", \"shape\": [";
  for (int64_t d = 0; d < v.dim(); ++d) out << (d ? ", " : "") << v.size(d);
  out << "], \"values\": [";
  const auto* p = v.data_ptr<double>();
  char buf[40];
  for (int64_t i = 0; i < v.numel(); ++i) {
    std::snprintf(buf, sizeof(buf), "%.17g", p[i]);
    out << (i ? ", " : "") << buf;
  }
  out << "]}";
  first = false;
}

void dump(Rank& r, const std::string& kind, const Group& group, const std::string& prefix) {
  std::ofstream out(prefix + ".rank" + std::to_string(group.rank()) + ".json");
  out << "{\n";
  bool first = true;
  std::map<std::string, int64_t> rows;
  for (size_t k = 0; k < kModel.size(); ++k) {
    const auto& [name, shape] = kModel[k];
    const auto sizes = muon::distributed::balanced_split_sizes(shape[0], group.size());
    rows[name] = kind == "sharded" ? muon::distributed::split_offset(sizes, group.rank()) : 0;
    dump_tensor(out, first, "model/" + name, r.named[name], rows[name]);
  }
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : r.named) names[item.value().unsafeGetTensorImpl()] = item.key();
  for (const auto& slot : muon::distributed::detail::state_slots(*r.opt)) {
    const auto& name = names.at(slot.param.unsafeGetTensorImpl());
    auto* state = muon::distributed::detail::find_state(slot);
    if (state == nullptr) continue;
    for (const auto& f : muon::distributed::detail::state_fields(slot, *state)) {
      const auto key = "optim/" + name + "/" + f.name;
      if (f.integer != nullptr) {
        dump_tensor(out, first, key, at::full({}, *f.integer, at::kLong), 0);
      } else if (f.tensor->defined()) {
        dump_tensor(out, first, key, *f.tensor, rows[name]);
      }
    }
  }
  out << "\n}\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: checkpoint_writer DIR WORLD LAYOUT STEPS [--keep K] [--forever] [--dump PREFIX] [--extra N]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int world = std::atoi(argv[2]);
  const std::string kind = argv[3];
  const int64_t steps = std::atoll(argv[4]);
  int64_t keep = 2;
  bool forever = false;
  std::string dump_prefix;
  int64_t extra = 0;
  for (int i = 5; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--keep" && i + 1 < argc) {
      keep = std::atoll(argv[++i]);
    } else if (a == "--forever") {
      forever = true;
    } else if (a == "--extra" && i + 1 < argc) {
      extra = std::atoll(argv[++i]);
    } else if (a == "--dump" && i + 1 < argc) {
      dump_prefix = argv[++i];
    } else {
      std::fprintf(stderr, "checkpoint_writer: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  auto body = [&](Group& group) {
    Rank r(kind, group, "muon", extra);
    int64_t start = 0;
    if (muon::distributed::latest_checkpoint(dir).has_value()) start = r.load(dir).step;
    for (int64_t s = start; s < steps || forever; ++s) {
      if (s < steps) r.train(s, s + 1);
      const auto step = std::min(s + 1, steps);
      r.save(dir, step, keep);
      if (group.rank() == 0) {
        std::printf("saved %lld\n", static_cast<long long>(step));
        std::fflush(stdout);
      }
    }
    if (!dump_prefix.empty()) dump(r, kind, group, dump_prefix);
  };
  // Under a launcher (RANK set): one rank per process, WORLD must match.
  // Otherwise WORLD thread ranks in this process.
  muon::test::RankErrors errors;
  if (std::getenv("RANK") != nullptr) {
    try {
      auto group = muon::distributed::init_from_env();
      if (group.size() != world) {
        std::fprintf(stderr, "checkpoint_writer: WORLD %d, but the launcher started %d ranks\n", world, group.size());
        return 2;
      }
      body(group);
    } catch (const c10::Error& e) {
      errors.push_back(e.what_without_backtrace());
    }
  } else {
    errors = muon::test::run_ranks_collect(world, body);
  }
  int status = 0;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    std::fprintf(stderr, "checkpoint_writer: rank %zu: %s\n", r, errors[r].c_str());
    status = 1;
  }
  return status;
}
