#pragma once
// Helpers of the tests that run muon-train-gpt as a user does: scratch
// directories, and the program's output and exit status.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace train_gpt_test {

// A fresh directory under the system temp dir, unique to this process (test
// programs may run concurrently).
inline std::filesystem::path scratch(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("muon_train_gpt_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

struct Output {
  int status;
  std::string text;
};

// A shell command's output (stdout and stderr) and exit status.
inline Output run_program_command(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string text;
  char buf[4096];
  while (pipe != nullptr && fgets(buf, sizeof buf, pipe) != nullptr) text += buf;
  const int status = pipe != nullptr ? pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

#ifdef MUON_TRAIN_GPT_BIN
// muon-train-gpt with `args`.
inline Output run_program(const std::string& args) {
  return run_program_command(std::string(MUON_TRAIN_GPT_BIN) + " " + args);
}
#endif

}  // namespace train_gpt_test
