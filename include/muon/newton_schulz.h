#pragma once

/// Newton–Schulz orthogonalization: the numerical core of Muon.
///
/// `newton_schulz(G)` approximates the polar factor U·Vᵀ of G = U·S·Vᵀ by a
/// fixed odd-polynomial iteration on the Frobenius-normalized input:
///
///     X₀ = G / (‖G‖_F · safety + eps)          (eps_mode add, the default)
///     X₀ = G / max(‖G‖_F · safety, eps)        (eps_mode clamp)
///     A  = X Xᵀ,   X ← a·X + (b·A + c·A²)·X          (one step, coefficients (a, b, c))
///
/// The coefficient schedule is a named set or a custom list. Each name
/// means the set it means in Megatron-Core and NVIDIA Emerging-Optimizers
/// (`coefficient_type`), with the same tuples, schedule and safety factor:
///
///   simple           Keller Jordan's tuple, repeated (Muon, torch.optim.Muon)
///   quintic          Jiacheng You's five tuples, cycled (Megatron-Core's default)
///   polar_express    Polar Express (Amsel et al. 2025), the paper's 8 steps,
///                    last repeats, safety 1.0 (alias: polar_express_8)
///   polar_express_5  the 5-step Polar Express of modded-nanogpt and nanochat,
///                    safety 1.02, last repeats (called `polar_express` by
///                    muon-cpp before this name existed)
///   cans             CANS (Chebyshev-accelerated Newton–Schulz), last repeats
///   aol              the AOL-preconditioned schedule, four tuples cycled
///   deepseekv4       DeepSeek-V4: simple ×8, then (2, −1.5, 0.5) ×2
///   cubic            the classical cubic (1.5, −0.5, 0), repeated
///   cubic5           Emerging-Optimizers' relaxed cubic: five (a, b, 0)
///                    tuples, cycled
///
/// Every method below evaluates the same polynomial schedule:
///
///  - standard: the iteration above on the short side (a tall matrix runs on
///    XᵀX with right multiplication, without a transposed copy). X·Xᵀ and
///    A·A use SYRK (CBLAS, CPU fp32/fp64; a blocked symmetric product on
///    other devices); B = b·A + c·A² is one fused SYRK; the step is one
///    GEMM X ← a·X + B·X with a·X kept out of the GEMM's sum. Its error
///    against an fp64 evaluation equals the plain formula's (within the
///    spread of equally valid summation orders).
///  - gram: Gram Newton–Schulz (Zhang, Amsel, Chen, Dao 2026) iterates on the
///    s×s Gram matrix R = XXᵀ and a polynomial accumulator Q and applies Q·X
///    once per phase (phases of at most three steps, the last of at most
///    two). Fewer FLOPs on wide matrices, but R squares the condition number:
///    in fp32 its error is up to ~9× the standard iteration's on
///    ill-conditioned inputs. For 16-bit compute its s×s state is kept in
///    fp32 and it is more accurate than the plain 16-bit formula.
///  - auto: gram for 16-bit compute when long side / short side >=
///    kGramMinAspect; standard otherwise (docs/benchmarks.md).
///
/// In 16-bit compute the normalization and the s×s polynomial are formed in
/// fp32 and rounded once (the polynomial's terms cancel heavily).
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "muon/enum_names.h"

/// The reference returned by `coefficient_set` is to a registry entry that
/// lives for the whole program, never to the name argument: g++ 14's
/// -Wdangling-reference guesses otherwise when the name is a temporary.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 14
#define MUON_NO_DANGLING [[gnu::no_dangling]]
#else
#define MUON_NO_DANGLING
#endif

namespace muon {

/// Coefficients of one Newton–Schulz step: X ← a·X + (b·A + c·A²)·X.
struct NsCoefficients {
  double a;
  double b;
  double c;
};

/// How a schedule shorter than the requested number of steps continues.
enum class StepSchedule {
  kCycle,       ///< step k uses entry k mod len
  kRepeatLast,  ///< step k uses entry min(k, len - 1)
};

/// A named (or custom) coefficient schedule.
struct CoefficientSet {
  std::string name;
  std::vector<NsCoefficients> coefficients;
  StepSchedule schedule = StepSchedule::kRepeatLast;
  /// Normalization safety factor s in X₀ = G / (‖G‖_F · s + eps).
  double safety_factor = 1.0;
  /// Steps used when the options do not set `steps`.
  int64_t default_steps = 5;
  /// One line: origin and behaviour.
  std::string description;

  /// The coefficients of step `k` (0-based) under this set's schedule.
  NsCoefficients at_step(int64_t k) const;
};

/// The built-in set called `name` (one of coefficient_set_names()) or by an
/// alias (coefficient_set_aliases()); an alias gives the set under its own
/// name, so options built from either compare equal and archive the same.
/// Unknown names raise a c10::ValueError that lists the names and aliases.
MUON_NO_DANGLING const CoefficientSet& coefficient_set(const std::string& name);

/// Names of the built-in coefficient sets, one per set, in documentation
/// order: simple, quintic, polar_express, polar_express_5, cans, aol,
/// deepseekv4, cubic, cubic5.
std::vector<std::string> coefficient_set_names();

/// Other names accepted for built-in sets, as (alias, set name) pairs:
/// ("polar_express_8", "polar_express"), the name of the 8-step set before
/// `polar_express` meant it in muon-cpp.
std::vector<std::pair<std::string, std::string>> coefficient_set_aliases();

/// Every name `coefficient_set` accepts: coefficient_set_names(), then the
/// aliases (the choices of the config's `muon_coefficient_type`).
std::vector<std::string> accepted_coefficient_set_names();

/// Where eps enters the normalization X₀ = G·f.
///
/// kAdd (default): f = 1 / (‖G‖_F·safety + eps), as Keller Jordan's Muon and
/// modded-nanogpt; every muon-cpp configuration and archive made before the
/// option existed uses it. kClamp: f = 1 / max(‖G‖_F·safety, eps), as
/// torch.optim.Muon and Emerging-Optimizers (F.normalize). The two agree to
/// eps/‖G‖_F relative in X₀ (1e-7/‖G‖_F with eps 1e-7): identical in
/// practice for ordinary gradients; after simple ×5, 1.6e-3 apart at
/// ‖G‖_F = 1e-4 and ~22% at 1e-7. Port a configuration with the mode of its
/// origin to get its numbers.
enum class NsEpsMode { kAdd, kClamp };

/// "add" | "clamp".
MUON_ENUM_NAMES(NsEpsMode, parse_ns_eps_mode);
/// "add", "clamp": every name parse_ns_eps_mode accepts.
std::vector<std::string> ns_eps_mode_names();

/// A custom set from (a, b, c) tuples. Each tuple must have length 3 and
/// finite values; the list must not be empty; safety_factor must be > 0.
CoefficientSet custom_coefficient_set(const std::vector<std::vector<double>>& tuples,
                                      StepSchedule schedule = StepSchedule::kCycle,
                                      double safety_factor = 1.0);

/// Which evaluation of the schedule `newton_schulz` runs.
enum class NewtonSchulzMethod { kAuto, kStandard, kGram };

/// "auto" | "standard" | "gram".
MUON_ENUM_NAMES(NewtonSchulzMethod, parse_newton_schulz_method);

/// `auto` chooses Gram Newton–Schulz for 16-bit compute when long side /
/// short side >= kGramMinAspect and the schedule has at least kGramMinSteps
/// steps. Measured break-even: docs/benchmarks.md.
constexpr double kGramMinAspect = 3.0;
constexpr int64_t kGramMinSteps = 3;
/// On CUDA, `auto` chooses Gram from this aspect instead: its s×s state
/// (fp32 for 16-bit compute) runs on fp32 products, ~15× slower per FLOP
/// than the bf16 tensor-core products of the standard method, which its
/// FLOPs saved outweigh from l/s ≈ 24 (docs/benchmarks.md).
constexpr double kGramMinAspectCuda = 24.0;
/// Default normalization epsilon.
constexpr double kDefaultNsEps = 1e-7;
/// Valid step counts: [kMinNsSteps, kMaxNsSteps).
constexpr int64_t kMinNsSteps = 1;
constexpr int64_t kMaxNsSteps = 100;

/// Options of `newton_schulz`, as chained setters. Setters validate their
/// argument and raise c10::ValueError naming it and its value.
class NewtonSchulzOptions {
 public:
  /// quintic ×5, eps 1e-7 added, fp32 compute, method auto, symmetric kernels on.
  NewtonSchulzOptions();

  /// A built-in coefficient set by name.
  NewtonSchulzOptions& coefficients(const std::string& name);
  /// A custom coefficient list (see custom_coefficient_set).
  NewtonSchulzOptions& coefficients(const std::vector<std::vector<double>>& tuples,
                                    StepSchedule schedule = StepSchedule::kCycle,
                                    double safety_factor = 1.0);
  /// An already-built set (e.g. from custom_coefficient_set).
  NewtonSchulzOptions& coefficient_set(CoefficientSet set);
  const CoefficientSet& coefficients() const { return set_; }

  /// Number of steps, in [1, 100). When unset, the set's default_steps.
  NewtonSchulzOptions& steps(int64_t steps);
  int64_t steps() const;
  bool steps_is_set() const { return steps_ > 0; }

  /// Normalization epsilon, > 0.
  NewtonSchulzOptions& eps(double eps);
  double eps() const { return eps_; }

  /// Where eps enters the normalization (NsEpsMode; add by default).
  NewtonSchulzOptions& eps_mode(NsEpsMode mode) {
    eps_mode_ = mode;
    return *this;
  }
  /// eps_mode by name: "add" | "clamp".
  NewtonSchulzOptions& eps_mode(const std::string& name);
  NsEpsMode eps_mode() const { return eps_mode_; }

  /// Compute dtype: kFloat (default), kBFloat16, kDouble, or kHalf (non-CPU
  /// devices). bf16 matrix products sum exact products in fp32 and round
  /// once: on CPU through oneDNN's bf16 matmul where it is native
  /// (AVX512_CORE_BF16, AMX), elsewhere (AVX2, AVX512_CORE) with the
  /// operands widened to fp32 on the fp32 kernels, the same arithmetic
  /// (newton_schulz_cpu_kernels says which). The normalization is computed
  /// in fp32.
  NewtonSchulzOptions& compute_dtype(at::ScalarType dtype);
  at::ScalarType compute_dtype() const { return compute_dtype_; }

  NewtonSchulzOptions& method(NewtonSchulzMethod method);
  NewtonSchulzOptions& method(const std::string& name);
  NewtonSchulzMethod method() const { return method_; }

  /// Use symmetric products (SYRK / blocked) for X·Xᵀ and A·A. Off gives
  /// plain GEMMs (same result up to rounding); kept for benchmarks.
  NewtonSchulzOptions& symmetric(bool on) {
    symmetric_ = on;
    return *this;
  }
  bool symmetric() const { return symmetric_; }

  /// The coefficients of every step, resolved from the set and `steps()`.
  std::vector<NsCoefficients> schedule() const;

  /// Re-checks every field (newton_schulz calls it).
  void validate() const;

  bool operator==(const NewtonSchulzOptions& other) const;
  bool operator!=(const NewtonSchulzOptions& other) const { return !(*this == other); }

 private:
  CoefficientSet set_;
  int64_t steps_ = 0;  // 0: the set's default
  double eps_ = kDefaultNsEps;
  NsEpsMode eps_mode_ = NsEpsMode::kAdd;
  at::ScalarType compute_dtype_ = at::kFloat;
  NewtonSchulzMethod method_ = NewtonSchulzMethod::kAuto;
  bool symmetric_ = true;
};

/// Orthogonalizes `x` (m×n, or a batch b×m×n of independent matrices) with
/// the Newton–Schulz schedule in `options`. Any floating dtype, contiguous or
/// not, any device; the result has x's shape, dtype and device and never
/// aliases x. An all-zero matrix gives zeros. Rejects other ranks, integer
/// dtypes and non-finite options with c10::ValueError.
at::Tensor newton_schulz(const at::Tensor& x, const NewtonSchulzOptions& options = {});

/// The method `auto` resolves to for a (batch of) m×n matrices on the CPU.
NewtonSchulzMethod resolve_method(int64_t rows, int64_t cols, const NewtonSchulzOptions& options);
/// The method `auto` resolves to for matrices on `device` (kGramMinAspectCuda
/// on CUDA, the CPU's rule elsewhere): what `newton_schulz` runs.
NewtonSchulzMethod resolve_method(int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                                  c10::Device device);

/// Whether this build has the library's CUDA kernels (CMake's MUON_CUDA):
/// cuBLAS products, symmetric products as upper tiles and Muon's fused
/// element-wise passes for CUDA tensors. Without them, CUDA tensors run on
/// LibTorch's own operations.
bool cuda_kernels_available();

/// One line naming what `newton_schulz` runs its CPU matrix products on for
/// `compute_dtype` on this machine and why: oneDNN or the BLAS for fp32;
/// for bf16, oneDNN's bf16 matmul where oneDNN has one on this CPU (under
/// ONEDNN_MAX_CPU_ISA), else the operands widened to fp32 (exact) on the
/// fp32 kernels with the result rounded once, the same arithmetic; and
/// oneDNN's instruction-set level. What explain() and muon_ns_probe print.
std::string newton_schulz_cpu_kernels(at::ScalarType compute_dtype);

/// Floating-point operations one call performs on a single m×n matrix with
/// `options` (method resolved), counting a SYRK as half a GEMM. Used by the
/// distributed layouts to balance work and by the benchmarks for GFLOP/s.
double newton_schulz_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options);
/// As newton_schulz_flops with the method resolved for matrices on `device`.
double newton_schulz_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                           c10::Device device);

/// Floating-point operations the CPU kernels perform for one such call: as
/// newton_schulz_flops, but each symmetric product at its kernel's real
/// share of a GEMM (a CBLAS SYRK half; oneDNN's k row panels (k + 1)/(2k),
/// so a whole product below 256 rows) and Gram's s×s state products
/// likewise. What benchmarks divide by a GEMM rate.
double newton_schulz_executed_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options);

/// FLOPs of the plain formula (three GEMMs per step) on one m×n matrix; the
/// denominator benchmarks use for "achieved GFLOP/s" of any method.
double newton_schulz_plain_flops(int64_t rows, int64_t cols, int64_t steps);

/// Newton–Schulz FLOPs performed by `newton_schulz` calls made on the calling
/// thread since the thread started or since the last reset
/// (`newton_schulz_flops` per matrix, summed over the batch). Thread-local,
/// so that ranks run as threads each see their own work; the distributed
/// layouts are tested with it to prove each matrix is orthogonalized once.
double newton_schulz_flops_on_this_thread();
/// Sets the calling thread's counter to zero.
void reset_newton_schulz_flops_on_this_thread();

}  // namespace muon
