// muon-launch and torchrun --no-python running a 2-rank program as real
// processes (tests/dist/allreduce_check.cpp) over Gloo.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Result {
  int status = -1;  // exit code, 128 + signal, or -1 when the test had to kill it
  std::string out;
  std::string err;
  double seconds = 0;
};

// Runs `args` with stdout and stderr captured; kills it after `limit_s`.
// `signal_after_s` > 0: sends `sig` to the process at that time.
Result run(const std::vector<std::string>& args, double limit_s = 120, double signal_after_s = 0,
           int sig = SIGTERM) {
  int out[2];
  int err[2];
  EXPECT_EQ(pipe(out), 0);
  EXPECT_EQ(pipe(err), 0);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    close(out[0]);
    close(err[0]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  Result result;
  std::string* sinks[2] = {&result.out, &result.err};
  int fds[2] = {out[0], err[0]};
  bool signalled = false;
  bool killed = false;
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (fds[0] >= 0 || fds[1] >= 0) {
    if (signal_after_s > 0 && !signalled && elapsed() >= signal_after_s) {
      kill(pid, sig);
      signalled = true;
    }
    if (elapsed() > limit_s && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    std::vector<pollfd> p;
    for (const int fd : fds) {
      if (fd >= 0) p.push_back(pollfd{fd, POLLIN, 0});
    }
    if (poll(p.data(), p.size(), 50) <= 0) continue;
    for (int k = 0; k < 2; ++k) {
      if (fds[k] < 0) continue;
      for (const auto& q : p) {
        if (q.fd != fds[k] || (q.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        char buf[4096];
        const ssize_t n = read(fds[k], buf, sizeof(buf));
        if (n > 0) {
          sinks[k]->append(buf, static_cast<size_t>(n));
        } else {
          close(fds[k]);
          fds[k] = -1;
        }
      }
    }
  }
  int st = 0;
  waitpid(pid, &st, 0);
  result.seconds = elapsed();
  result.status = killed ? -1 : (WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  return result;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) result.push_back(line);
  }
  return result;
}

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

const std::string kLaunch = MUON_LAUNCH_EXE;
const std::string kProgram = MUON_ALLREDUCE_CHECK_EXE;

TEST(MuonLaunch, RunsTwoRanksWithPrefixedOutput) {
  const auto r = run({kLaunch, "-n", "2", "--", kProgram});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[rank 0] rank 0 of 2: all_reduce ok (sum 3)\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 1] rank 1 of 2: all_reduce ok (sum 3)\n")) << r.out;
  EXPECT_TRUE(contains(r.err, "[rank 1] rank 1 of 2: joined (stderr; agent store: False)\n"))
      << r.err;
  for (const auto& line : lines(r.out)) EXPECT_EQ(line.rfind("[rank ", 0), 0u) << line;
}

TEST(MuonLaunch, TensorParallelMuonAcrossProcessesMatchesOneProcess) {
  // Three processes, uneven blocks (25 rows: 9, 8, 8), both partition dims.
  for (const std::string mode : {"duplicated", "distributed"}) {
    const auto r = run({kLaunch, "-n", "3", "--", MUON_TP_MUON_CHECK_EXE, mode});
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    for (int rank = 0; rank < 3; ++rank) {
      const std::string tag = "[rank " + std::to_string(rank) + "] rank " +
                              std::to_string(rank) + " of 3: tp " + mode + " max rel err ";
      EXPECT_TRUE(contains(r.out, tag)) << r.out;
    }
    EXPECT_FALSE(contains(r.out, "FAILED")) << r.out;
  }
}

TEST(MuonLaunch, FailingRankStopsTheOthersAndSetsTheExitCode) {
  // Rank 1 exits with 3 before the all-reduce; rank 0 would wait 60 s in it.
  const auto r = run({kLaunch, "-n", "2", "--grace", "2", "--", kProgram, "--fail-rank", "1",
                      "--exit-code", "3"});
  EXPECT_EQ(r.status, 3) << r.out << r.err;
  EXPECT_LT(r.seconds, 15.0) << "rank 0 was not stopped";
  EXPECT_TRUE(contains(r.out, "[rank 1] rank 1 failing on purpose with status 3")) << r.out;
  EXPECT_FALSE(contains(r.out, "all_reduce ok")) << r.out;
  EXPECT_TRUE(contains(r.err, "muon-launch: rank 1 exited with status 3")) << r.err;
}

TEST(MuonLaunch, ForwardsSigtermToEveryRank) {
  // The ranks sleep 30 s; SIGTERM to the launcher after 1 s ends them all.
  const auto r = run({kLaunch, "-n", "2", "--", kProgram, "--sleep", "30"}, 60, 1.0, SIGTERM);
  EXPECT_EQ(r.status, 128 + SIGTERM) << r.out << r.err;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(contains(r.err, "forwarding to every rank")) << r.err;
}

TEST(MuonLaunch, BadUsageExitsWithTwo) {
  EXPECT_EQ(run({kLaunch, "--", kProgram}).status, 2);
  EXPECT_EQ(run({kLaunch, "-n", "0", "--", kProgram}).status, 2);
  EXPECT_EQ(run({kLaunch, "-n", "2"}).status, 2);
  const auto r = run({kLaunch, "-n", "2", "--master-port", "99999", "--", kProgram});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "--master-port must be an integer in [1, 65535], got '99999'")) << r.err;
}

TEST(Torchrun, RunsTheSameProgramWithNoPython) {
  const std::string torchrun = MUON_TORCHRUN_EXE;
  if (torchrun.empty()) GTEST_SKIP() << "torchrun not found at configure time";
  // "--no_python": the spelling of torchrun 1.13 (2.x accepts it and "--no-python").
  // "--redirects/--tee 0:1,1:1" (stdout to a log, copied to the console)
  // works around Debian's torchrun 1.13 on Python 3.11, whose default "0"
  // ("no redirect") parses to None there and crashes the agent.
  const auto r = run({torchrun, "--no_python", "--nproc_per_node", "2", "--master_port",
                      std::to_string(free_port()), "--redirects", "0:1,1:1", "--tee", "0:1,1:1",
                      kProgram});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  // torchrun's agent hosts the store: every rank connected as a client.
  EXPECT_TRUE(contains(r.err, "rank 1 of 2: joined (stderr; agent store: True)")) << r.err;
  EXPECT_TRUE(contains(r.out, "rank 0 of 2: all_reduce ok (sum 3)")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 1 of 2: all_reduce ok (sum 3)")) << r.out;
}

}  // namespace
