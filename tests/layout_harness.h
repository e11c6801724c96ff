#pragma once
// The harness of "an optimizer on matrices split by hand in every layout
// equals one process": tensor-parallel blocks (row- or column-split, uneven,
// empty), row shards (owner-compute and replicated, uneven, padded, empty)
// and the 2-D (dp × tp) layout, each built with the layout's orthogonalizer
// (muon::distributed::make_orthogonalizer), and the row parts of tensors
// split over a group for the owner-compute optimizers. A test gives a
// Factory that builds its optimizer and a tolerance; the layouts through
// muon::distributed::make_optimizer and the checkpoints are in
// checkpoint_model.h. Ranks are threads over real Gloo groups.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist_util.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "tensor_util.h"

namespace muon::test::layouts {

using muon::distributed::Group;
using muon::distributed::RowShard;

/// Steps of every run.
constexpr int64_t kSteps = 3;

/// A matrix with the dimension its tensor-parallel blocks split.
struct Matrix {
  std::vector<int64_t> shape;
  int64_t dim;
};
/// Sizes no world size of 2–4 divides evenly; 3 rows leave rank 3 of 4 with
/// an empty block or shard.
inline const std::vector<Matrix> kMatrices{
    {{24, 16}, 0}, {{16, 40}, 1}, {{21, 10}, 0}, {{12, 15}, 1}, {{3, 12}, 0}};

inline at::Tensor full_param(size_t k) { return seeded_randn(kMatrices[k].shape, 40 + k); }
inline at::Tensor full_grad(size_t k, int64_t step) {
  return seeded_randn(kMatrices[k].shape, 900 + 17 * static_cast<uint64_t>(step) + k);
}

/// This rank's block of `full` along `dim` when blocks are balanced over `size` ranks.
inline at::Tensor block_of(const at::Tensor& full, int64_t dim, int rank, int size) {
  const auto sizes = muon::distributed::balanced_split_sizes(full.size(dim), size);
  return full.narrow(dim, muon::distributed::split_offset(sizes, rank), sizes[static_cast<size_t>(rank)])
      .contiguous();
}

/// This rank's part of matrix k's whole tensor.
using Local = std::function<at::Tensor(size_t, const at::Tensor&)>;

// ---- the parts of any list of matrices in each layout ----

/// Rank `rank`'s tensor-parallel block of matrix k of `matrices` when blocks
/// are balanced over `size` ranks.
inline Local tensor_parallel_part(const std::vector<Matrix>& matrices, int rank, int size) {
  return [&matrices, rank, size](size_t k, const at::Tensor& t) { return block_of(t, matrices[k].dim, rank, size); };
}

/// A rank's part in the 2-D layout: its block over `tp`, split by balanced rows over `dp`.
inline Local two_d_part(const std::vector<Matrix>& matrices, const Group& dp, const Group& tp) {
  return [&matrices, dp_rank = dp.rank(), dp_size = dp.size(), tp_rank = tp.rank(), tp_size = tp.size()](
             size_t k, const at::Tensor& t) {
    const auto block = block_of(t, matrices[k].dim, tp_rank, tp_size);
    return muon::distributed::local_rows(block, muon::distributed::balanced_split_sizes(block.size(0), dp_size),
                                         dp_rank);
  };
}

/// The 2-D layout's RowShard of `m`: the rows of this rank's block over `tp`
/// split over `dp`, the block a tensor-parallel shard in `mode`.
inline RowShard two_d_shard(const Matrix& m, const Group& dp, const Group& tp,
                            muon::distributed::TensorParallelMode mode) {
  auto block = m.shape;
  const auto d = static_cast<size_t>(m.dim);
  block[d] = muon::distributed::balanced_split_sizes(m.shape[d], tp.size())[static_cast<size_t>(tp.rank())];
  return RowShard(block, dp).tensor_parallel(muon::distributed::TensorParallelShard(m.shape, m.dim, tp), mode);
}

/// `part(k, init(k))` for each matrix k < n, requiring grad.
inline std::vector<at::Tensor> parts_of(size_t n, const std::function<at::Tensor(size_t)>& init, const Local& part) {
  std::vector<at::Tensor> params;
  for (size_t k = 0; k < n; ++k) params.push_back(part(k, init(k)).requires_grad_(true));
  return params;
}

/// Shards `params[k]` in `tp` as the tensor-parallel block of `matrices[k]` over `group`.
inline void shard_tensor_parallel(muon::distributed::TensorParallelOptions& tp, const std::vector<at::Tensor>& params,
                                  const std::vector<Matrix>& matrices, const Group& group) {
  for (size_t k = 0; k < matrices.size(); ++k) {
    tp.shard(params[k], muon::distributed::TensorParallelShard(matrices[k].shape, matrices[k].dim, group));
  }
}

/// Builds the optimizer under test over `params`: with `orthogonalizer`
/// (a layout's), or as one process when it is null.
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    const std::vector<at::Tensor>& params, std::shared_ptr<Orthogonalizer> orthogonalizer)>;

/// The parameters of one process after kSteps on the whole matrices.
inline std::vector<at::Tensor> single_process(const Factory& make) {
  std::vector<at::Tensor> params;
  for (size_t k = 0; k < kMatrices.size(); ++k) params.push_back(full_param(k).requires_grad_(true));
  auto opt = make(params, nullptr);
  for (int64_t s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < kMatrices.size(); ++k) params[k].mutable_grad() = full_grad(k, s);
    opt->step();
  }
  return params;
}

/// Steps `opt` kSteps times, parameter k's gradient this rank's part
/// `local(k, full)` of the whole gradient, then expects each parameter to be
/// the same part of one process's result `reference[k]`, within `tolerance`
/// of the whole matrix's largest |value| (empty parts pass); `what` names the run.
inline void expect_steps_equal(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params, const Local& local,
                               const std::vector<at::Tensor>& reference, double tolerance,
                               const std::string& what) {
  for (int64_t s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < kMatrices.size(); ++k) params[k].mutable_grad() = local(k, full_grad(k, s));
    opt.step();
  }
  for (size_t k = 0; k < kMatrices.size(); ++k) {
    const auto expected = local(k, reference[k].detach());
    if (expected.numel() == 0) continue;
    const double err =
        (params[k].detach() - expected).abs().max().item<double>() / reference[k].abs().max().item<double>();
    EXPECT_LE(err, tolerance) << what << " matrix " << k;
  }
}

/// Tensor-parallel blocks ("duplicated" and "distributed", world sizes 1–4)
/// equal one process's `reference`; `what` names the optimizer.
inline void expect_tensor_parallel_equal(const Factory& make, const std::vector<at::Tensor>& reference,
                                         double tolerance, const std::string& what) {
  for (const std::string tp_mode : {"duplicated", "distributed"}) {
    for (int world = 1; world <= 4; ++world) {
      run_ranks(world, [&](Group& group) {
        const auto part = tensor_parallel_part(kMatrices, group.rank(), world);
        auto params = parts_of(kMatrices.size(), full_param, part);
        muon::distributed::TensorParallelOptions tp;
        tp.mode(tp_mode);
        shard_tensor_parallel(tp, params, kMatrices, group);
        auto opt = make(params, muon::distributed::make_orthogonalizer(tp));
        expect_steps_equal(*opt, params, part, reference, tolerance,
            what + " tp " + tp_mode + " world " + std::to_string(world) + " rank " + std::to_string(group.rank()));
      });
    }
  }
}

/// Row shards ("owner_compute" and "replicated", world sizes 1–4; matrix 1
/// padded: the last rank holds rows past the end) equal one process's `reference`.
inline void expect_row_shards_equal(const Factory& make, const std::vector<at::Tensor>& reference, double tolerance,
                                    const std::string& what) {
  for (const std::string sharded_mode : {"owner_compute", "replicated"}) {
    for (int world = 1; world <= 4; ++world) {
      run_ranks(world, [&](Group& group) {
        std::vector<at::Tensor> params;
        std::vector<std::vector<int64_t>> rows;
        muon::distributed::ShardedOptions so;
        so.mode(sharded_mode);
        for (size_t k = 0; k < kMatrices.size(); ++k) {
          auto split = muon::distributed::balanced_split_sizes(kMatrices[k].shape[0], world);
          if (k == 1 && world > 1) split.back() += 2;
          rows.push_back(split);
          params.push_back(muon::distributed::local_rows(full_param(k), split, group.rank()).requires_grad_(true));
          so.shard(params.back(), RowShard(kMatrices[k].shape, group));
        }
        auto opt = make(params, muon::distributed::make_orthogonalizer(so));
        expect_steps_equal(
            *opt, params,
            [&](size_t k, const at::Tensor& full) { return muon::distributed::local_rows(full, rows[k], group.rank()); },
            reference, tolerance,
            what + " " + sharded_mode + " world " + std::to_string(world) + " rank " + std::to_string(group.rank()));
      });
    }
  }
}

/// The 2-D layout at 4 ranks, a (dp 2, tp 2) mesh: each tensor-parallel
/// block split by rows over dp, in each mode of `modes`, equals one
/// process's `reference`.
inline void expect_two_dimensional_equal(const Factory& make, const std::vector<at::Tensor>& reference,
                                         double tolerance, const std::string& what,
                                         const std::vector<muon::distributed::TensorParallelMode>& modes) {
  for (const auto tp_mode : modes) {
    run_ranks(4, [&](Group& world) {
      const auto [dp, tp] = world.mesh(2, 2);
      const auto part = two_d_part(kMatrices, dp, tp);
      auto params = parts_of(kMatrices.size(), full_param, part);
      muon::distributed::ShardedOptions so;
      for (size_t k = 0; k < kMatrices.size(); ++k) so.shard(params[k], two_d_shard(kMatrices[k], dp, tp, tp_mode));
      auto opt = make(params, muon::distributed::make_orthogonalizer(so));
      expect_steps_equal(*opt, params, part, reference, tolerance,
          what + " 2-D " + muon::distributed::to_string(tp_mode) + " rank " + std::to_string(world.rank()));
    });
  }
}

/// One rank's rows of tensors split over a group by balanced row counts
/// (the owner-compute optimizers' tests): the parameters, their RowShards
/// and the row counts.
struct RowParts {
  std::vector<at::Tensor> params;
  std::vector<RowShard> shards;
  std::vector<std::vector<int64_t>> rows;
  int rank;

  /// This rank's rows of `init(k)` for each whole shape of `shapes`.
  RowParts(const std::vector<std::vector<int64_t>>& shapes, const std::function<at::Tensor(size_t)>& init,
           const Group& group)
      : rank(group.rank()) {
    for (size_t k = 0; k < shapes.size(); ++k) {
      rows.push_back(muon::distributed::balanced_split_sizes(shapes[k][0], group.size()));
      params.push_back(leaf(local(k, init(k))));
      shards.emplace_back(shapes[k], group);
    }
  }

  /// This rank's rows of parameter k's whole tensor `whole`.
  at::Tensor local(size_t k, const at::Tensor& whole) const {
    return muon::distributed::local_rows(whole, rows[k], rank);
  }

  /// `steps` steps of `opt`, each parameter's gradient its rows of `grad(k, step)`.
  void train(torch::optim::Optimizer& opt, const std::function<at::Tensor(size_t, int64_t)>& grad,
             int64_t steps) {
    for (int64_t s = 0; s < steps; ++s) {
      for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = local(k, grad(k, s));
      opt.step();
    }
  }
};

/// `steps` steps of `opt` over the whole tensors `params`, gradients `grad(k, step)`.
inline void train_whole(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params,
                        const std::function<at::Tensor(size_t, int64_t)>& grad, int64_t steps) {
  for (int64_t s = 0; s < steps; ++s) {
    for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = grad(k, s);
    opt.step();
  }
}

/// Whole tensors of `shapes` for the row-shard tests: tensor k drawn from
/// seed init_seed + k, its gradient at step s from grad_seed + 11·s + k.
struct SeededMatrices {
  std::vector<std::vector<int64_t>> shapes;
  uint64_t init_seed = 0;
  uint64_t grad_seed = 0;

  at::Tensor init(size_t k) const { return seeded_randn(shapes[k], init_seed + k); }
  at::Tensor grad(size_t k, int64_t step) const {
    return seeded_randn(shapes[k], grad_seed + 11 * static_cast<uint64_t>(step) + k);
  }
};

/// The owner-compute optimizers' test of rows against one process: whole
/// tensors of `shapes` (values `init(k)`) stepped `steps` times by
/// `Single(whole, options)` in one process; then, at each world size of
/// `worlds`, each rank's RowParts of the same tensors stepped `steps` times by
/// `Sharded(params, shards, options)`, and `check(opt, parts, single, whole,
/// what)` on every rank (`what` names the run: `name` W=world rank r);
/// `after(world)`, when given, once all ranks of a world size are done.
template <typename Single, typename Sharded, typename Options>
void row_parts_against_one_process(
    const std::vector<std::vector<int64_t>>& shapes, const std::function<at::Tensor(size_t)>& init,
    const std::function<at::Tensor(size_t, int64_t)>& grad, int64_t steps, const Options& options,
    const std::vector<int>& worlds, const std::string& name,
    const std::function<void(Sharded&, RowParts&, Single&, std::vector<at::Tensor>&, const std::string&)>& check,
    const std::function<void(int)>& after = nullptr) {
  std::vector<at::Tensor> whole;
  for (size_t k = 0; k < shapes.size(); ++k) whole.push_back(leaf(init(k)));
  Single single(whole, options);
  train_whole(single, whole, grad, steps);
  for (const int world : worlds) {
    run_ranks(world, [&](Group& g) {
      RowParts parts(shapes, init, g);
      Sharded opt(parts.params, parts.shards, options);
      parts.train(opt, grad, steps);
      check(opt, parts, single, whole, name + " W=" + std::to_string(world) + " rank " + std::to_string(g.rank()));
    });
    if (after) after(world);
  }
}

/// row_parts_against_one_process over the tensors of `m`.
template <typename Single, typename Sharded, typename Options>
void row_parts_against_one_process(
    const SeededMatrices& m, int64_t steps, const Options& options, const std::vector<int>& worlds,
    const std::string& name,
    const std::function<void(Sharded&, RowParts&, Single&, std::vector<at::Tensor>&, const std::string&)>& check,
    const std::function<void(int)>& after = nullptr) {
  row_parts_against_one_process<Single, Sharded>(
      m.shapes, [&](size_t k) { return m.init(k); }, [&](size_t k, int64_t s) { return m.grad(k, s); }, steps,
      options, worlds, name, check, after);
}

/// An owner-compute Sharded against one process over `m` at 1 to 4 ranks,
/// `steps` steps: every rank's rows equal one process's bit for bit and
/// every rank counts the steps; the owner of a matrix holds its whole state,
/// `same(state, one process's)`, and every other rank `empty(state)`.
/// `state_of(opt, p)` is the test's state accessor.
template <typename Single, typename Sharded, typename Options, typename StateOf, typename Same, typename Empty>
void owner_compute_bit_for_bit(const SeededMatrices& m, int64_t steps, const Options& options,
                               const std::string& name, const StateOf& state_of, const Same& same,
                               const Empty& empty) {
  row_parts_against_one_process<Single, Sharded>(
      m, steps, options, {1, 2, 3, 4}, name,
      [&](Sharded& opt, RowParts& parts, Single& single, std::vector<at::Tensor>& whole, const std::string& what) {
        for (size_t k = 0; k < parts.params.size(); ++k) {
          EXPECT_TRUE(at::equal(parts.params[k].detach(), parts.local(k, whole[k].detach())))
              << what << " param " << k;
          const auto& st = state_of(opt, parts.params[k]);
          EXPECT_EQ(st.step(), steps) << what;
          if (opt.holds_whole_state(parts.params[k])) {
            EXPECT_TRUE(same(st, state_of(single, whole[k]))) << what << " state of param " << k;
          } else {
            EXPECT_TRUE(empty(st)) << what << " state of param " << k;
          }
        }
      });
}

}  // namespace muon::test::layouts
