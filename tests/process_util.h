#pragma once
// Real child processes for the tests of muon-launch and of the programs it
// runs: start one with a chosen environment, read its output as it comes,
// signal it, and wait for it with a limit.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace muon::test {

/// Changes to the test's environment for one child: a value sets the
/// variable, nullopt removes it.
using EnvChanges = std::map<std::string, std::optional<std::string>>;

/// This process's environment with `changes` applied, as "K=V" strings.
inline std::vector<std::string> environment_with(const EnvChanges& changes) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (changes.count(entry.substr(0, entry.find('='))) == 0) env.push_back(entry);
  }
  for (const auto& [name, value] : changes) {
    if (value) env.push_back(name + "=" + *value);
  }
  return env;
}

/// A command's argv and envp for execve, built before fork: the child
/// then only calls async-signal-safe functions.
class ExecImage {
 public:
  ExecImage(const std::vector<std::string>& args, const EnvChanges& env)
      : args_(args), env_(environment_with(env)) {
    for (auto& a : args_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
    for (auto& e : env_) envp_.push_back(e.data());
    envp_.push_back(nullptr);
  }
  /// In the child: runs the command, or exits 127.
  [[noreturn]] void exec() const {
    execve(argv_[0], argv_.data(), envp_.data());
    _exit(127);
  }

 private:
  std::vector<std::string> args_;
  std::vector<std::string> env_;
  std::vector<char*> argv_;
  std::vector<char*> envp_;
};

/// One child process with its stdout and stderr captured.
class Child {
 public:
  Child(const std::vector<std::string>& args, const EnvChanges& env = {})
      : start_(std::chrono::steady_clock::now()) {
    int out[2];
    int err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) std::abort();
    const ExecImage image(args, env);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      image.exec();
    }
    close(out[1]);
    close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (const int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  /// Reads output until `done()` holds or both streams close or `limit_s`
  /// (from the start) passes; returns whether `done()` held.
  bool read_until(const std::function<bool()>& done, double limit_s) {
    while (!done()) {
      if ((fds_[0] < 0 && fds_[1] < 0) || seconds() > limit_s) return done();
      read_some(50);
    }
    return true;
  }

  /// Reads everything, killing the child (SIGKILL) if it runs past
  /// `limit_s` from the start; returns its exit code, 128 + signal, or -1
  /// when it had to be killed.
  int wait(double limit_s) {
    bool killed = false;
    while (fds_[0] >= 0 || fds_[1] >= 0) {
      if (!killed && seconds() > limit_s) {
        kill(pid_, SIGKILL);
        killed = true;
      }
      read_some(50);
    }
    int st = 0;
    waitpid(pid_, &st, 0);
    reaped_ = true;
    if (killed) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

 private:
  void read_some(int timeout_ms) {
    std::vector<pollfd> p;
    for (const int fd : fds_) {
      if (fd >= 0) p.push_back(pollfd{fd, POLLIN, 0});
    }
    if (p.empty() || poll(p.data(), p.size(), timeout_ms) <= 0) return;
    std::string* sinks[2] = {&out_, &err_};
    for (int k = 0; k < 2; ++k) {
      for (const auto& q : p) {
        if (fds_[k] < 0 || q.fd != fds_[k] || (q.revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
          continue;
        }
        char buf[4096];
        const ssize_t n = read(fds_[k], buf, sizeof(buf));
        if (n > 0) {
          sinks[k]->append(buf, static_cast<size_t>(n));
        } else {
          close(fds_[k]);
          fds_[k] = -1;
        }
      }
    }
  }

  std::chrono::steady_clock::time_point start_;
  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};
  bool reaped_ = false;
  std::string out_;
  std::string err_;
};

/// Whether process `pid` is gone: no such process, or a zombie nobody
/// reaped yet (it runs no more).
inline bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  const auto close_paren = text.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < text.size() &&
         text[close_paren + 2] == 'Z';
}

/// The non-empty lines of `text`.
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) result.push_back(line);
  }
  return result;
}

}  // namespace muon::test
