// muon::detail::align_blas_threads (src/util/threads.h): the BLAS pool
// follows LibTorch's intra-op count unless the user chose its size. Each case
// runs tests/distributed/env_check.cpp as a fresh process whose environment the test
// sets, since OpenBLAS reads its variables when it is loaded.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "process_util.h"

namespace muon::test {
namespace {

const std::string kEnvCheck = MUON_ENV_CHECK_EXE;

// No thread variable at all: the libraries and LibTorch size themselves.
EnvChanges without_thread_variables() {
  EnvChanges env;
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                           "MKL_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                           "LOCAL_WORLD_SIZE", "MUON_TIMEOUT"}) {
    env[name] = std::nullopt;
  }
  return env;
}

// The lines env_check printed, after the status check.
std::vector<std::string> run_env_check(const std::vector<std::string>& args, const EnvChanges& env) {
  std::vector<std::string> argv{kEnvCheck};
  argv.insert(argv.end(), args.begin(), args.end());
  Child child(argv, env);
  const int status = child.wait(120);
  EXPECT_EQ(status, 0) << child.out() << child.err();
  return lines_of(child.out());
}

bool has_line(const std::vector<std::string>& lines, const std::string& start, const std::string& part) {
  for (const auto& line : lines) {
    if (line.rfind(start, 0) == 0 && line.find(part) != std::string::npos) return true;
  }
  return false;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

TEST(AlignBlasThreads, BlasPoolFollowsLibTorchsCount) {
  // 3 then 1: up and down, whatever the machine's core count (OpenBLAS
  // starts with one thread per core), and the remembered count is updated.
  const auto lines = run_env_check({"--torch-threads", "3", "--align", "--torch-threads", "1",
                                    "--align", "--align"},
                                   without_thread_variables());
  if (has_line(lines, "start", "blas=none")) GTEST_SKIP() << "OpenBLAS not loaded";
  ASSERT_EQ(lines.size(), 6u) << joined(lines);
  EXPECT_NE(lines[2].find("torch=3 blas=3"), std::string::npos) << joined(lines);
  EXPECT_NE(lines[4].find("torch=1 blas=1"), std::string::npos) << joined(lines);
  EXPECT_NE(lines[5].find("torch=1 blas=1"), std::string::npos) << joined(lines);
}

TEST(AlignBlasThreads, KeepsTheCountTheUserChose) {
  for (const char* name : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"}) {
    auto env = without_thread_variables();
    env[name] = "1";
    // LibTorch at 2 threads; OpenBLAS stays at the user's 1.
    const auto lines = run_env_check({"--torch-threads", "2", "--align"}, env);
    if (has_line(lines, "start", "blas=none")) GTEST_SKIP() << "OpenBLAS not loaded";
    EXPECT_TRUE(has_line(lines, "start", "blas=1")) << name << "\n" << joined(lines);
    EXPECT_TRUE(has_line(lines, "aligned", "torch=2 blas=1")) << name << "\n" << joined(lines);
  }
}

TEST(AlignBlasThreads, InitFromEnvAligns) {
  auto env = without_thread_variables();
  env["WORLD_SIZE"] = "1";
  env["RANK"] = "0";
  const auto lines = run_env_check({"--torch-threads", "3", "--join"}, env);
  if (has_line(lines, "start", "blas=none")) GTEST_SKIP() << "OpenBLAS not loaded";
  EXPECT_TRUE(has_line(lines, "joined rank 0 of 1", "torch=3 blas=3")) << joined(lines);
}

}  // namespace
}  // namespace muon::test
