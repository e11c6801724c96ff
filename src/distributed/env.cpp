// init_from_env: the world group from torchrun's environment variables.
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

#include "muon/distributed/group.h"

namespace muon::dist {
namespace {

constexpr const char* kWho = "[muon::dist::init_from_env] ";

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string require(const char* name) {
  auto v = env(name);
  TORCH_CHECK_VALUE(v.has_value() && !v->empty(), kWho, "environment variable ", name,
                    " is not set; run under torchrun or muon-launch, or set RANK, WORLD_SIZE, "
                    "MASTER_ADDR and MASTER_PORT");
  return *v;
}

int64_t parse_int(const char* name, const std::string& text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  TORCH_CHECK_VALUE(errno == 0 && end != text.c_str() && *end == '\0', kWho, name,
                    " must be an integer, got '", text, "'");
  TORCH_CHECK_VALUE(v >= lo && v <= hi, kWho, name, " must be in [", lo, ", ", hi, "], got ", v);
  return v;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

Group init_from_env(GroupOptions options) {
  const auto world_size =
      parse_int("WORLD_SIZE", require("WORLD_SIZE"), 1, std::numeric_limits<int>::max());
  const auto rank = parse_int("RANK", require("RANK"), 0, std::numeric_limits<int>::max());
  TORCH_CHECK_VALUE(rank < world_size, kWho, "RANK must be < WORLD_SIZE (", world_size,
                    "), got ", rank);
  if (auto local = env("LOCAL_RANK")) {
    const auto local_rank = parse_int("LOCAL_RANK", *local, 0, std::numeric_limits<int>::max());
    TORCH_CHECK_VALUE(local_rank <= rank, kWho, "LOCAL_RANK (", local_rank,
                      ") must be <= RANK (", rank, ")");
    if (auto local_world = env("LOCAL_WORLD_SIZE")) {
      const auto lws = parse_int("LOCAL_WORLD_SIZE", *local_world, 1, world_size);
      TORCH_CHECK_VALUE(local_rank < lws, kWho, "LOCAL_RANK (", local_rank,
                        ") must be < LOCAL_WORLD_SIZE (", lws, ")");
    }
  }
  if (world_size == 1) return Group::single();

  const auto addr = require("MASTER_ADDR");
  const auto port = parse_int("MASTER_PORT", require("MASTER_PORT"), 1, 65535);
  const bool agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(port);
  store_options.isServer = !agent_store && rank == 0;
  store_options.numWorkers = static_cast<size_t>(world_size);
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout();
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(addr, store_options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kWho, "cannot ", store_options.isServer ? "host" : "reach",
                " the TCPStore at MASTER_ADDR:MASTER_PORT = ", addr, ":", port, " (rank ", rank,
                " of ", world_size, ", timeout ", options.timeout().count(), " ms): ", e.what());
  }
  if (agent_store) {
    // torchrun's agent shares its store with the workers under this prefix
    // (torch.distributed.rendezvous); keep to it so keys never collide.
    const auto attempt = env("TORCHELASTIC_RESTART_COUNT").value_or("0");
    store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + attempt, store);
  }
  if (!is_loopback(addr) && options.hostname() == "127.0.0.1") options.hostname("");
  return Group::create(store, static_cast<int>(rank), static_cast<int>(world_size), options);
}

}  // namespace muon::dist
