#pragma once
// The rendezvous environment of one test (set, then restored) and a free
// loopback port, for the tests of init_from_env and of launched ranks.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace muon::test {

/// Clears the variables init_from_env reads, sets `vars`, and restores
/// everything when it goes out of scope.
class ScopedRendezvousEnv {
 public:
  explicit ScopedRendezvousEnv(const std::vector<std::pair<std::string, std::string>>& vars) {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                             "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "MUON_TIMEOUT",
                             "USE_LIBUV"}) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
      unsetenv(name);
    }
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ScopedRendezvousEnv(const ScopedRendezvousEnv&) = delete;
  ScopedRendezvousEnv& operator=(const ScopedRendezvousEnv&) = delete;
  ~ScopedRendezvousEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        setenv(k.c_str(), v->c_str(), 1);
      } else {
        unsetenv(k.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

/// A loopback TCP port nobody listens on now (the kernel picks it).
inline int free_port() {
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

}  // namespace muon::test
