// Group: collectives with timeouts and byte counts, sub-groups.
#include "muon/distributed/runtime/group.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <numeric>

#include "distributed/runtime/backend.h"
#include "distributed/runtime/error_line.h"
#include "util/names.h"

namespace muon::distributed {
namespace detail {

struct GroupImpl {
  compat::BackendPtr backend;              // null for a one-rank group
  c10::intrusive_ptr<c10d::Store> store;   // for sub-groups; null for one rank
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks{0};
  std::string name = "single";
  std::string backend_name = "none";
  at::Device device = at::kCPU;  // where the group's own helper tensors live
  GroupOptions options;
  mutable std::atomic<int64_t> bytes{0};
  mutable std::atomic<int64_t> splits{0};  // sub-group creations so far (same on every rank)
};

}  // namespace detail

namespace {

using detail::GroupImpl;

constexpr const char* kWho = "[muon::distributed::Group] ";

// Starts a collective (the backend call that queues it and returns its
// Work) under one lock per process, never its wait. c10d's flight recorder
// (torch >= 2.8, on by default) adds each process group to a map of its own
// before taking its lock when the group queues its first collective; groups
// starting collectives on several threads at once (ranks as threads, or one
// thread per group) corrupt that map and crash. Queuing takes microseconds.
std::mutex& start_mutex() {
  static std::mutex m;
  return m;
}

template <typename Start>
auto started(Start&& start) {
  std::lock_guard<std::mutex> guard(start_mutex());
  return start();
}

// Waits for the work `start()` returns; any failure (a peer that never
// arrives, a closed connection) becomes a c10::Error naming group and op.
template <typename Start>
void wait_for(const GroupImpl& g, const char* op, Start&& start) {
  try {
    start()->wait(g.options.timeout());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kWho, op, " on group '", g.name, "' (rank ", g.rank, " of ", g.size,
                ", timeout ", g.options.timeout().count(), " ms) failed: ", e.what());
  }
}

// Runs one collective and waits for it; any failure (a peer that never
// arrives, a closed connection) becomes a c10::Error naming group and op.
template <typename Start>
void run(const GroupImpl& g, const char* op, Start&& start) {
  wait_for(g, op, [&] { return started(start); });
}

// Gloo moves only some dtypes: bf16 and int16 travel as fp16 bit patterns
// (gather and broadcast copy bytes, so this is exact), bool as uint8.
at::Tensor wire_view(const at::Tensor& t) {
  if (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kShort) return t.view(at::kHalf);
  if (t.scalar_type() == at::kBool) return t.view(at::kByte);
  return t;
}

int64_t ring_all_reduce_bytes(int64_t bytes, int p) {
  return p <= 1 ? 0 : 2 * (p - 1) * bytes / p;
}

std::shared_ptr<GroupImpl> make_impl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::vector<int> world_ranks, std::string name,
                                     const GroupOptions& options) {
  auto impl = std::make_shared<GroupImpl>();
  impl->rank = rank;
  impl->size = size;
  impl->world_ranks = std::move(world_ranks);
  impl->name = std::move(name);
  impl->options = options;
  if (size == 1) return impl;  // fast path: no process group at all
  impl->store = store;
  Backend backend = options.backend();
  if (backend == Backend::kAuto) backend = detail::nccl_usable() ? Backend::kNccl : Backend::kGloo;
  auto group_store = c10::make_intrusive<c10d::PrefixStore>(impl->name, store);
  try {
    if (backend == Backend::kNccl) {
      impl->backend = detail::make_nccl(group_store, rank, size, options);
    } else {
      impl->backend = detail::make_gloo(group_store, rank, size, options);
    }
  } catch (const c10::ValueError&) {
    throw;
  } catch (const std::exception& e) {
    // One line: the cause's first line, without the backtraces of the layers below.
    muon::distributed::detail::throw_without_backtrace(
        std::string(kWho) + "creating group '" + impl->name + "' (rank " + std::to_string(rank) +
        " of " + std::to_string(size) + ", backend " + to_string(backend) + ", timeout " +
        std::to_string(options.timeout().count()) +
        " ms) failed: " + muon::distributed::detail::first_line(e));
  }
  impl->backend_name = to_string(backend);
  // NCCL moves CUDA tensors only: integer exchanges (shapes) go through the
  // current CUDA device there.
  if (backend == Backend::kNccl) impl->device = at::Device(at::kCUDA);
  return impl;
}

}  // namespace

std::string to_string(Backend backend) {
  static constexpr muon::detail::EnumName<Backend> kNames[] = {
      {Backend::kAuto, "auto"}, {Backend::kGloo, "gloo"}, {Backend::kNccl, "nccl"}};
  return muon::detail::name_of(backend, kNames);
}

Group::Group() = default;

Group::Group(std::shared_ptr<detail::GroupImpl> impl) : impl_(std::move(impl)) {}

Group Group::single() { return Group(std::make_shared<GroupImpl>()); }

Group Group::create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    GroupOptions options) {
  TORCH_CHECK_VALUE(size >= 1, kWho, "create: size must be >= 1, got ", size);
  TORCH_CHECK_VALUE(rank >= 0 && rank < size, kWho, "create: rank must be in [0, ", size,
                    "), got ", rank);
  TORCH_CHECK_VALUE(options.timeout().count() > 0, kWho, "create: timeout must be > 0 ms, got ",
                    options.timeout().count());
  TORCH_CHECK_VALUE(size == 1 || store, kWho, "create: store is null (size ", size, ")");
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return Group(make_impl(store, rank, size, std::move(ranks), "world", options));
}

Group Group::wrap(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group, GroupOptions options,
                  std::vector<int> world_ranks, std::string name) {
  TORCH_CHECK_VALUE(process_group, kWho, "wrap: process_group is null");
  TORCH_CHECK_VALUE(options.timeout().count() > 0, kWho, "wrap: timeout must be > 0 ms, got ",
                    options.timeout().count());
  auto impl = std::make_shared<GroupImpl>();
  impl->rank = process_group->getRank();
  impl->size = process_group->getSize();
  if (world_ranks.empty()) {
    world_ranks.resize(static_cast<size_t>(impl->size));
    std::iota(world_ranks.begin(), world_ranks.end(), 0);
  }
  TORCH_CHECK_VALUE(static_cast<int>(world_ranks.size()) == impl->size, kWho, "wrap: world_ranks has ",
                    world_ranks.size(), " entries, the process group has ", impl->size, " ranks");
  impl->world_ranks = std::move(world_ranks);
  impl->name = std::move(name);
  impl->options = options;
  const std::string backend = process_group->getBackendName();
  const bool nccl = backend == "nccl";
  impl->device = nccl ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  impl->options.backend(nccl ? Backend::kNccl : Backend::kGloo);
  impl->backend = compat::backend_of(process_group, impl->device.type());
  TORCH_CHECK_VALUE(impl->backend, kWho, "wrap: process group '", impl->name,
                    "' has no backend for ", impl->device.type());
  impl->backend_name = backend;
  return Group(std::move(impl));
}

const GroupImpl& Group::impl(const char* op) const {
  TORCH_CHECK_VALUE(impl_ != nullptr, kWho, op,
                    ": this Group is default-constructed (invalid); make one with "
                    "muon::distributed::init_from_env, Group::create or Group::single");
  return *impl_;
}

int Group::rank() const { return impl("rank").rank; }
int Group::size() const { return impl("size").size; }
const std::vector<int>& Group::world_ranks() const { return impl("world_ranks").world_ranks; }
const std::string& Group::name() const { return impl("name").name; }
const GroupOptions& Group::options() const { return impl("options").options; }
std::string Group::backend_name() const { return impl("backend_name").backend_name; }

at::Device Group::device() const { return impl("device").device; }

void Group::all_reduce_(at::Tensor& tensor) const {
  const auto& g = impl("all_reduce");
  TORCH_CHECK_VALUE(tensor.defined(), kWho, "all_reduce: tensor is undefined");
  if (g.size == 1) return;
  // Gloo cannot sum 16-bit floats: reduce in fp32 (more accurate, too).
  const bool widen = tensor.scalar_type() == at::kBFloat16 || tensor.scalar_type() == at::kHalf;
  auto work_tensor = widen ? tensor.to(at::kFloat) : tensor.contiguous();
  std::vector<at::Tensor> tensors{work_tensor};
  run(g, "all_reduce", [&] { return g.backend->allreduce(tensors); });
  g.bytes += ring_all_reduce_bytes(static_cast<int64_t>(work_tensor.nbytes()), g.size);
  if (!work_tensor.is_same(tensor)) tensor.copy_(work_tensor);
}

std::vector<at::Tensor> Group::all_gather(const at::Tensor& tensor) const {
  const auto& g = impl("all_gather");
  TORCH_CHECK_VALUE(tensor.defined(), kWho, "all_gather: tensor is undefined");
  if (g.size == 1) return {tensor.clone()};
  auto input = wire_view(tensor.contiguous());
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < g.size; ++r) outputs[0].push_back(at::empty_like(input));
  std::vector<at::Tensor> inputs{input};
  run(g, "all_gather", [&] { return g.backend->allgather(outputs, inputs); });
  g.bytes += static_cast<int64_t>(g.size - 1) * static_cast<int64_t>(input.nbytes());
  std::vector<at::Tensor> result;
  for (auto& t : outputs[0]) result.push_back(t.view(tensor.scalar_type()));
  return result;
}

PendingCollective& PendingCollective::operator=(PendingCollective&& other) noexcept {
  if (this != &other) {
    if (finish_) {
      try {
        finish_();
      } catch (...) {  // NOLINT(bugprone-empty-catch): replaced unwaited; the error is dropped
      }
    }
    finish_ = std::move(other.finish_);
    other.finish_ = nullptr;
  }
  return *this;
}

PendingCollective::~PendingCollective() {
  if (!finish_) return;
  try {
    finish_();
  } catch (...) {  // NOLINT(bugprone-empty-catch): never waited for; a destructor must not throw
  }
}

std::vector<at::Tensor> PendingCollective::wait() {
  TORCH_CHECK(finish_, kWho, "PendingCollective::wait: nothing in flight (already waited for?)");
  auto finish = std::move(finish_);
  finish_ = nullptr;
  return finish();
}

PendingCollective Group::all_gather_async(const at::Tensor& tensor) const {
  const auto& g = impl("all_gather_async");
  TORCH_CHECK_VALUE(tensor.defined(), kWho, "all_gather_async: tensor is undefined");
  PendingCollective pending;
  if (g.size == 1) {
    auto copy = tensor.clone();
    pending.finish_ = [copy] { return std::vector<at::Tensor>{copy}; };
    return pending;
  }
  auto input = wire_view(tensor.contiguous());
  auto outputs = std::make_shared<std::vector<std::vector<at::Tensor>>>(1);
  for (int r = 0; r < g.size; ++r) (*outputs)[0].push_back(at::empty_like(input));
  auto inputs = std::make_shared<std::vector<at::Tensor>>(std::vector<at::Tensor>{input});
  decltype(g.backend->allgather(*outputs, *inputs)) work;
  try {
    work = started([&] { return g.backend->allgather(*outputs, *inputs); });
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kWho, "all_gather_async on group '", g.name, "' (rank ", g.rank, " of ",
                g.size, ") failed to start: ", e.what());
  }
  g.bytes += static_cast<int64_t>(g.size - 1) * static_cast<int64_t>(input.nbytes());
  const auto impl_ref = impl_;  // the group outlives the collective
  const auto dtype = tensor.scalar_type();
  pending.finish_ = [impl_ref, work, outputs, inputs, dtype] {
    wait_for(*impl_ref, "all_gather_async", [&] { return work; });
    std::vector<at::Tensor> result;
    for (auto& t : (*outputs)[0]) result.push_back(t.view(dtype));
    return result;
  };
  return pending;
}

PendingCollective Group::all_to_all_async(const at::Tensor& input,
                                          const std::vector<int64_t>& send_counts,
                                          const std::vector<int64_t>& recv_counts) const {
  const auto& g = impl("all_to_all_async");
  TORCH_CHECK_VALUE(input.defined() && input.dim() == 1, kWho,
                    "all_to_all_async: input must be a 1-D tensor");
  TORCH_CHECK_VALUE(static_cast<int>(send_counts.size()) == g.size &&
                        static_cast<int>(recv_counts.size()) == g.size,
                    kWho, "all_to_all_async: send_counts and recv_counts need ", g.size,
                    " entries (one per rank), got ", send_counts.size(), " and ",
                    recv_counts.size());
  int64_t sent = 0;
  int64_t received = 0;
  for (int r = 0; r < g.size; ++r) {
    TORCH_CHECK_VALUE(send_counts[static_cast<size_t>(r)] >= 0 && recv_counts[static_cast<size_t>(r)] >= 0,
                      kWho, "all_to_all_async: negative count for rank ", r);
    sent += send_counts[static_cast<size_t>(r)];
    received += recv_counts[static_cast<size_t>(r)];
  }
  TORCH_CHECK_VALUE(sent == input.numel(), kWho, "all_to_all_async: send_counts add up to ", sent,
                    " elements, input has ", input.numel());
  PendingCollective pending;
  if (g.size == 1) {
    auto copy = input.clone();
    pending.finish_ = [copy] { return std::vector<at::Tensor>{copy}; };
    return pending;
  }
  auto in = std::make_shared<at::Tensor>(wire_view(input.contiguous()));
  auto out = std::make_shared<at::Tensor>(at::empty({received}, in->options()));
  std::vector<int64_t> send(send_counts);
  std::vector<int64_t> recv(recv_counts);
  decltype(g.backend->alltoall_base(*out, *in, recv, send)) work;
  try {
    work = started([&] { return g.backend->alltoall_base(*out, *in, recv, send); });
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kWho, "all_to_all_async on group '", g.name, "' (rank ", g.rank, " of ",
                g.size, ") failed to start: ", e.what());
  }
  const auto elem = static_cast<int64_t>(in->element_size());
  g.bytes += (sent - send_counts[static_cast<size_t>(g.rank)]) * elem;
  const auto impl_ref = impl_;
  const auto dtype = input.scalar_type();
  pending.finish_ = [impl_ref, work, in, out, dtype] {
    wait_for(*impl_ref, "all_to_all_async", [&] { return work; });
    return std::vector<at::Tensor>{out->view(dtype)};
  };
  return pending;
}

std::vector<std::vector<int64_t>> Group::all_gather_ints(const std::vector<int64_t>& values) const {
  const auto& g = impl("all_gather_ints");
  if (g.size == 1) return {values};
  auto t = at::tensor(c10::ArrayRef<int64_t>(values), at::kLong);
  if (values.empty()) t = at::empty({0}, at::kLong);
  const auto parts = all_gather(t.to(g.device));
  std::vector<std::vector<int64_t>> result;
  for (const auto& part : parts) {
    const auto p = part.cpu();
    const auto* data = p.data_ptr<int64_t>();
    result.emplace_back(data, data + p.numel());
  }
  return result;
}

std::vector<at::Tensor> Group::all_gather_uneven(const at::Tensor& tensor) const {
  const auto& g = impl("all_gather_uneven");
  TORCH_CHECK_VALUE(tensor.defined() && tensor.dim() >= 1, kWho,
                    "all_gather_uneven: tensor must have at least one dimension");
  if (g.size == 1) return {tensor.clone()};
  // Shapes first: every rank sees every shape, so a mismatch raises everywhere.
  constexpr size_t kMaxDims = 8;
  TORCH_CHECK_VALUE(static_cast<size_t>(tensor.dim()) <= kMaxDims, kWho,
                    "all_gather_uneven: at most ", kMaxDims, " dims, got shape ", tensor.sizes());
  std::vector<int64_t> shape(kMaxDims + 1, -1);
  shape[0] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) shape[static_cast<size_t>(d + 1)] = tensor.size(d);
  const auto shapes = all_gather_ints(shape);
  int64_t max_rows = 0;
  for (size_t r = 0; r < shapes.size(); ++r) {
    for (size_t d = 2; d < shapes[r].size(); ++d) {
      TORCH_CHECK_VALUE(shapes[r][0] == shape[0] && shapes[r][d] == shape[d], kWho,
                        "all_gather_uneven on group '", g.name, "': rank ", r,
                        " has shape ", c10::IntArrayRef(shapes[r]).slice(1, static_cast<size_t>(shapes[r][0])),
                        ", rank ", g.rank, " has ", tensor.sizes(),
                        "; only dim 0 may differ");
    }
    max_rows = std::max(max_rows, shapes[r][1]);
  }
  auto sizes = tensor.sizes().vec();
  sizes[0] = max_rows;
  auto padded = at::zeros(sizes, tensor.options());
  padded.narrow(0, 0, tensor.size(0)).copy_(tensor);
  auto parts = all_gather(padded);
  for (size_t r = 0; r < parts.size(); ++r) parts[r] = parts[r].narrow(0, 0, shapes[r][1]);
  return parts;
}

void Group::broadcast_(at::Tensor& tensor, int root) const {
  const auto& g = impl("broadcast");
  TORCH_CHECK_VALUE(root >= 0 && root < g.size, kWho, "broadcast: root must be in [0, ", g.size,
                    "), got ", root);
  if (g.size == 1) return;
  auto work_tensor = wire_view(tensor.contiguous());
  std::vector<at::Tensor> tensors{work_tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  run(g, "broadcast", [&] { return g.backend->broadcast(tensors, opts); });
  if (g.rank == root) g.bytes += static_cast<int64_t>(work_tensor.nbytes());
  if (!tensor.is_contiguous()) tensor.copy_(work_tensor.view(tensor.scalar_type()));
}

void Group::barrier() const {
  const auto& g = impl("barrier");
  if (g.size == 1) return;
  run(g, "barrier", [&] { return g.backend->barrier(); });
}

Group Group::split(int color, int key) const {
  const auto& g = impl("split");
  TORCH_CHECK_VALUE(g.store || g.size == 1, kWho, "split: group '", g.name,
                    "' wraps a process group made elsewhere and has no store; create the "
                    "sub-groups there (e.g. torch.distributed.new_group) and wrap those");
  const auto all = all_gather_ints({color, key});
  std::vector<int> members;
  for (int r = 0; r < g.size; ++r) {
    if (all[static_cast<size_t>(r)][0] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int x, int y) {
    return all[static_cast<size_t>(x)][1] < all[static_cast<size_t>(y)][1];
  });
  const auto id = g.splits++;
  int new_rank = 0;
  std::vector<int> world;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == g.rank) new_rank = static_cast<int>(i);
    world.push_back(g.world_ranks[static_cast<size_t>(members[i])]);
  }
  const auto name = g.name + "/split" + std::to_string(id) + ".color" + std::to_string(color);
  return Group(make_impl(g.store, new_rank, static_cast<int>(members.size()), std::move(world),
                         name, g.options));
}

std::pair<Group, Group> Group::mesh(int dp, int tp) const {
  const auto& g = impl("mesh");
  TORCH_CHECK_VALUE(dp >= 1 && tp >= 1 && static_cast<int64_t>(dp) * tp == g.size, kWho,
                    "mesh: dp × tp must equal the group size ", g.size, ", got dp ", dp,
                    " and tp ", tp);
  auto tp_group = split(g.rank / tp, g.rank);
  auto dp_group = split(g.rank % tp, g.rank);
  return {std::move(dp_group), std::move(tp_group)};
}

int64_t Group::bytes_sent() const { return impl("bytes_sent").bytes.load(); }

void Group::reset_bytes_sent() const { impl("reset_bytes_sent").bytes = 0; }

}  // namespace muon::distributed
