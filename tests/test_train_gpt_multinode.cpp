// muon-train-gpt beyond one machine, with real processes on this host run
// as several machines run them: each node is a process tree of its own (an
// agent in its own session and the ranks it starts), the nodes meet
// through torchrun's c10d rendezvous (or muon-launch's static one) over
// TCP, and a node "dies" by SIGKILL of its whole tree.
//
// - two torchrun agents (--nnodes 2 --nproc_per_node 2) train the curve of
//   one process, in every layout; so do two muon-launch --nnodes 2;
// - a rank killed under torchrun --max-restarts makes the group restart,
//   and --resume auto continues from the newest complete checkpoint to the
//   uninterrupted curve;
// - a node killed under --nnodes 1:2 leaves one node, which restarts at
//   the smaller world size from the checkpoint the larger one wrote.
//
// torchrun is `python3 -m muon_cpp.torchrun` (the package in the build
// tree): torchrun with the same arguments, which also starts jobs where
// torch was built without libuv (Debian 13's 2.6) and works around
// Debian 12's torchrun 1.13 on Python 3.11.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "muon/distributed/checkpoints/checkpoint.h"
#include "env_util.h"
#include "process_tree_util.h"
#include "report.h"
#include "train_gpt_curve_util.h"
#include "train_gpt_util.h"

namespace fs = std::filesystem;
using muon::test::free_port;
using muon::test::Tree;
using train_gpt_test::largest_difference;
using train_gpt_test::run_program;
using train_gpt_test::scratch;

namespace {

// The model and budget of the layout tests (test_train_gpt_layouts.cpp):
// seconds per run, 4 heads so that tensor parallelism runs at 4 ranks.
const std::string kTiny =
    "--layers 1 --width 32 --heads 4 --context 32 --batch 8 --chars 60000 --eval-every 5 "
    "--eval-windows 16 --no-progress --no-plot --threads 1 --timeout 60 --runs muon";

// As in test_train_gpt_layouts.cpp: a layout (or another world size)
// changes only the order of fp32 sums, each within a few units of rounding;
// over tens of steps training keeps such differences below 1e-4 relative,
// while a wrong update (a rank's batch lost or counted twice, a missed
// reduction) moves the loss by more than 1e-2 within a few steps.
constexpr double kCurveTolerance = 1e-4;

// The same ranks, layout and batches resuming from a checkpoint redo the
// same arithmetic in the same order (gloo's ring sums in a fixed order):
// the loaded state is the saved one bit for bit, so the resumed curve is
// the uninterrupted one up to the text of the CSV (9 significant digits,
// 5e-9 relative); 1e-7 allows a unit of fp32 rounding and nothing more.
constexpr double kSameWorldTolerance = 1e-7;

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool have_torchrun() { return std::string(MUON_PYTHON_EXE).size() > 0; }

// torchrun as a node runs it: an agent for `nproc` local ranks of
// muon-train-gpt with `args`, meeting the others at the c10d rendezvous
// `port` on this host. `agent` adds the agent's own flags.
std::vector<std::string> torchrun(int port, const std::string& nnodes, int nproc,
                                  const std::string& agent, const std::string& args) {
  std::vector<std::string> cmd{MUON_PYTHON_EXE, "-m", "muon_cpp.torchrun"};
  for (const auto& w : words("--nnodes " + nnodes + " --nproc_per_node " + std::to_string(nproc) +
                             " --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:" + std::to_string(port) +
                             " --rdzv_id muon_test --monitor_interval 1 " + agent + " --no_python")) {
    cmd.push_back(w);
  }
  cmd.push_back(MUON_TRAIN_GPT_BIN);
  for (const auto& w : words(args)) cmd.push_back(w);
  return cmd;
}

const muon::test::EnvChanges kTorchrunEnv{{"PYTHONPATH", MUON_PYTHON_PATH}};

// One process's curve of `steps` steps (the reference).
train_gpt::RunLog one_process(const fs::path& dir, int steps) {
  const auto out = dir / "one";
  const auto o = run_program(kTiny + " --steps " + std::to_string(steps) + " --nproc 1 --out " +
                             out.string());
  EXPECT_EQ(o.status, 0) << o.text;
  return train_gpt::read_csv((out / "muon.csv").string());
}

// The step of the newest complete checkpoint in `dir` (-1: none).
int64_t newest_step(const fs::path& dir) {
  const auto info = muon::distributed::latest_checkpoint(dir.string());
  return info ? info->step : -1;
}

// Waits until `dir` holds a complete checkpoint, at most `limit_s`.
int64_t wait_for_checkpoint(const fs::path& dir, double limit_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (std::chrono::steady_clock::now() < until) {
    if (const auto step = newest_step(dir); step > 0) return step;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

// The job of the restart tests: `steps` steps, a checkpoint every 10 under
// `save`, --resume auto, the curve in `out`; `extra` adds flags.
std::string restartable(int steps, const fs::path& save, const fs::path& out,
                        const std::string& extra = "") {
  return kTiny + " --steps " + std::to_string(steps) + " --save-every 10 --save " + save.string() +
         " --resume auto --out " + out.string() + " " + extra;
}

// The curve a restarted run wrote in `out` (muon.csv) is within `tolerance`
// of `reference`; prints "<killed> after checkpoint <saved>, <continued>
// from step <from>: <difference> from <against>".
void expect_restart_on_curve(const fs::path& out, const train_gpt::RunLog& reference,
                             double tolerance, const std::string& killed, int64_t saved,
                             const std::string& continued, int64_t from,
                             const std::string& against) {
  const double d = largest_difference(train_gpt::read_csv((out / "muon.csv").string()), reference);
  std::printf("%s after checkpoint %lld, %s from step %lld: %.2e from %s\n", killed.c_str(),
              static_cast<long long>(saved), continued.c_str(), static_cast<long long>(from), d,
              against.c_str());
  EXPECT_LE(d, tolerance);
}

// The step rank 0's first "--resume auto: continuing from step N" line of
// `text` names; checked to be at or after the checkpoint `saved` that was
// complete when the rank or node died, and before the run's end (a kill
// after the end would test no restart).
int64_t continued_from(const std::string& text, int64_t saved, int steps) {
  const std::string key = "--resume auto: continuing from step ";
  const auto at = text.find(key);
  const int64_t from = at == std::string::npos ? -1 : std::stoll(text.substr(at + key.size()));
  EXPECT_GE(from, saved) << text;
  EXPECT_LT(from, steps) << "killed after the run ended; the test needs a longer run\n" << text;
  return from;
}

}  // namespace

TEST(TrainGptMultiNode, TwoTorchrunAgentsGiveTheOneProcessCurveInEveryLayout) {
  if (!have_torchrun()) GTEST_SKIP() << "no Python package: python3 -m muon_cpp.torchrun";
  const auto dir = scratch("two_agents");
  const auto one = one_process(dir, 20);
  ASSERT_FALSE(one.points.empty());
  struct Layout {
    std::string name;
    std::string flags;
  };
  const std::vector<Layout> layouts{{"ddp", "--parallel ddp"},
                                    {"ddp-replicated", "--parallel ddp --optimizer-layout replicated"},
                                    {"sharded", "--parallel sharded"},
                                    {"tp", "--parallel tp"},
                                    {"tp2", "--parallel tp --tp 2"},
                                    {"tp2-sharded", "--parallel tp,sharded --tp 2"}};
  for (const auto& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const auto out = dir / layout.name;
    const int port = free_port();
    const std::string args = kTiny + " --steps 20 " + layout.flags + " --out " + out.string();
    Tree a(torchrun(port, "2", 2, "", args), (dir / (layout.name + "_a.log")).string(), kTorchrunEnv);
    Tree b(torchrun(port, "2", 2, "", args), (dir / (layout.name + "_b.log")).string(), kTorchrunEnv);
    const int status_a = a.wait(300);
    const int status_b = b.wait(300);
    ASSERT_EQ(status_a, 0) << a.output() << "\n---- node b ----\n" << b.output();
    ASSERT_EQ(status_b, 0) << b.output();
    const auto both = a.output() + b.output();
    EXPECT_NE(both.find("4 rank(s)"), std::string::npos) << both;
    const double d = largest_difference(train_gpt::read_csv((out / "muon.csv").string()), one);
    std::printf("%-16s 2 nodes x 2 ranks vs one process: %.2e (largest relative loss difference)\n",
                layout.name.c_str(), d);
    EXPECT_LE(d, kCurveTolerance);
  }
  fs::remove_all(dir);
}

TEST(TrainGptMultiNode, TwoMuonLaunchNodesGiveTheOneProcessCurve) {
  const auto dir = scratch("two_launchers");
  const auto one = one_process(dir, 20);
  ASSERT_FALSE(one.points.empty());
  const int port = free_port();
  const auto out = dir / "two_nodes";
  auto node = [&](int rank) {
    std::vector<std::string> cmd{MUON_LAUNCH_EXE, "-n", "2", "--nnodes", "2", "--node-rank",
                                 std::to_string(rank), "--master-addr", "127.0.0.1", "--master-port",
                                 std::to_string(port), "--", MUON_TRAIN_GPT_BIN};
    for (const auto& w : words(kTiny + " --steps 20 --parallel sharded --out " + out.string())) {
      cmd.push_back(w);
    }
    return cmd;
  };
  Tree a(node(0), (dir / "node0.log").string());
  Tree b(node(1), (dir / "node1.log").string());
  ASSERT_EQ(a.wait(300), 0) << a.output() << "\n---- node 1 ----\n" << b.output();
  ASSERT_EQ(b.wait(300), 0) << b.output();
  // Node 0's first rank is global rank 0 of 4 (node 1's are 2 and 3).
  EXPECT_NE(a.output().find("[rank 0] muon-train-gpt: 4 rank(s)"), std::string::npos) << a.output();
  const double d = largest_difference(train_gpt::read_csv((out / "muon.csv").string()), one);
  std::printf("muon-launch 2 nodes x 2 ranks (sharded) vs one process: %.2e\n", d);
  EXPECT_LE(d, kCurveTolerance);
  fs::remove_all(dir);
}

TEST(TrainGptMultiNode, MuonLaunchRefusesAnIncompleteNodeSetupInOneLine) {
  const std::string launch = MUON_LAUNCH_EXE;
  for (const auto& [args, names] : std::vector<std::pair<std::string, std::string>>{
           {"-n 2 --nnodes 2 --master-addr 127.0.0.1 --master-port 29999", "--node-rank"},
           {"-n 2 --nnodes 2 --node-rank 1", "--master-addr and --master-port"},
           {"-n 2 --nnodes 2 --node-rank 2 --master-addr 127.0.0.1 --master-port 29999", "--node-rank"},
           {"-n 2 --nnodes 0 --node-rank 0", "--nnodes"}}) {
    const auto o = train_gpt_test::run_program_command(launch + " " + args + " -- /bin/true");
    EXPECT_EQ(o.status, 2) << args << "\n" << o.text;
    EXPECT_NE(o.text.find(names), std::string::npos) << args << "\n" << o.text;
    EXPECT_LE(o.text.size(), 400u) << o.text;
  }
}

TEST(TrainGptMultiNode, KilledRankRestartsFromTheNewestCheckpointOnTheUninterruptedCurve) {
  if (!have_torchrun()) GTEST_SKIP() << "no Python package: python3 -m muon_cpp.torchrun";
  const auto dir = scratch("killed_rank");
  const int steps = 60;
  // The uninterrupted run: the same 2 ranks and layout, without torchrun.
  const auto straight = dir / "straight";
  const auto o = run_program(kTiny + " --steps " + std::to_string(steps) + " --nproc 2 --out " +
                             straight.string());
  ASSERT_EQ(o.status, 0) << o.text;
  const auto uninterrupted = train_gpt::read_csv((straight / "muon.csv").string());

  const auto out = dir / "restarted";
  const auto save = dir / "save";
  const std::string args = restartable(steps, save, out);
  Tree agent(torchrun(free_port(), "1", 2, "--max_restarts 1", args), (dir / "agent.log").string(),
             kTorchrunEnv);
  // Kill a rank as soon as the first checkpoint is complete: the steps
  // after it are lost and must be recomputed.
  const int64_t saved = wait_for_checkpoint(save / "muon", 240);
  ASSERT_GT(saved, 0) << agent.output();
  const auto ranks = agent.processes(MUON_TRAIN_GPT_BIN);
  ASSERT_EQ(ranks.size(), 2u) << agent.output();
  ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  ASSERT_EQ(agent.wait(300), 0) << agent.output();
  const auto text = agent.output();
  // Attempt 0 started from step 0; attempt 1 continued from a checkpoint
  // before the end.
  EXPECT_NE(text.find("--resume auto: no checkpoint"), std::string::npos) << text;
  const auto second = text.substr(text.find("--resume auto: no checkpoint") + 1);
  const int64_t from = continued_from(second, saved, steps);
  expect_restart_on_curve(out, uninterrupted, kSameWorldTolerance, "killed rank 1", saved,
                          "continued", from, "the uninterrupted curve");
  fs::remove_all(dir);
}

TEST(TrainGptMultiNode, NodeDyingRestartsAtTheSmallerWorldOnTheSameCurve) {
  if (!have_torchrun()) GTEST_SKIP() << "no Python package: python3 -m muon_cpp.torchrun";
  const auto dir = scratch("node_dies");
  const int steps = 60;
  const auto one = one_process(dir, steps);
  ASSERT_FALSE(one.points.empty());
  const auto out = dir / "elastic";
  const auto save = dir / "save";
  const std::string args = restartable(steps, save, out, "--parallel sharded");
  const int port = free_port();
  // Node a hosts the rendezvous (its agent keeps the store), node b dies.
  // Between 1 and 2 nodes: after b is gone, a waits last_call_timeout for
  // more and goes on alone.
  const std::string elastic = "--max_restarts 2 --rdzv_conf last_call_timeout=5,is_host=";
  Tree b(torchrun(port, "1:2", 2, elastic + "0", args), (dir / "b.log").string(), kTorchrunEnv);
  Tree a(torchrun(port, "1:2", 2, elastic + "1", args), (dir / "a.log").string(), kTorchrunEnv);
  const int64_t saved = wait_for_checkpoint(save / "muon", 240);
  ASSERT_GT(saved, 0) << a.output() << "\n---- node b ----\n" << b.output();
  b.kill_all();
  ASSERT_EQ(a.wait(400), 0) << a.output() << "\n---- node b ----\n" << b.output();
  const auto text = a.output() + b.output();
  // The first attempt ran at 4 ranks; the one after the node died at 2,
  // from a checkpoint the 4 ranks wrote.
  EXPECT_NE(text.find("muon-train-gpt: 4 rank(s)"), std::string::npos) << text;
  EXPECT_NE(a.output().find("muon-train-gpt: 2 rank(s)"), std::string::npos) << a.output();
  const int64_t from = continued_from(a.output(), saved, steps);
  EXPECT_NE(a.output().find("written by 4 ranks"), std::string::npos) << a.output();
  expect_restart_on_curve(out, one, kCurveTolerance, "node of 2 ranks killed", saved,
                          "2 ranks continued", from, "one process");
  fs::remove_all(dir);
}
