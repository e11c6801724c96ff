// init_from_env when the rendezvous fails: a lone rank, an address nobody
// listens on, a bad MUON_TIMEOUT. The wait is the group's timeout (or
// MUON_TIMEOUT), and its expiry is one line naming the rank, the address and
// what to check, without a C++ backtrace.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "env_util.h"
#include "expect_util.h"
#include "muon/distributed/runtime/group.h"

namespace muon::test {
namespace {



struct Failure {
  std::string what;                    // what(): what a program that prints the error shows
  std::string what_without_backtrace;
  bool value_error = false;
  double seconds = 0;
};

Failure join_and_fail(const std::vector<std::pair<std::string, std::string>>& vars,
                      const distributed::GroupOptions& options) {
  ScopedRendezvousEnv env(vars);
  Failure f;
  const auto start = std::chrono::steady_clock::now();
  try {
    distributed::init_from_env(options);
    ADD_FAILURE() << "init_from_env returned";
  } catch (const c10::Error& e) {
    f.what = e.what();
    f.what_without_backtrace = e.what_without_backtrace();
    f.value_error = dynamic_cast<const c10::ValueError*>(&e) != nullptr;
  }
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return f;
}

// One line: no newline but (c10's) one at the very end.
void expect_one_line(const Failure& f) {
  EXPECT_EQ(f.what_without_backtrace.find('\n'), std::string::npos) << f.what_without_backtrace;
  const auto nl = f.what.find('\n');
  EXPECT_TRUE(nl == std::string::npos || nl + 1 == f.what.size()) << f.what;
  EXPECT_LT(f.what.size(), 1000u) << f.what;
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

constexpr auto kTwoSeconds = std::chrono::seconds(2);
// The wait ends at the timeout; the slack covers process scheduling on a
// busy machine and the store's retry interval (about 1 s), not a second wait.
constexpr double kSlackSeconds = 8;

// A timeout of the 2 s wait: not a c10::ValueError (nothing was invalid),
// one line, and not a second wait.
void expect_two_second_timeout(const Failure& f) {
  EXPECT_FALSE(f.value_error);
  expect_one_line(f);
  EXPECT_LT(f.seconds, 2 + kSlackSeconds);
}

// The variables of rank `rank` of 2 with its store at 127.0.0.1:`port`.
std::vector<std::pair<std::string, std::string>> local_rank_of_two(const std::string& rank,
                                                                   const std::string& port) {
  return {{"WORLD_SIZE", "2"}, {"RANK", rank}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}};
}

// Rank `rank` of 2 started alone with a 2 s timeout, its store on a free
// local port: its failure, checked as a 2 s timeout, and the port.
std::pair<Failure, std::string> lone_rank(const std::string& rank) {
  const auto port = std::to_string(free_port());
  auto f = join_and_fail(local_rank_of_two(rank, port), distributed::GroupOptions().timeout(kTwoSeconds));
  expect_two_second_timeout(f);
  return {f, port};
}

TEST(DistRendezvous, LoneClientRankFailsAfterTheTimeoutInOneLine) {
  // WORLD_SIZE=2, only rank 1 started: no store to connect to.
  const auto [f, port] = lone_rank("1");
  expect_contains(f.what, "[muon::distributed::init_from_env] rank 1 of 2 waited 2 s for the store at "
                          "MASTER_ADDR:MASTER_PORT = 127.0.0.1:" + port);
  expect_contains(f.what, "check that every rank started and MASTER_ADDR is reachable");
}

TEST(DistRendezvous, LoneServerRankFailsAfterTheTimeoutInOneLine) {
  // Only rank 0 started: it hosts the store and waits for rank 1 to join the group.
  const auto [f, port] = lone_rank("0");
  expect_contains(f.what, "[muon::distributed::init_from_env] rank 0 of 2 waited 2 s for the other "
                          "ranks at MASTER_ADDR:MASTER_PORT = 127.0.0.1:" + port);
  expect_contains(f.what, "check that every rank started");
  EXPECT_GE(f.seconds, 1.5);  // it did wait for the others
}

TEST(DistRendezvous, UnreachableMasterAddrFailsAfterTheTimeoutInOneLine) {
  // 192.0.2.1: TEST-NET-1 (RFC 5737), never assigned to a host.
  const auto f = join_and_fail({{"WORLD_SIZE", "2"},
                                {"RANK", "1"},
                                {"MASTER_ADDR", "192.0.2.1"},
                                {"MASTER_PORT", "29500"}},
                               distributed::GroupOptions().timeout(kTwoSeconds));
  expect_two_second_timeout(f);
  expect_contains(f.what, "rank 1 of 2 waited 2 s for the store at MASTER_ADDR:MASTER_PORT = "
                          "192.0.2.1:29500");
}

TEST(DistRendezvous, MuonTimeoutSetsTheWaitWhenTheProgramSetsNone) {
  const auto port = std::to_string(free_port());
  auto vars = local_rank_of_two("0", port);
  vars.emplace_back("MUON_TIMEOUT", "2");
  const auto f = join_and_fail(vars, distributed::GroupOptions());
  expect_two_second_timeout(f);
  expect_contains(f.what, "rank 0 of 2 waited 2 s");
}

TEST(DistRendezvous, BadMuonTimeoutRaisesNamingIt) {
  for (const std::string text : {"soon", "0", "-1", "nan", "1e9"}) {
    expect_value_error(
        [&] {
          ScopedRendezvousEnv env({{"WORLD_SIZE", "1"}, {"RANK", "0"}, {"MUON_TIMEOUT", text}});
          distributed::init_from_env();
        },
        {"[muon::distributed::init_from_env] MUON_TIMEOUT must be a number of seconds", "'" + text + "'"});
  }
  // A long value is clipped in the message.
  const std::string huge(100000, '7');
  try {
    ScopedRendezvousEnv env({{"WORLD_SIZE", "1"}, {"RANK", "0"}, {"MUON_TIMEOUT", huge}});
    distributed::init_from_env();
    ADD_FAILURE() << "no exception";
  } catch (const c10::ValueError& e) {
    EXPECT_LT(std::string(e.what_without_backtrace()).size(), 500u);
  }
}

TEST(DistRendezvous, UseLibuvMustBeZeroOrOne) {
  // torch's USE_LIBUV picks the TCPStore backend; anything but 0 or 1 is an
  // error before any socket is opened.
  const auto port = std::to_string(free_port());
  for (const std::string text : {"yes", "", "2"}) {
    expect_value_error(
        [&] {
          ScopedRendezvousEnv env({{"WORLD_SIZE", "2"},
                                   {"RANK", "0"},
                                   {"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", port},
                                   {"USE_LIBUV", text}});
          distributed::init_from_env(distributed::GroupOptions().timeout(kTwoSeconds));
        },
        {"[muon::distributed::init_from_env] USE_LIBUV must be 0 or 1", "'" + text + "'"});
  }
}

TEST(DistRendezvous, ClassicStoreWithUseLibuvZero) {
  // USE_LIBUV=0 asks for the classic backend, which every LibTorch has: a
  // lone server rank gets as far as waiting for the others.
  const auto port = std::to_string(free_port());
  const auto f = join_and_fail({{"WORLD_SIZE", "2"},
                                {"RANK", "0"},
                                {"MASTER_ADDR", "127.0.0.1"},
                                {"MASTER_PORT", port},
                                {"USE_LIBUV", "0"}},
                               distributed::GroupOptions().timeout(kTwoSeconds));
  expect_contains(f.what, "rank 0 of 2 waited 2 s for the other ranks");
}

}  // namespace
}  // namespace muon::test
