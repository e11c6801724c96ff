// muon-launch: runs N local ranks of a program with torchrun's environment.
//
//   muon-launch -n N [--master-port P] [--master-addr A] [--grace S] -- program args...
//   muon-launch -n N --nnodes M --node-rank K --master-addr A --master-port P -- program args...
//
// Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT=0 and TORCHELASTIC_USE_AGENT_STORE=False (rank
// 0 hosts the store, as in muon::distributed::init_from_env). Every line a rank
// writes is prefixed with "[rank N] " (stdout to stdout, stderr to stderr).
//
// Several machines (torchrun's static rendezvous, --nnodes M --node_rank K):
// run one muon-launch on each of M nodes with the same -n, --nnodes,
// --master-addr (an address of node 0 that every node reaches) and
// --master-port (free on node 0), and --node-rank 0..M-1. Node K's local
// rank r is global rank K*N + r of M*N (GROUP_RANK = K). Each launcher
// stops only its own ranks; the ranks of the other nodes see their peers
// fail and exit in turn. For restarts after a failure (a node dying), use
// torchrun's c10d rendezvous with --max-restarts (docs/train_gpt.md).
// SIGINT, SIGTERM and SIGHUP are forwarded to every rank. When a rank exits
// with a non-zero status the others get SIGTERM; after a forwarded signal or
// a failing rank, ranks still running after the grace period get SIGKILL,
// and so do the processes they started (each rank's whole process group,
// also once the rank itself has exited). The
// launcher exits with the first failing rank's status (128 + signal for a
// rank killed by a signal). The ranks die with the launcher: if it is killed
// (SIGKILL, a crash), the kernel sends each rank SIGKILL (PR_SET_PDEATHSIG).
//
// Threads: with several ranks, each rank gets max(1, cores / ranks) threads
// (cores: the CPUs this process may run on) through OMP_NUM_THREADS,
// OPENBLAS_NUM_THREADS and MKL_NUM_THREADS, so that LibTorch's intra-op pool
// and the BLAS pools of all ranks together do not oversubscribe the machine.
// A variable the user set is kept; when OMP_NUM_THREADS is set, the BLAS
// variables the user left unset follow it (as OpenBLAS and MKL do
// themselves). The launcher prints one line saying what it set.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kDefaultGraceSeconds = 5;
constexpr int kPollMs = 50;

volatile sig_atomic_t g_signal = 0;

void on_signal(int sig) { g_signal = sig; }

// A rank's exit interrupts the wait at once (SIGCHLD is blocked except inside
// ppoll), so the launcher reaps the rank that failed first before a peer
// that lost its connection to it ends too.
void on_child(int) {}

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr,
               "muon-launch: %s\n"
               "usage: muon-launch -n N [--nnodes M --node-rank K] [--master-port P] "
               "[--master-addr A] [--grace S] -- program [args...]\n",
               error.c_str());
  std::exit(2);
}

int parse_int(const std::string& flag, const char* text, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    usage(flag + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
          "], got '" + text + "'");
  }
  return static_cast<int>(v);
}

// A TCP port that is free now on `addr` (the kernel picks it).
int free_port(const std::string& addr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    port = ntohs(sa.sin_port);
  }
  close(fd);
  return port;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

// One output stream of one rank: complete lines go out prefixed.
struct Stream {
  int fd = -1;      // read end, -1 once closed
  int out_fd = 1;   // where lines go
  std::string prefix;
  std::string pending;

  void flush_lines(bool eof) {
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      write_all(out_fd, prefix + pending.substr(start, nl - start + 1));
    }
    pending.erase(0, start);
    if (eof && !pending.empty()) {
      write_all(out_fd, prefix + pending + "\n");
      pending.clear();
    }
  }

  void read_some() {
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      pending.append(buf, static_cast<size_t>(n));
      flush_lines(false);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      flush_lines(true);
      close(fd);
      fd = -1;
    }
  }
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // exit code, or 128 + signal
  bool signaled = false;  // ended by a signal rather than with a status
};

bool is_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

// Gives every rank a share of the cores through the thread variables the
// user left unset (see the comment at the top); returns what it set, as
// "NAME=value ..." ("" when nothing).
std::string set_thread_variables(int ranks) {
  if (ranks <= 1) return "";  // one rank: the libraries' defaults fit the machine
  const std::string value = is_set("OMP_NUM_THREADS")
                                ? std::string(std::getenv("OMP_NUM_THREADS"))
                                : std::to_string(std::max(1, usable_cores() / ranks));
  std::string set;
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}) {
    if (is_set(name)) continue;
    setenv(name, value.c_str(), 1);
    set += (set.empty() ? "" : " ") + std::string(name) + "=" + value;
  }
  return set;
}

// Whether rank r's process group still has members (the rank itself, or
// children it started, which may outlive it: a background job of a shell
// ignores SIGINT).
bool group_alive(const Rank& r) {
  return r.pid > 0 && (kill(-r.pid, 0) == 0 || errno == EPERM);
}

void signal_all(std::vector<Rank>& ranks, int sig) {
  for (auto& r : ranks) {
    // Each rank leads its own process group: its children get the signal too,
    // also after the rank itself has exited.
    if (r.running || group_alive(r)) kill(-r.pid, sig);
  }
}

// The command line.
struct Args {
  int n = -1;
  int port = -1;
  int grace = kDefaultGraceSeconds;
  int nnodes = 1;
  int node_rank = -1;
  bool addr_given = false;
  std::string addr = "127.0.0.1";
  int program = 0;  // argv index of the program
  int world = 0;
  int first_rank = 0;
};

Args parse_args(int argc, char** argv) {
  Args a;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) usage("option " + arg + " needs a value (or unknown option)");
    if (arg == "-n" || arg == "--nproc") {
      a.n = parse_int(arg, argv[++i], 1, 1024);
    } else if (arg == "--master-port") {
      a.port = parse_int(arg, argv[++i], 1, 65535);
    } else if (arg == "--master-addr") {
      a.addr = argv[++i];
      a.addr_given = true;
    } else if (arg == "--nnodes") {
      a.nnodes = parse_int(arg, argv[++i], 1, 1024);
    } else if (arg == "--node-rank") {
      a.node_rank = parse_int(arg, argv[++i], 0, 1023);
    } else if (arg == "--grace") {
      a.grace = parse_int(arg, argv[++i], 0, 3600);
    } else {
      usage("unknown option '" + arg + "'");
    }
  }
  if (a.n < 1) usage("-n N is required");
  if (i >= argc) usage("no program given after --");
  a.program = i;
  if (a.nnodes > 1) {
    // Every node must name the same store: no free port of this machine's own.
    if (a.node_rank < 0) usage("--nnodes " + std::to_string(a.nnodes) + " needs --node-rank K (0.." +
                               std::to_string(a.nnodes - 1) + ")");
    if (a.port < 0 || !a.addr_given) {
      usage("--nnodes " + std::to_string(a.nnodes) +
            " needs --master-addr and --master-port: node 0's address and a free port there, the "
            "same on every node");
    }
  }
  if (a.node_rank < 0) a.node_rank = 0;
  if (a.node_rank >= a.nnodes) {
    usage("--node-rank must be < --nnodes (" + std::to_string(a.nnodes) + "), got " +
          std::to_string(a.node_rank));
  }
  a.world = a.n * a.nnodes;
  a.first_rank = a.n * a.node_rank;
  if (a.port < 0) a.port = free_port(a.addr);
  if (a.port < 0) usage("could not find a free port; pass --master-port");
  return a;
}

// SIGINT, SIGTERM and SIGHUP set g_signal, SIGPIPE is ignored, SIGCHLD is
// blocked; returns the mask to wait with (the old one, SIGCHLD unblocked).
sigset_t install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: poll returns EINTR
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  struct sigaction child {};
  child.sa_handler = on_child;
  sigemptyset(&child.sa_mask);
  child.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &child, nullptr);
  sigset_t with_child;
  sigset_t wait_mask;
  sigemptyset(&with_child);
  sigaddset(&with_child, SIGCHLD);
  sigprocmask(SIG_BLOCK, &with_child, &wait_mask);
  sigdelset(&wait_mask, SIGCHLD);
  return wait_mask;
}

// The child of fork(): local rank r runs the program with torchrun's
// environment, its output into the pipes.
[[noreturn]] void run_rank(const Args& a, char** argv, int r, const int out[2], const int err[2],
                           pid_t launcher, const sigset_t& wait_mask) {
  // Die with the launcher; if it is already gone (killed between fork
  // and prctl), the signal will never come: leave now.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(128 + SIGKILL);
  setpgid(0, 0);
  dup2(out[1], STDOUT_FILENO);
  dup2(err[1], STDERR_FILENO);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaction(sig, &dfl, nullptr);
  sigprocmask(SIG_SETMASK, &wait_mask, nullptr);
  const auto set = [](const char* k, const std::string& v) { setenv(k, v.c_str(), 1); };
  set("RANK", std::to_string(a.first_rank + r));
  set("LOCAL_RANK", std::to_string(r));
  set("GROUP_RANK", std::to_string(a.node_rank));
  set("ROLE_RANK", std::to_string(a.first_rank + r));
  set("WORLD_SIZE", std::to_string(a.world));
  set("LOCAL_WORLD_SIZE", std::to_string(a.n));
  set("ROLE_WORLD_SIZE", std::to_string(a.world));
  set("MASTER_ADDR", a.addr);
  set("MASTER_PORT", std::to_string(a.port));
  set("TORCHELASTIC_RESTART_COUNT", "0");
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  execvp(argv[a.program], argv + a.program);
  std::fprintf(stderr, "muon-launch: cannot run '%s': %s\n", argv[a.program], std::strerror(errno));
  _exit(127);
}

// Starts the n local ranks, each with its two output streams; false (every
// rank started so far killed) when a pipe or a fork fails.
bool spawn_ranks(const Args& a, char** argv, const sigset_t& wait_mask, std::vector<Rank>& ranks,
                 std::vector<Stream>& streams) {
  const pid_t launcher = getpid();
  for (int r = 0; r < a.n; ++r) {
    int out[2];
    int err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      std::perror("muon-launch: pipe");
      signal_all(ranks, SIGKILL);
      return false;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("muon-launch: fork");
      signal_all(ranks, SIGKILL);
      return false;
    }
    if (pid == 0) run_rank(a, argv, r, out, err, launcher, wait_mask);
    setpgid(pid, pid);  // also here: no race with a signal sent right after fork
    close(out[1]);
    close(err[1]);
    ranks[static_cast<size_t>(r)].pid = pid;
    ranks[static_cast<size_t>(r)].running = true;
    const std::string prefix = "[rank " + std::to_string(a.first_rank + r) + "] ";
    for (const auto& [fd, to] : {std::pair<int, int>{out[0], STDOUT_FILENO}, {err[0], STDERR_FILENO}}) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      streams.push_back(Stream{fd, to, prefix, {}});
    }
  }
  return true;
}

// Reaps the ranks that exited; returns how many still run, and in
// `failed_now` those that failed. Of the ranks found failed in one pass, the
// first failure is one that exited with a status of its own rather than by a
// signal (a peer that lost its connection aborts); ties go to the lowest.
int reap(std::vector<Rank>& ranks, std::vector<size_t>& failed_now) {
  int running = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto& rank = ranks[r];
    if (!rank.running) continue;
    int st = 0;
    const pid_t got = waitpid(rank.pid, &st, WNOHANG);
    if (got == rank.pid) {
      rank.running = false;
      rank.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      rank.signaled = WIFSIGNALED(st);
      if (rank.status != 0) failed_now.push_back(r);
    } else {
      ++running;
    }
  }
  std::stable_sort(failed_now.begin(), failed_now.end(), [&](size_t a, size_t b) {
    return !ranks[a].signaled && ranks[b].signaled;
  });
  return running;
}

// Forwards signals, reaps the ranks, stops the others after a failure and
// relays the output until every rank (and what it started) is gone; returns
// the launcher's exit status.
int supervise(const Args& a, const sigset_t& wait_mask, std::vector<Rank>& ranks,
              std::vector<Stream>& streams) {
  using Clock = std::chrono::steady_clock;
  int exit_code = 0;
  int first_failure = -1;
  bool stopping = false;
  Clock::time_point kill_at;
  Clock::time_point drain_until = Clock::time_point::max();
  auto begin_stop = [&](int sig) {
    signal_all(ranks, sig);
    if (!stopping) kill_at = Clock::now() + std::chrono::seconds(a.grace);
    stopping = true;
  };

  while (true) {
    if (g_signal != 0) {
      const int sig = g_signal;
      g_signal = 0;
      std::fprintf(stderr, "muon-launch: got signal %d, forwarding to every rank\n", sig);
      if (first_failure < 0) exit_code = 128 + sig;
      begin_stop(sig);
    }
    std::vector<size_t> failed_now;
    const int running = reap(ranks, failed_now);
    for (const size_t r : failed_now) {
      if (first_failure >= 0 || stopping) break;
      first_failure = static_cast<int>(r);
      exit_code = ranks[r].status;
      std::fprintf(stderr, "muon-launch: rank %zu exited with status %d; stopping the others\n",
                   static_cast<size_t>(a.first_rank) + r, ranks[r].status);
      begin_stop(SIGTERM);
    }
    // After a forwarded signal or a failing rank, what a rank started goes
    // with it: groups whose members outlive their rank get SIGKILL at the
    // end of the grace period too, and the launcher waits for that.
    int lingering = 0;
    if (stopping && kill_at != Clock::time_point::max()) {
      for (const auto& rank : ranks) lingering += !rank.running && group_alive(rank) ? 1 : 0;
    }
    if (stopping && running + lingering > 0 && Clock::now() >= kill_at) {
      signal_all(ranks, SIGKILL);
      kill_at = Clock::time_point::max();
      lingering = 0;
    }
    // Output.
    std::vector<pollfd> fds;
    for (const auto& s : streams) {
      if (s.fd >= 0) fds.push_back(pollfd{s.fd, POLLIN, 0});
    }
    if (running == 0 && lingering == 0) {
      // Every rank is gone; a grandchild may still hold a pipe: drain briefly.
      if (fds.empty()) break;
      if (drain_until == Clock::time_point::max()) drain_until = Clock::now() + std::chrono::seconds(1);
      if (Clock::now() >= drain_until) break;
    }
    const timespec tick{0, kPollMs * 1000000L};
    if (ppoll(fds.empty() ? nullptr : fds.data(), fds.size(), &tick, &wait_mask) <= 0) continue;
    for (const auto& p : fds) {
      if ((p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      for (auto& s : streams) {
        if (s.fd == p.fd) s.read_some();
      }
    }
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse_args(argc, argv);
  const sigset_t wait_mask = install_signal_handlers();

  const bool user_omp = is_set("OMP_NUM_THREADS");
  const std::string threads = set_thread_variables(a.n);
  if (!threads.empty()) {
    std::fprintf(stderr, "muon-launch: %d ranks on %d cores: %s for each rank (%s)\n", a.n,
                 usable_cores(), threads.c_str(),
                 user_omp ? "following OMP_NUM_THREADS" : "set these variables to choose otherwise");
  }

  std::vector<Rank> ranks(static_cast<size_t>(a.n));
  std::vector<Stream> streams;
  if (!spawn_ranks(a, argv, wait_mask, ranks, streams)) return 1;
  const int exit_code = supervise(a, wait_mask, ranks, streams);
  for (auto& s : streams) {
    if (s.fd >= 0) {
      s.flush_lines(true);
      close(s.fd);
    }
  }
  return exit_code;
}
