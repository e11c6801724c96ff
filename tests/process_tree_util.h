#pragma once
// Process trees for the tests that run a job as several machines would: an
// agent (torchrun, muon-launch) started in a session of its own with its
// output in a file, the processes below it, and killing a whole tree, as a
// machine that dies takes everything it ran.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process_util.h"

namespace muon::test {

/// The parent of every process now running, by pid (from /proc/<pid>/stat).
inline std::map<pid_t, pid_t> parents() {
  std::map<pid_t, pid_t> parent;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return parent;
  while (const dirent* e = readdir(proc)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat("/proc/" + name + "/stat");
    std::string text;
    if (!std::getline(stat, text)) continue;
    const auto close_paren = text.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(text.substr(close_paren + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    parent[static_cast<pid_t>(std::stoi(name))] = ppid;
  }
  closedir(proc);
  return parent;
}

/// Every process below `root` (children, their children, ...), not `root`.
inline std::vector<pid_t> descendants(pid_t root) {
  const auto parent = parents();
  std::vector<pid_t> found{root};
  for (size_t i = 0; i < found.size(); ++i) {
    for (const auto& [pid, ppid] : parent) {
      if (ppid == found[i]) found.push_back(pid);
    }
  }
  found.erase(found.begin());
  return found;
}

/// A process's command line, its arguments joined by spaces.
inline std::string command_line(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (auto& c : text) {
    if (c == '\0') c = ' ';
  }
  return text;
}

/// A command run in a session of its own (as on a machine of its own),
/// its stdout and stderr in `log`. Killed with everything below it when it
/// goes out of scope.
class Tree {
 public:
  Tree(const std::vector<std::string>& args, const std::string& log, const EnvChanges& env = {})
      : log_(log), start_(std::chrono::steady_clock::now()) {
    const ExecImage image(args, env);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      setsid();
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      image.exec();
    }
    close(fd);
  }
  Tree(const Tree&) = delete;
  Tree& operator=(const Tree&) = delete;
  ~Tree() {
    if (!reaped_) kill_all();
  }

  pid_t pid() const { return pid_; }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  /// What it wrote so far.
  std::string output() const {
    std::ifstream in(log_);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  /// The processes below it whose command line contains `what`.
  std::vector<pid_t> processes(const std::string& what) const {
    std::vector<pid_t> out;
    for (const pid_t p : descendants(pid_)) {
      if (command_line(p).find(what) != std::string::npos) out.push_back(p);
    }
    return out;
  }
  /// SIGKILL to it and to every process below it (also those in sessions
  /// of their own), at once: a machine that dies.
  void kill_all() {
    const auto below = descendants(pid_);
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    for (const pid_t p : below) kill(p, SIGKILL);
    if (!reaped_) {
      waitpid(pid_, nullptr, 0);
      reaped_ = true;
      status_ = -1;
    }
  }
  /// Waits for it to exit, at most until `limit_s` from its start (then
  /// kills the tree); its exit code, 128 + signal, or -1 when killed.
  int wait(double limit_s) {
    while (!reaped_) {
      int st = 0;
      const pid_t got = waitpid(pid_, &st, WNOHANG);
      if (got == pid_) {
        reaped_ = true;
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (seconds() > limit_s) {
        kill_all();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }

 private:
  std::string log_;
  std::chrono::steady_clock::time_point start_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = -1;
};

}  // namespace muon::test
