#pragma once

/// c10d differences between LibTorch 1.13 and 2.x, in one place.
///
///  - 1.13: ProcessGroupGloo / ProcessGroupNCCL derive from
///    `c10d::ProcessGroup`, which carries the collectives.
///  - 2.x: they derive from `c10d::Backend` (a `c10d::ProcessGroup` wraps
///    one backend per device type); the backend carries the same
///    collectives with the same signatures.
///  - 2.4+: `c10d::TCPStoreOptions::useLibUV` (absent before 2.2) defaults
///    to true, and a LibTorch built without libuv (Debian's 2.6) throws on
///    it. `set_use_libuv` sets it where it exists; `kStoreHasLibUVOption`
///    says whether it does.
///
/// `CollectiveBackend` is whichever base the Gloo process group has, found
/// with a type trait rather than version macros, so muon::distributed talks to the
/// backend object directly on both.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <type_traits>
#include <utility>

namespace muon::distributed::compat {

/// The base class of c10d's concrete process groups in this LibTorch.
using CollectiveBackend =
    std::conditional_t<std::is_base_of_v<c10d::Backend, c10d::ProcessGroupGloo>, c10d::Backend,
                       c10d::ProcessGroup>;

/// Owning pointer to a backend.
using BackendPtr = c10::intrusive_ptr<CollectiveBackend>;

/// The backend of an existing process group that runs collectives on
/// `device`: the process group itself on 1.13, its backend for that device
/// type on 2.x.
template <typename PG = c10d::ProcessGroup>
BackendPtr backend_of(const c10::intrusive_ptr<PG>& process_group, c10::DeviceType device) {
  if constexpr (std::is_same_v<CollectiveBackend, PG>) {
    (void)device;
    return process_group;
  } else {
    return process_group->getBackend(device);
  }
}

namespace detail {
template <typename O, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename O>
struct HasUseLibUV<O, std::void_t<decltype(std::declval<O&>().useLibUV)>> : std::true_type {};
}  // namespace detail

/// Whether this LibTorch's TCPStore has a libuv option.
inline constexpr bool kStoreHasLibUVOption = detail::HasUseLibUV<c10d::TCPStoreOptions>::value;

/// Asks for the libuv TCPStore backend (or the classic one); a no-op on
/// LibTorch versions without the option (they have only the classic one).
template <typename O = c10d::TCPStoreOptions>
void set_use_libuv(O& options, bool use) {
  if constexpr (detail::HasUseLibUV<O>::value) {
    options.useLibUV = use;
  } else {
    (void)options;
    (void)use;
  }
}

/// Whether `options` ask for the libuv backend (false where there is none).
template <typename O = c10d::TCPStoreOptions>
bool uses_libuv(const O& options) {
  if constexpr (detail::HasUseLibUV<O>::value) {
    return options.useLibUV;
  } else {
    (void)options;
    return false;
  }
}

}  // namespace muon::distributed::compat
