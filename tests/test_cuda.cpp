// The GPU paths: Newton–Schulz's cuBLAS products and symmetric tiles, the
// tiled mirror, Muon's fused element-wise passes, every registry optimizer
// on CUDA tensors against the CPU, checkpoints of CUDA state loaded on the
// CPU and back, and a sharded layout over NCCL. Every test but the first
// two needs a GPU and is skipped without one (scripts/gpu-check.sh runs
// them on a lent GPU machine).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda.h"
#include "kernels/symmetric.h"
#include "muon/distributed/checkpoints/checkpoint.h"
#include "muon/muon.h"
#include "optim/muon_internal.h"
#include "reference.h"

#if MUON_TEST_CUDA_KERNELS
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace {

using muon::NewtonSchulzOptions;

#define MUON_NEEDS_GPU()                                                   \
  do {                                                                     \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";    \
    if (!muon::cuda_kernels_available()) GTEST_SKIP() << "built without MUON_CUDA"; \
  } while (0)

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const auto w = want.to(at::kDouble).cpu();
  return (got.to(at::kDouble).cpu() - w).norm().item<double>() /
         std::max(w.norm().item<double>(), 1e-300);
}

// A matrix with singular values spread over [1e-3, 1] (what Newton–Schulz
// sees in training: a few strong directions, many weak ones).
at::Tensor spread_matrix(int64_t batch, int64_t rows, int64_t cols, uint64_t seed) {
  at::manual_seed(seed);
  auto u = std::get<0>(at::linalg_qr(at::randn({batch, rows, rows}, at::kDouble)));
  auto v = std::get<0>(at::linalg_qr(at::randn({batch, cols, cols}, at::kDouble)));
  const int64_t s = std::min(rows, cols);
  auto sigma = at::logspace(0, -3, s, 10.0, at::kDouble);
  auto mid = at::zeros({batch, rows, cols}, at::kDouble);
  mid.narrow(1, 0, s).narrow(2, 0, s).diagonal(0, 1, 2).copy_(sigma.expand({batch, s}));
  return at::matmul(at::matmul(u, mid), v.transpose(1, 2)).to(at::kFloat);
}

TEST(CudaBuild, KernelsPresentExactlyInCudaBuilds) {
  EXPECT_EQ(muon::cuda_kernels_available(), MUON_TEST_CUDA_KERNELS != 0);
  EXPECT_EQ(muon::detail::cuda_kernels_built(), MUON_TEST_CUDA_KERNELS != 0);
}

TEST(CudaBuild, CpuTensorsAreNeverTakenByTheCudaKernels) {
  auto out = at::zeros({1, 4, 4});
  const auto a = at::randn({1, 4, 3});
  const auto b = at::randn({1, 3, 4});
  EXPECT_FALSE(muon::detail::cuda_matmul(out, a, b, 1.0, 0.0));
  EXPECT_FALSE(muon::detail::cuda_syrk_upper(out, a, false, 1.0, 0.0));
  EXPECT_FALSE(muon::detail::cuda_mirror(out));
  EXPECT_FALSE(muon::detail::cuda_fused_eligible(out));
  EXPECT_TRUE(at::equal(out, at::zeros({1, 4, 4})));
}

// ---- products ------------------------------------------------------------------

// |fl(Σ aᵢbᵢ) − Σ aᵢbᵢ| ≤ γ_k·Σ|aᵢbᵢ| with γ_k = k·u/(1 − k·u) for any
// summation order (Higham, Accuracy and Stability, §3.1): the bound every
// fp32-sum product obeys, whatever order cuBLAS sums in.
void expect_within_dot_bound(const at::Tensor& got, const at::Tensor& a, const at::Tensor& b,
                             int64_t k, double alpha, const at::Tensor& c = {}, double beta = 0) {
  const double u = std::ldexp(1.0, -24);
  const double gamma = static_cast<double>(k + 2) * u / (1 - static_cast<double>(k + 2) * u);
  const auto a64 = a.to(at::kDouble).cpu();
  const auto b64 = b.to(at::kDouble).cpu();
  auto want = alpha * at::matmul(a64, b64);
  auto mag = std::abs(alpha) * at::matmul(a64.abs(), b64.abs());
  if (c.defined()) {
    want = want + beta * c.to(at::kDouble).cpu();
    mag = mag + std::abs(beta) * c.to(at::kDouble).cpu().abs();
  }
  // + the output's own rounding (fp32: u; bf16: 2⁻⁹) of the result.
  const double out_u = got.scalar_type() == at::kBFloat16 ? std::ldexp(1.0, -9) : u;
  const auto bound = gamma * mag + out_u * want.abs() + 1e-30;
  const auto excess = ((got.to(at::kDouble).cpu() - want).abs() - bound).max().item<double>();
  EXPECT_LE(excess, 0.0);
}

TEST(CudaProducts, BlocksTransposesAndMixedDtypesWithinTheDotProductBound) {
  MUON_NEEDS_GPU();
  at::manual_seed(1);
  const auto dev = at::Device(at::kCUDA);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto a = at::randn({3, 96, 200}).to(dtype).to(dev);
    const auto bt = at::randn({3, 72, 200}).to(dtype).to(dev);  // b = btᵀ: a transposed view
    auto big = at::randn({3, 130, 90}, dev);
    const auto before = big.clone();
    auto block = big.narrow(1, 20, 96).narrow(2, 10, 72);  // leading dimension 90
    const auto c = block.clone();
    ASSERT_TRUE(muon::detail::cuda_matmul(block, a, bt.transpose(1, 2), 0.5, 2.0));
    expect_within_dot_bound(block, a, bt.transpose(1, 2), 200, 0.5, c, 2.0);
    // Only the block was written.
    auto outside = big.clone();
    outside.narrow(1, 20, 96).narrow(2, 10, 72).copy_(c);
    EXPECT_TRUE(at::equal(outside, before));
  }
}

TEST(CudaProducts, SymmetricTilesAreExactlySymmetricAndWithinTheBound) {
  MUON_NEEDS_GPU();
  const auto dev = at::Device(at::kCUDA);
  for (const int64_t s : {1024, 1280, 1536}) {  // 2 tiles of 512, 5 of 256, 3 of 512
    ASSERT_GT(muon::detail::cuda_tiles(s), 1) << s;
    for (const bool trans : {false, true}) {
      at::manual_seed(s);
      const auto x = (trans ? at::randn({2, 300, s}) : at::randn({2, s, 300})).to(dev);
      auto out = at::empty({2, s, s}, dev);
      muon::detail::syrk(out, x, trans, 1.0, 0.0, /*symmetric_kernels=*/true);
      EXPECT_TRUE(at::equal(out, out.transpose(1, 2))) << s;
      const auto op = trans ? x.transpose(1, 2) : x;
      expect_within_dot_bound(out, op, op.transpose(1, 2), 300, 1.0);
    }
  }
}

TEST(CudaProducts, SymmetrizeRoundsOnceAndMatchesTheCpu) {
  MUON_NEEDS_GPU();
  at::manual_seed(3);
  const auto upper_cpu = at::randn({3, 100, 100});  // 100: tiles of 32 with a ragged edge
  auto cpu_upper = upper_cpu.clone();
  auto cpu_out = at::empty({3, 100, 100}, at::kBFloat16);
  muon::detail::symmetric_from_upper(cpu_out, cpu_upper, 0.5);
  auto gpu_upper = upper_cpu.cuda();
  auto gpu_out = at::empty({3, 100, 100}, at::TensorOptions(at::kBFloat16).device(at::kCUDA));
  muon::detail::symmetric_from_upper(gpu_out, gpu_upper, 0.5);
  EXPECT_TRUE(at::equal(gpu_out.cpu(), cpu_out));      // both round to nearest even once
  EXPECT_TRUE(at::equal(gpu_upper.cpu(), cpu_upper));  // left whole and shifted
  auto mirrored = upper_cpu.to(at::kBFloat16).cuda();
  muon::detail::mirror_upper_to_lower(mirrored);
  auto want = upper_cpu.to(at::kBFloat16);
  muon::detail::mirror_upper_to_lower(want);
  EXPECT_TRUE(at::equal(mirrored.cpu(), want));
}

// ---- Newton–Schulz -------------------------------------------------------------

struct Shape {
  int64_t batch, rows, cols;
};

const std::vector<Shape> kShapes = {{1, 1024, 1024}, {1, 2048, 512}, {1, 512, 2048},
                                    {1, 1536, 1024}, {8, 256, 256},  {1, 64, 2048}};

// For each of kShapes: `body(shape, x, opts, want)` with x a spread matrix
// of that shape (seed `seed`), opts Newton–Schulz computing in `dtype`, and
// want the fp64 reference of newton_schulz(x, opts).
template <typename Body>
void for_every_shape(uint64_t seed, at::ScalarType dtype, const Body& body) {
  for (const auto& sh : kShapes) {
    const auto x = spread_matrix(sh.batch, sh.rows, sh.cols, seed);
    const auto opts = NewtonSchulzOptions().compute_dtype(dtype);
    body(sh, x, opts, muon::test::reference_newton_schulz(x, opts));
  }
}

// fp32: the GPU runs the CPU's products with fp32 sums in another order;
// their errors against fp64 are the same arithmetic's, so within 2× of each
// other plus a few units of fp32 rounding.
TEST(CudaNewtonSchulz, Fp32MatchesTheCpuAgainstFp64OnEveryShape) {
  MUON_NEEDS_GPU();
  for_every_shape(11, at::kFloat,
                  [](const Shape& sh, const at::Tensor& x, const NewtonSchulzOptions& opts,
                     const at::Tensor& want) {
                    const double cpu = rel_err(muon::newton_schulz(x, opts), want);
                    const auto gpu_out = muon::newton_schulz(x.cuda(), opts);
                    ASSERT_TRUE(gpu_out.is_cuda());
                    const double gpu = rel_err(gpu_out, want);
                    EXPECT_LE(gpu, 2 * cpu + 1e-6) << sh.rows << "x" << sh.cols << " cpu " << cpu;
                  });
}

// bf16: no worse than the plain formula in bf16 run by LibTorch on the same
// GPU (what torch.optim.Muon and Keller Jordan's Muon compute), with 10%
// for the two's different roundings of the same terms.
TEST(CudaNewtonSchulz, Bf16NoWorseThanThePlainFormulaOnTheGpu) {
  MUON_NEEDS_GPU();
  for_every_shape(12, at::kBFloat16,
                  [](const Shape& sh, const at::Tensor& x, const NewtonSchulzOptions& opts,
                     const at::Tensor& want) {
                    const auto plain = muon::test::reference_newton_schulz(
                        x.cuda(), opts, at::kBFloat16);  // LibTorch's bf16 ops
                    const double ours = rel_err(muon::newton_schulz(x.cuda(), opts), want);
                    EXPECT_LE(ours, 1.1 * rel_err(plain, want)) << sh.rows << "x" << sh.cols;
                  });
}

TEST(CudaNewtonSchulz, EveryCoefficientSetAndBothMethods) {
  MUON_NEEDS_GPU();
  const auto x = spread_matrix(1, 384, 1536, 13);
  for (const auto& name : muon::coefficient_set_names()) {
    for (const auto method : {muon::NewtonSchulzMethod::kStandard, muon::NewtonSchulzMethod::kGram}) {
      for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        auto opts = NewtonSchulzOptions().coefficients(name).method(method).compute_dtype(dtype);
        const auto want = muon::test::reference_newton_schulz(x, opts);
        const double cpu = rel_err(muon::newton_schulz(x, opts), want);
        const double gpu = rel_err(muon::newton_schulz(x.cuda(), opts), want);
        // bf16: the GPU keeps α = a (no diagonal shift), up to one more
        // rounding of the output (2⁻⁹) per step on top of the CPU's error.
        const double slack = dtype == at::kFloat ? 1e-6 : 5 * std::ldexp(1.0, -9);
        EXPECT_LE(gpu, 2 * cpu + slack) << name << " " << muon::to_string(method);
      }
    }
  }
}

TEST(CudaNewtonSchulz, AutoChoosesGramOnlyFromTheCudaAspect) {
  const auto opts = NewtonSchulzOptions().compute_dtype(at::kBFloat16);
  const auto cuda = at::Device(at::kCUDA);
  EXPECT_EQ(muon::resolve_method(512, 2048, opts, cuda), muon::NewtonSchulzMethod::kStandard);
  EXPECT_EQ(muon::resolve_method(64, 2048, opts, cuda), muon::NewtonSchulzMethod::kGram);
  EXPECT_EQ(muon::resolve_method(512, 2048, opts, at::Device(at::kCPU)),
            muon::NewtonSchulzMethod::kGram);
}

// ---- optimizers ----------------------------------------------------------------

using Named = torch::OrderedDict<std::string, at::Tensor>;

Named make_params(at::ScalarType dtype, const at::Device& device) {
  at::manual_seed(21);
  Named named;
  named.insert("embed.weight", at::randn({64, 48}).to(dtype));
  named.insert("blocks.0.attn.weight", at::randn({96, 48}).to(dtype) * 0.1);
  named.insert("blocks.0.mlp.weight", at::randn({48, 192}).to(dtype) * 0.1);
  named.insert("blocks.0.mlp.bias", at::randn({48}).to(dtype) * 0.1);
  named.insert("head.weight", at::randn({64, 48}).to(dtype) * 0.1);
  for (auto& item : named) item.value() = item.value().to(device).requires_grad_(true);
  return named;
}

void set_grads(Named& named, int step) {
  for (auto& item : named) {
    at::manual_seed(1000 + step * 17 + static_cast<uint64_t>(item.value().numel()));
    item.value().mutable_grad() =
        at::randn(item.value().sizes()).to(item.value().scalar_type()).to(item.value().device());
  }
}

// Runs 3 steps of `name` from the registry and returns the parameters' change.
std::vector<at::Tensor> registry_updates(const std::string& name, at::ScalarType dtype,
                                         const at::Device& device) {
  auto named = make_params(dtype, device);
  std::vector<at::Tensor> before;
  for (const auto& item : named) before.push_back(item.value().detach().clone());
  muon::OptimizerConfig config;
  config.set("optimizer", name);
  auto opt = muon::make_optimizer(named, config);
  for (int k = 0; k < 3; ++k) {
    set_grads(named, k);
    opt->step();
  }
  std::vector<at::Tensor> updates;
  size_t i = 0;
  for (const auto& item : named) updates.push_back(item.value().detach() - before[i++]);
  return updates;
}

// Each registry optimizer on CUDA against the same optimizer on fp64 CPU
// parameters: within 4× the CPU fp32 run's own error (the same arithmetic
// in another order) plus fp32 rounding of the updates.
TEST(CudaOptimizers, EveryRegistryOptimizerMatchesTheCpu) {
  MUON_NEEDS_GPU();
  for (const auto& name : muon::OptimizerRegistry::global().keys()) {
    const auto ref = registry_updates(name, at::kDouble, at::Device(at::kCPU));
    const auto cpu = registry_updates(name, at::kFloat, at::Device(at::kCPU));
    const auto gpu = registry_updates(name, at::kFloat, at::Device(at::kCUDA));
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(gpu[i].is_cuda()) << name;
      const double e_cpu = rel_err(cpu[i], ref[i]);
      const double e_gpu = rel_err(gpu[i], ref[i]);
      EXPECT_LE(e_gpu, 4 * e_cpu + 1e-5) << name << " parameter " << i << " cpu " << e_cpu;
    }
  }
}

TEST(CudaOptimizers, MuonRunsItsFusedPassesOnTheGpu) {
  MUON_NEEDS_GPU();
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    std::vector<at::Tensor> results[2];
    for (const bool gpu : {false, true}) {
      const auto dev = gpu ? at::Device(at::kCUDA) : at::Device(at::kCPU);
      at::manual_seed(5);
      std::vector<at::Tensor> params = {at::randn({256, 512}), at::randn({256, 512}),
                                        at::randn({128, 128}), at::randn({4, 64, 32})};
      for (auto& p : params) p = p.to(dev).requires_grad_(true);
      muon::Muon opt(params, muon::MuonOptions(0.02).weight_decay(0.1).ns(
                                 NewtonSchulzOptions().compute_dtype(dtype)));
      const auto batches = muon::detail::fused_batches_run();
      for (int k = 0; k < 5; ++k) {
        for (size_t i = 0; i < params.size(); ++i) {
          at::manual_seed(100 + k * 10 + static_cast<uint64_t>(i));
          params[i].mutable_grad() = at::randn(params[i].sizes()).to(dev);
        }
        opt.step();
      }
      EXPECT_GT(muon::detail::fused_batches_run(), batches) << "gpu " << gpu;
      for (auto& p : params) results[gpu ? 1 : 0].push_back(p.detach().cpu());
    }
    // Five steps of lr 0.02 move each weight by ~0.1; the two runs differ by
    // the Newton–Schulz outputs' rounding (fp32: ~1e-6, bf16: 2⁻⁹ of each
    // update), far below it.
    const double tol = dtype == at::kFloat ? 1e-5 : 5 * 0.02 * std::ldexp(1.0, -8);
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_LE((results[1][i] - results[0][i]).abs().max().item<double>(), tol) << i;
    }
  }
}

// ---- checkpoints and NCCL ------------------------------------------------------

TEST(CudaCheckpoints, CudaStateLoadsOnTheCpuAndBack) {
  MUON_NEEDS_GPU();
  const auto dir = std::filesystem::temp_directory_path() / "muon_test_cuda_checkpoint";
  std::filesystem::remove_all(dir);
  auto gpu = make_params(at::kFloat, at::Device(at::kCUDA));
  muon::OptimizerConfig config;
  auto gpu_opt = muon::make_optimizer(gpu, config);
  set_grads(gpu, 0);
  gpu_opt->step();
  muon::distributed::save_checkpoint((dir / "a").string(), gpu, *gpu_opt, 1);
  auto cpu = make_params(at::kFloat, at::Device(at::kCPU));
  auto cpu_opt = muon::make_optimizer(cpu, config);
  muon::distributed::load_checkpoint((dir / "a").string(), cpu, *cpu_opt);
  for (const auto& item : gpu) EXPECT_TRUE(at::equal(item.value().cpu(), cpu[item.key()]));
  set_grads(gpu, 1);
  set_grads(cpu, 1);
  gpu_opt->step();
  cpu_opt->step();
  muon::distributed::save_checkpoint((dir / "b").string(), cpu, *cpu_opt, 2);
  auto back = make_params(at::kFloat, at::Device(at::kCUDA));
  auto back_opt = muon::make_optimizer(back, config);
  EXPECT_EQ(muon::distributed::load_checkpoint((dir / "b").string(), back, *back_opt).step, 2);
  for (const auto& item : back) {
    EXPECT_TRUE(item.value().is_cuda());
    EXPECT_TRUE(at::equal(item.value().cpu(), cpu[item.key()]));
    // The step after the first ran on each device: the two differ by rounding only.
    EXPECT_LE((gpu[item.key()].cpu() - cpu[item.key()]).abs().max().item<double>(), 1e-5);
  }
  std::filesystem::remove_all(dir);
}

#if MUON_TEST_CUDA_KERNELS
TEST(CudaNccl, ShardedLayoutOverNcclEqualsOneProcessMuon) {
  MUON_NEEDS_GPU();
  auto store = c10::make_intrusive<c10d::HashStore>();
  // A process group as torch.distributed makes one: NCCL as its CUDA backend.
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, 0, 1);
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, 0, 1);
  pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  auto group = muon::distributed::Group::wrap(pg);
  EXPECT_EQ(group.backend_name(), "nccl");
  auto named = make_params(at::kFloat, at::Device(at::kCUDA));
  auto plain = make_params(at::kFloat, at::Device(at::kCUDA));
  muon::OptimizerConfig config;
  muon::distributed::ShardedDataParallel dp(named, config, group);
  auto plain_opt = muon::make_optimizer(plain, config);
  for (int k = 0; k < 3; ++k) {
    set_grads(named, k);
    set_grads(plain, k);
    dp.step();
    plain_opt->step();
  }
  for (const auto& item : named) {
    EXPECT_LE((item.value() - plain[item.key()]).abs().max().item<double>(), 1e-6) << item.key();
  }
}
#endif

}  // namespace
