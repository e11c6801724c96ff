// init_from_env: the world group from torchrun's environment variables.
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/runtime/compat.h"
#include "distributed/runtime/error_line.h"
#include "muon/distributed/runtime/group.h"
#include "util/names.h"
#include "util/threads.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::init_from_env] ";
/// Largest MUON_TIMEOUT accepted, in seconds (one week).
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;

using muon::detail::clip;

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
                    " must be an integer, got '", clip(text), "'");
  TORCH_CHECK_VALUE(v >= lo && v <= hi, kWho, name, " must be in [", lo, ", ", hi, "], got ", v);
  return v;
}

// MUON_TIMEOUT: seconds, a decimal number in (0, kMaxTimeoutSeconds].
std::chrono::milliseconds parse_timeout(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text.c_str(), &end);
  TORCH_CHECK_VALUE(errno == 0 && end != text.c_str() && *end == '\0' && std::isfinite(seconds) &&
                        seconds > 0 && seconds <= kMaxTimeoutSeconds,
                    kWho, "MUON_TIMEOUT must be a number of seconds in (0, ", kMaxTimeoutSeconds,
                    "], got '", clip(text), "'");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000)));
}

// "5 s", "0.5 s", "2.25 s".
std::string seconds_text(std::chrono::milliseconds t) {
  std::ostringstream out;
  out << static_cast<double>(t.count()) / 1000 << " s";
  return out.str();
}

// Ranks started with different WORLD_SIZE would fail inside Gloo's connect
// with a message about address sizes: compare through the store first (each
// rank against rank 0, rank 0 against rank 1), naming both values.
void check_same_world_size(c10d::Store& store, int64_t rank, int64_t world_size) {
  const auto key = [](int64_t r) { return "muon/world_size/" + std::to_string(r); };
  const auto text = std::to_string(world_size);
  store.set(key(rank), std::vector<uint8_t>(text.begin(), text.end()));
  const int64_t other = rank == 0 ? 1 : 0;
  const auto bytes = store.get(key(other));
  const std::string theirs(bytes.begin(), bytes.end());
  const auto read_key = [](int64_t r) { return "muon/world_size_read/" + std::to_string(r); };
  store.set(read_key(rank), std::vector<uint8_t>{1});
  if (theirs != text && rank == 0) {
    // Rank 0 usually hosts the store: it stays until rank 1 has read its
    // value too, so that both ranks report the mismatch (not a closed socket).
    try {
      store.wait({read_key(other)}, std::chrono::seconds(10));
    } catch (const std::exception&) {
      // Rank 1 is gone or slow: report from here alone.
    }
  }
  TORCH_CHECK_VALUE(theirs == text, kWho, "WORLD_SIZE is ", text, " on rank ", rank, ", ",
                    muon::detail::clip(theirs, 20), " on rank ", other,
                    "; start every rank with the same WORLD_SIZE");
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

Group init_from_env(GroupOptions options) {
  muon::detail::align_blas_threads();
  if (options.timeout() == kDefaultTimeout) {
    if (auto text = env("MUON_TIMEOUT")) options.timeout(parse_timeout(*text));
  }
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
  // Where the ranks meet, for the messages of a rendezvous that fails.
  const auto where = "MASTER_ADDR:MASTER_PORT = " + clip(addr) + ":" + std::to_string(port);
  const auto who = "rank " + std::to_string(rank) + " of " + std::to_string(world_size);
  // The TCPStore backend: torch's USE_LIBUV (0 or 1) when set; otherwise
  // LibTorch's default (libuv from 2.4), falling back to the classic backend
  // when this LibTorch was built without libuv (Debian's 2.6 is).
  const auto use_libuv = env("USE_LIBUV");
  if (use_libuv) {
    TORCH_CHECK_VALUE(*use_libuv == "0" || *use_libuv == "1", kWho,
                      "USE_LIBUV must be 0 or 1, got '", clip(*use_libuv), "'");
    compat::set_use_libuv(store_options, *use_libuv == "1");
  }
  c10::intrusive_ptr<c10d::Store> store;
  try {
    try {
      store = c10::make_intrusive<c10d::TCPStore>(addr, store_options);
    } catch (const std::exception& e) {
      const bool no_libuv = std::string(e.what()).find("without libuv") != std::string::npos;
      if (!compat::uses_libuv(store_options) || !no_libuv || use_libuv.value_or("") == "1") throw;
      compat::set_use_libuv(store_options, false);
      store = c10::make_intrusive<c10d::TCPStore>(addr, store_options);
    }
  } catch (const std::exception& e) {
    // One line (no backtrace): the cause, and what to check.
    detail::throw_without_backtrace(
        std::string(kWho) + who +
        (store_options.isServer
             ? " cannot host the store at " + where + ": " + detail::first_line(e) +
                   " (check that MASTER_PORT is free on MASTER_ADDR)"
             : " waited " + seconds_text(options.timeout()) + " for the store at " + where + ": " +
                   detail::first_line(e) +
                   " (check that every rank started and MASTER_ADDR is reachable; MUON_TIMEOUT "
                   "sets the wait)"));
  }
  if (agent_store) {
    // torchrun's agent shares its store with the workers under this prefix
    // (torch.distributed.rendezvous); keep to it so keys never collide.
    const auto attempt = env("TORCHELASTIC_RESTART_COUNT").value_or("0");
    store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + attempt, store);
  }
  if (!is_loopback(addr) && options.hostname() == "127.0.0.1") options.hostname("");
  try {
    check_same_world_size(*store, rank, world_size);
    return Group::create(store, static_cast<int>(rank), static_cast<int>(world_size), options);
  } catch (const c10::ValueError&) {
    throw;
  } catch (const std::exception& e) {
    detail::throw_without_backtrace(
        std::string(kWho) + who + " waited " + seconds_text(options.timeout()) +
        " for the other ranks at " + where + "; " + detail::first_line(e) +
        " (check that every rank started and MASTER_ADDR is reachable; MUON_TIMEOUT sets the "
        "wait)");
  }
}

}  // namespace muon::distributed
