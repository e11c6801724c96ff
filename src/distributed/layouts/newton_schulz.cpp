// Newton–Schulz on a matrix split over a group: the standard iteration of
// newton_schulz, with the norm and the Gram matrix all-reduced.
#include "muon/distributed/layouts/newton_schulz.h"

#include <c10/util/Exception.h>

#include <utility>

#include "newton_schulz_internal.h"

namespace muon::distributed {
namespace {

// The whole matrix's ‖G‖²_F and Gram matrices, as all-reduces over the group.
class GroupSums final : public muon::detail::PartialSums {
 public:
  GroupSums(const Group& group, at::Device device) : group_(group), device_(device) {}

  void reduce_sum_of_squares(double& sumsq) const override {
    auto t = at::full({1}, sumsq, at::TensorOptions().dtype(at::kDouble).device(device_));
    group_.all_reduce_(t);
    sumsq = t.item<double>();
  }

  void reduce_gram(at::Tensor& gram) const override { group_.all_reduce_(gram); }

 private:
  const Group& group_;
  at::Device device_;
};

}  // namespace

at::Tensor distributed_newton_schulz(const at::Tensor& block, int64_t partition_dim,
                                     const Group& group, const NewtonSchulzOptions& options) {
  constexpr const char* who = "[muon::distributed::distributed_newton_schulz] ";
  options.validate();
  TORCH_CHECK_VALUE(block.defined() && block.dim() == 2, who,
                    "block must be a 2-D tensor, got shape ",
                    block.defined() ? block.sizes() : c10::IntArrayRef{});
  TORCH_CHECK_VALUE(at::isFloatingType(block.scalar_type()), who,
                    "block must have a floating dtype, got ", block.scalar_type());
  TORCH_CHECK_VALUE(partition_dim == 0 || partition_dim == 1, who,
                    "partition_dim must be 0 or 1, got ", partition_dim);
  TORCH_CHECK_VALUE(block.size(1 - partition_dim) > 0, who, "block of shape ", block.sizes(),
                    " is empty in dim ", 1 - partition_dim,
                    ", which is not split; only the partition dim may be 0");
  TORCH_CHECK_VALUE(!(options.compute_dtype() == at::kHalf && block.device().is_cpu()), who,
                    "compute_dtype Half is not supported on CPU; use BFloat16 or Float");

  // Rows split: Gram of the columns (XᵀX, n×n), applied on the right.
  // Columns split: Gram of the rows (XXᵀ, m×m), applied on the left.
  // One rank holds the whole matrix: nothing to complete.
  const GroupSums group_sums(group, block.device());
  const auto* sums = group.size() > 1 ? &group_sums : nullptr;
  auto x0 = muon::detail::newton_schulz_input(block.unsqueeze(0), options, sums);
  auto out = muon::detail::standard_newton_schulz(std::move(x0), options,
                                                  /*columns=*/partition_dim == 0, sums)
                 .squeeze(0);
  return out.scalar_type() == block.scalar_type() ? out : out.to(block.scalar_type());
}

}  // namespace muon::distributed
