// muon::distributed::distributed_newton_schulz against muon::newton_schulz on the
// whole matrix, with ranks as threads over real Gloo process groups: every
// coefficient set, fp32, fp64 and bf16 compute, row and column blocks.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "dist_util.h"
#include "muon/distributed/layouts/newton_schulz.h"
#include "muon/newton_schulz.h"
#include "tensor_parallel_util.h"

namespace muon::test {
namespace {

using muon::distributed::Group;

TEST(DistributedNewtonSchulz, MatchesNewtonSchulzForEveryCoefficientSetAndBf16) {
  const auto whole = gradient(0, 99, {20, 36});
  run_ranks(3, [&](Group& g) {
    for (const int64_t dim : {0, 1}) {
      const auto sizes = uneven_sizes(whole.size(dim), g.size());
      const auto block = block_of(whole, dim, sizes, g.rank());
      // Default schedule (quintic): within 1e-5 of one process (orthogonalized
      // entries are O(1/sqrt(20)); reordered fp32 sums stay far below that).
      const auto ref = block_of(muon::newton_schulz(whole), dim, sizes, g.rank());
      const auto got = muon::distributed::distributed_newton_schulz(block, dim, g);
      EXPECT_LE((got - ref).abs().max().item<double>() / ref.abs().max().item<double>(),
                kFp32Tolerance)
          << "dim " << dim;
      // Every coefficient set: as accurate as one process, measured against
      // an fp64 evaluation of the same schedule. Sets with large first
      // coefficients (cans: 8.5, −25, 18.6) amplify rounding, so fp32 runs
      // of either kind differ from each other by more than 1e-5 there.
      for (const auto& name : muon::coefficient_set_names()) {
        auto ns = muon::NewtonSchulzOptions().coefficients(name);
        auto ns64 = ns;
        ns64.compute_dtype(at::kDouble);
        const auto exact = block_of(muon::newton_schulz(whole.to(at::kDouble), ns64), dim, sizes,
                                    g.rank());
        const auto single = block_of(muon::newton_schulz(whole, ns), dim, sizes, g.rank());
        const auto dist = muon::distributed::distributed_newton_schulz(block, dim, g, ns);
        const double scale = exact.abs().max().item<double>();
        const double single_err = (single.to(at::kDouble) - exact).abs().max().item<double>() / scale;
        const double dist_err = (dist.to(at::kDouble) - exact).abs().max().item<double>() / scale;
        EXPECT_LE(dist_err, 3 * single_err + 1e-6) << name << " dim " << dim;
        // fp64 compute runs the same way: tight agreement.
        const auto dist64 = muon::distributed::distributed_newton_schulz(block.to(at::kDouble), dim, g, ns64);
        EXPECT_LE((dist64 - exact).abs().max().item<double>() / scale, 1e-10) << name;
      }
      // bf16 compute: within bf16 rounding (2⁻⁸ relative, a few steps) of fp32.
      auto ns16 = muon::NewtonSchulzOptions().compute_dtype(at::kBFloat16);
      const auto ref32 = block_of(muon::newton_schulz(whole), dim, sizes, g.rank());
      const auto got16 = muon::distributed::distributed_newton_schulz(block, dim, g, ns16);
      EXPECT_EQ(got16.scalar_type(), at::kFloat);
      EXPECT_LE((got16 - ref32).abs().max().item<double>() / ref32.abs().max().item<double>(), 0.05);
      // ... and at least as accurate as one process in bf16, by the RMS
      // error against fp64 over the whole matrix (squared errors summed over
      // the ranks; the max over a few rows is too noisy to compare): it runs
      // one process's own iteration with the Gram matrix summed in fp32, so
      // with the Gram of the short side (dim 1 here: 20×20) it equals one
      // process. A row split of this wide matrix iterates on the long side's
      // 36×36 Gram, whose bf16 product X·P rounds more: measured 1.8× one
      // process's RMS error, bound 2×.
      auto ns64 = muon::NewtonSchulzOptions().compute_dtype(at::kDouble);
      const auto exact = block_of(muon::newton_schulz(whole.to(at::kDouble), ns64), dim, sizes,
                                  g.rank());
      const auto single16 = block_of(muon::newton_schulz(whole, ns16), dim, sizes, g.rank());
      auto sq = at::stack({(single16.to(at::kDouble) - exact).pow(2).sum(),
                           (got16.to(at::kDouble) - exact).pow(2).sum()});
      g.all_reduce_(sq);
      const double rms_single16 = std::sqrt(sq[0].item<double>() / static_cast<double>(whole.numel()));
      const double rms_dist16 = std::sqrt(sq[1].item<double>() / static_cast<double>(whole.numel()));
      EXPECT_LE(rms_dist16, (dim == 1 ? 1.0 : 2.0) * rms_single16) << "dim " << dim << ": bf16 distributed RMS error "
                                          << rms_dist16 << " vs one process " << rms_single16;
    }
  });
}

TEST(DistributedNewtonSchulz, RejectsBadArguments) {
  auto single = Group::single();
  EXPECT_THROW(muon::distributed::distributed_newton_schulz(at::ones({3}), 0, single), c10::ValueError);
  EXPECT_THROW(muon::distributed::distributed_newton_schulz(at::ones({3, 4}), 2, single), c10::ValueError);
  EXPECT_THROW(muon::distributed::distributed_newton_schulz(at::ones({3, 4}, at::kLong), 0, single),
               c10::ValueError);
}

}  // namespace
}  // namespace muon::test
