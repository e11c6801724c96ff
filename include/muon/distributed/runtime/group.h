#pragma once

/// Process groups for the distributed optimizers: a small value type over a
/// c10d process group (Gloo over TCP on CPU; NCCL in a CUDA build), with a
/// single-rank fast path, sub-groups, a timeout on every collective and a
/// count of the bytes each rank sends.
///
///     auto world = muon::distributed::init_from_env();          // torchrun's variables
///     auto [dp, tp] = world.mesh(/*dp=*/2, /*tp=*/4);    // collective, same order everywhere
///     tp.all_reduce_(gram);
///
/// There is no hidden default group: a `Group` comes from `init_from_env`,
/// `Group::create` (a store shared by the ranks), `Group::single`, or from
/// splitting one of those.
///
/// Collective rule (as torch.distributed): every rank of a group calls the
/// same collectives, sub-group creations included, in the same order. A rank
/// that does not arrive makes the others raise a c10::Error after the
/// group's timeout; the message names the group, the operation and the rank.
#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "muon/distributed/namespace.h"

namespace c10d {
class Store;
class ProcessGroup;
}  // namespace c10d

namespace muon::distributed {

/// Default timeout of collectives and of store operations (torch.distributed's
/// default is 30 minutes; training jobs set their own).
constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};

/// Which c10d backend runs the collectives.
enum class Backend {
  /// NCCL when the library was built with it and CUDA is available, else Gloo.
  kAuto,
  /// Gloo over TCP (CPU tensors).
  kGloo,
  /// NCCL (CUDA tensors); only in builds against a CUDA LibTorch.
  kNccl,
};

/// "auto" | "gloo" | "nccl".
std::string to_string(Backend backend);

/// Whether this build of the library has the NCCL backend.
bool nccl_available();

/// Options of a group, as chained setters.
struct GroupOptions {
  /// Timeout of each collective and of the store during creation, > 0.
  /// It also bounds the rendezvous of `init_from_env`: a rank waits at most
  /// this long for the store and for the other ranks, then raises c10::Error
  /// with one line (no C++ backtrace) naming the rank, MASTER_ADDR:MASTER_PORT
  /// and what to check. `init_from_env` takes the environment variable
  /// MUON_TIMEOUT (seconds, e.g. "30" or "2.5") instead when this is left at
  /// kDefaultTimeout, so a program's own setting (a `--timeout` flag) wins.
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultTimeout;
  /// Backend of the process group.
  TORCH_ARG(Backend, backend) = Backend::kAuto;
  /// Address Gloo binds its sockets to: "127.0.0.1" (one machine), this
  /// machine's address on the network the ranks share, or "" to resolve this
  /// machine's hostname (c10d's default device).
  TORCH_ARG(std::string, hostname) = "127.0.0.1";
};

namespace detail {
struct GroupImpl;
}  // namespace detail

/// A collective in flight (from `Group::all_gather_async` or
/// `Group::all_to_all_async`). `wait()` blocks
/// until it completes and returns its result, raising as the blocking
/// collectives do (c10::Error naming group and op) on failure or timeout. A
/// handle waits at most once; destroying one that was never waited for
/// waits for it (an in-flight collective must not outlive its buffers).
class PendingCollective {
 public:
  PendingCollective() = default;
  PendingCollective(PendingCollective&&) noexcept = default;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;
  ~PendingCollective();

  /// Every rank's tensor, in rank order.
  std::vector<at::Tensor> wait();
  /// Whether there is a collective to wait for.
  bool valid() const { return static_cast<bool>(finish_); }

 private:
  friend class Group;
  std::function<std::vector<at::Tensor>()> finish_;
};

/// A set of ranks that run collectives together. Cheap to copy: copies share
/// the process group, its byte counter and its sub-group counter.
///
/// Collectives are blocking unless named `_async`, and take or return CPU
/// (Gloo) or CUDA (NCCL) tensors; on a size-1 group they do no communication
/// at all.
class Group {
 public:
  /// An invalid group (`valid()` is false); every operation raises. Exists so
  /// that option structs can hold a Group; it is never used implicitly.
  Group();

  /// The one-rank group: rank 0 of 1, no process group, no communication.
  static Group single();

  /// A group of `size` ranks over `store` (a c10d TCPStore, FileStore or
  /// HashStore the ranks share); this caller is `rank`. Collective: every rank
  /// calls it. Raises c10::ValueError for rank outside [0, size) or
  /// size < 1, and c10::Error (one line, no backtrace) when the others do
  /// not connect within the timeout.
  static Group create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      GroupOptions options = {});

  /// A group over an existing c10d process group, one the program (or
  /// torch.distributed, e.g. `dist.new_group`) already made: collectives go
  /// through it, with this Group's timeouts, messages and byte counts. Not
  /// collective. `world_ranks` (the members' ranks in the world, in group
  /// order; default 0..size−1) and `name` (default "process_group") are for
  /// messages. Such a group cannot `split` (it has no store): make its
  /// sub-groups where the process group came from and wrap those. Raises
  /// c10::ValueError for a null process group or world_ranks of the wrong
  /// length.
  static Group wrap(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group,
                    GroupOptions options = {}, std::vector<int> world_ranks = {},
                    std::string name = "process_group");

  /// False only for a default-constructed Group.
  bool valid() const { return impl_ != nullptr; }
  /// This rank's index in the group, in [0, size()).
  int rank() const;
  /// Number of ranks.
  int size() const;
  /// World rank of each member, in group order.
  const std::vector<int>& world_ranks() const;
  /// A name for messages: "world", or the parent's name plus the split.
  const std::string& name() const;
  /// Options in force (timeout, backend).
  const GroupOptions& options() const;
  /// The backend actually used ("gloo", "nccl", or "none" for size 1).
  std::string backend_name() const;
  /// Where tensors handed to this group's collectives must live: the CPU
  /// for Gloo and for one rank, CUDA (the current device) for NCCL.
  at::Device device() const;

  /// Sums `tensor` over the ranks, in place. Floating or integer dtypes.
  void all_reduce_(at::Tensor& tensor) const;
  /// Every rank's `tensor` (same shape and dtype on each), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor) const;
  /// As `all_gather`, without waiting: the collective runs in the background
  /// (overlapping the caller's computation) until the handle's `wait()`.
  /// `tensor` must not be modified before then. Collectives must still be
  /// started in the same order on every rank.
  PendingCollective all_gather_async(const at::Tensor& tensor) const;
  /// All-to-all of a flat (1-D) tensor, without waiting: `input` holds one
  /// block per destination rank, in rank order, of `send_counts[r]` elements;
  /// the result (one tensor, from `wait()`) holds the block every rank sent
  /// here, in rank order, of `recv_counts[r]` elements. Counts may be zero
  /// and differ between ranks; each pair of ranks must agree on theirs.
  PendingCollective all_to_all_async(const at::Tensor& input, const std::vector<int64_t>& send_counts,
                                     const std::vector<int64_t>& recv_counts) const;
  /// Every rank's `tensor` where shapes may differ between ranks in dim 0 only
  /// (uneven shards): exchanges sizes, pads to the largest, gathers, trims.
  std::vector<at::Tensor> all_gather_uneven(const at::Tensor& tensor) const;
  /// Every rank's list of integers (same length on each), in rank order.
  std::vector<std::vector<int64_t>> all_gather_ints(const std::vector<int64_t>& values) const;
  /// Copies rank `root`'s `tensor` into every rank's `tensor`, in place.
  void broadcast_(at::Tensor& tensor, int root) const;
  /// Returns when every rank has called it.
  void barrier() const;

  /// Splits this group collectively: ranks that pass the same `color` form
  /// one new group, ordered by (`key`, then rank). Every rank of this group
  /// must call it, in the same order as its other collectives. The new
  /// group inherits the options.
  Group split(int color, int key = 0) const;

  /// Splits this group of dp·tp ranks into a (dp, tp) mesh, tp fastest
  /// (Megatron's order: ranks r and r+1 are in the same TP group). Returns
  /// {data-parallel group of this rank, tensor-parallel group of this rank}.
  /// Collective. Raises c10::ValueError unless dp·tp == size().
  std::pair<Group, Group> mesh(int dp, int tp) const;

  /// Bytes this rank has sent through this group (and its copies) since
  /// creation or the last reset, by the bandwidth-optimal ring model
  /// (NCCL's): all-reduce of N bytes: 2·(p−1)/p·N; all-gather of N bytes per
  /// rank: (p−1)·N; broadcast: N from the root; barrier: 0.
  int64_t bytes_sent() const;
  /// Sets the counter of `bytes_sent` to zero.
  void reset_bytes_sent() const;

 private:
  explicit Group(std::shared_ptr<detail::GroupImpl> impl);
  const detail::GroupImpl& impl(const char* op) const;

  std::shared_ptr<detail::GroupImpl> impl_;
};

/// The world group from torchrun's environment: RANK, WORLD_SIZE,
/// MASTER_ADDR, MASTER_PORT (LOCAL_RANK is checked when set). Rank 0 hosts a
/// TCPStore at MASTER_ADDR:MASTER_PORT and the others connect; with
/// TORCHELASTIC_USE_AGENT_STORE=True (torchrun's agent already hosts it)
/// every rank connects as a client, under torchrun's key prefix
/// "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>". WORLD_SIZE=1 gives the
/// single-rank group without a store. Missing, malformed or inconsistent
/// variables raise c10::ValueError naming the variable and its value.
/// When MASTER_ADDR is not a loopback address and `options.hostname` is the
/// default "127.0.0.1", Gloo binds to this machine's resolved hostname ("").
/// MUON_TIMEOUT (seconds) replaces the default timeout when `options` keeps
/// it; a failed rendezvous raises c10::Error with one line naming the rank,
/// MASTER_ADDR:MASTER_PORT and what to check; ranks started with different
/// WORLD_SIZE raise c10::ValueError naming both. Aligns the BLAS threads
/// (muon::detail::align_blas_threads).
Group init_from_env(GroupOptions options = {});

}  // namespace muon::distributed
