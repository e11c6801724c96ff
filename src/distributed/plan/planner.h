#pragma once

// muon::plan's planner (src/distributed/plan/): one prediction of one layout.
// plan.cpp holds the planner's bookkeeping (collectives, per-rank sums, the
// step agreement, the gradient all-reduce, the times) and
// plan_layouts.cpp the traffic model of each layout.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "muon/plan.h"
#include "plan_checks.h"

namespace muon::plan::planner {

// Slots of the step agreement before its bitmask (step_agreement.cpp), and
// the bits per mask word.
constexpr int64_t kAgreementSlots = 6;
constexpr int64_t kMaskBits = 63;
constexpr int64_t kAlign = 16;  // layer-wise bucket alignment
// Group::all_gather_uneven first gathers each rank's shape as 9 integers.
constexpr int64_t kUnevenShapeInts = 9;

using detail::all_gather_bytes;
using detail::mul;
using detail::ring_all_reduce_bytes;
inline int64_t ints_bytes(int64_t count, int64_t p) { return all_gather_bytes(8 * count, p); }
inline int64_t aligned(int64_t bytes) { return detail::add(bytes, kAlign - 1, "a bucket's bytes") / kAlign * kAlign; }

// (rows, cols) of a tensor as its layouts see it: dim 0 and the rest.
inline int64_t rows_of(const Tensor& t) { return t.shape.empty() ? 1 : t.shape[0]; }
inline int64_t row_numel(const Tensor& t) { return t.numel() / std::max<int64_t>(rows_of(t), 1); }

// The matrices Newton–Schulz sees in a Muon tensor: [rows, cols] slices of
// a stack of 3+ dims, the tensor itself if 2-D.
struct Matrices {
  int64_t count = 0, rows = 0, cols = 0;
};
Matrices matrices_of(const std::vector<int64_t>& shape);

bool is_muon(const Tensor& t, const Options& o);

// A tensor-parallel rank's block of a tensor.
std::vector<int64_t> block_shape(const Tensor& t, int64_t tp, int64_t rank);
Tensor block_of(const Tensor& t, int64_t tp, int64_t rank);

// Per-rank sums, reported for the most loaded rank.
struct PerRank {
  explicit PerRank(int64_t world) : bytes(static_cast<size_t>(world), 0), flops(bytes.size(), 0),
                                    ns_s(bytes.size(), 0), elementwise_s(bytes.size(), 0),
                                    state(bytes.size(), 0), params(bytes.size(), 0) {}
  std::vector<int64_t> bytes;
  std::vector<double> flops, ns_s, elementwise_s;
  std::vector<int64_t> state, params;
  std::set<std::tuple<int64_t, int64_t, int64_t>> shapes;  // (rank, rows, cols): batched NS calls
};

class Planner {
 public:
  Planner(const Model& model, const Machine& machine, LayoutKind layout, const Options& o);

  Prediction run();

 private:
  // World rank of (dp rank d, tp rank t): TP fastest (Group::mesh).
  int64_t world_rank(int64_t d, int64_t t) const { return d * tp_ + t; }

  // Bookkeeping (plan.cpp).
  Collective& collective(const std::string& what, int64_t group, bool overlapped = false);
  void add(const std::string& what, const std::vector<int64_t>& members, const std::vector<int64_t>& bytes,
           int64_t hops, bool overlapped = false);
  std::vector<int64_t> dp_members(int64_t t) const;
  std::vector<int64_t> tp_members(int64_t d) const;
  void same_bytes(const std::string& what, const std::vector<int64_t>& members, int64_t bytes, int64_t hops,
                  bool overlapped = false);
  std::vector<Tensor> local_tensors(int64_t tp_rank) const;
  double ns_rate(int64_t smaller) const;
  int64_t ranks_on_node() const;
  int64_t ranks_per_node() const;
  double compute_share() const;
  void orthogonalize(int64_t rank, int64_t count, int64_t rows, int64_t cols, double share = 1.0);
  void add_params(int64_t rank, int64_t bytes);
  void elementwise(int64_t rank, int64_t elements, bool muon);
  void agreement(int64_t tp_rank, int64_t params);
  void gradient_all_reduce(int64_t tp_rank, const std::vector<Tensor>& tensors);
  void run_replica(int64_t tp_rank);
  void finish();

  // The layouts' traffic models (plan_layouts.cpp).
  void local_experts(int64_t tp_rank, const std::vector<Tensor>& experts);
  void tensor_parallel_gathers(int64_t tp_rank, const std::vector<Tensor>& tensors);
  void replicated(int64_t tp_rank, const std::vector<Tensor>& tensors);
  void layerwise(int64_t tp_rank, const std::vector<Tensor>& tensors);
  void owner_exchange(int64_t tp_rank, const std::vector<Tensor>& tensors,
                      const std::vector<std::vector<int64_t>>& rows, const std::vector<size_t>& owned,
                      const std::vector<double>& costs, const std::vector<int64_t>& members);
  void sharded(int64_t tp_rank, const std::vector<Tensor>& tensors);

  const Model& model_;
  const Machine& machine_;
  LayoutKind layout_;
  Options o_;
  PerRank ranks_;
  int64_t tp_ = 1, dp_ = 1;
  Prediction p_;
};

}  // namespace muon::plan::planner
