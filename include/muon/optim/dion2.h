#pragma once

/// Dion2 and NorDion2 on `torch::optim`, with the arithmetic and defaults of
/// microsoft/dion (dion/dion2.py at commit
/// 00c2bc1b16bd5697f65a1584389070b0e14d11d6, dion/nordion2.py at
/// 2e9df450ac98d7c217613e9d1833f0aeed96ecbc, dion/normuon.py's
/// _normuon_normalization_core, the learning-rate adjustments of
/// dion/megabatch_base.py at 01287d7f41be34bbd9a7d8d42d9101a3419a607f).
///
/// Dion2 orthogonalizes only a fraction of each matrix per step. For a
/// matrix parameter X (rows × cols) with gradient G and momentum M:
///
///   1. M ← M + G                                 (plain accumulation)
///   2. select rows when rows ≤ cols, else columns (NorDion2: always rows);
///      norms = the L1 norm of each selected slice; k = max(1, ⌈fraction·n⌉)
///      slices of largest norm (n: rows or columns)
///   3. S = those slices of M; M[selected] ← ef_decay·S (error feedback)
///   4. O = NS(S)                                  (Newton–Schulz, polar_express_5 ×5)
///   NorDion2 only, per selected row i with V (rows × 1):
///      V_i ← lerp(V_i, mean_j O_ij², 1 − muon_beta2)
///      O' = O / (√V + 1e-8);  O' ← O'·‖O‖_F / max(‖O'‖_F, 1e-8)
///   5. X ← X·(1 − lr·weight_decay)
///   6. X[selected] ← X[selected] − adjusted_lr·O
///
/// adjusted_lr: spectral_norm lr·√(fan_out/fan_in), rms_norm
/// lr·0.2·√max(fan_out, fan_in), none lr; (fan_out, fan_in) are the last two
/// dims, or (dim 0, the product of the others) with `flatten`.
///
/// Shapes: a 2-D parameter is one matrix. With `flatten` false (Dion's
/// default) a parameter of 3 or more dims is a batch of matrices over its
/// last two dims (stacked experts (E, out, in): one selection and one NS per
/// expert; a conv weight (out, in, kh, kw): out·in matrices of kh × kw);
/// with `flatten` true it is one matrix (dim 0) × (the product of the others).
///
/// Top-k: the norms are exact integer sums of |M| in fixed point, 2^40 units
/// per the matrix's largest |M| (each |M_ij| rounded to a unit: the norms
/// differ from Dion's fp32 ones by less than n·2^-41 of that largest value),
/// so every grouping of the rows (every layout, every world size) gives the
/// same norms; the slices are sorted by descending norm with a stable sort,
/// so ties go to the lower index, and the k selected slices are taken in
/// ascending index order. The selection is a pure function of M's values,
/// the same in every layout (Dion's torch.topk leaves ties and order unspecified).
///
/// Deviations from Dion: Newton–Schulz runs in `ns_compute_dtype` (fp32 by
/// default; Dion casts the submatrix to bf16), with Dion's polar-express
/// coefficients (modded-nanogpt's 5-step set, safety 1.02: our
/// `polar_express_5`) and `epsilon` added to the norm; the norms' fixed
/// point and tie-breaking above; with `flatten` the selection is over the
/// flattened matrix's rows or columns (Dion's code selects along the last two
/// dims of the unflattened tensor and flattens only for Newton–Schulz). Dion's
/// sharded paths select along the shard dimension; here every layout selects
/// as one process does (equal to one process bit for bit).
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "muon/enum_names.h"
#include "muon/newton_schulz.h"
#include "muon/optim/listed_fields.h"
#include "muon/optim/settings_digest.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"

namespace muon {

/// How Dion2 scales lr for a matrix (Dion's adjust_lr).
enum class Dion2AdjustLr {
  kSpectralNorm,  ///< lr·√(fan_out/fan_in)
  kRmsNorm,       ///< lr·0.2·√max(fan_out, fan_in)
  kNone,          ///< lr
};

/// "spectral_norm" | "rms_norm" | "none".
MUON_ENUM_NAMES(Dion2AdjustLr, parse_dion2_adjust_lr);

/// Options of `muon::Dion2` (per parameter group), as chained setters, with
/// Dion's names and defaults. `nordion2` selects NorDion2 (then `ef_decay`
/// is NorDion2's `mu`); see NorDion2Options.
struct Dion2Options : public ListedOptions<Dion2Options> {
  MUON_OPTIONS(Dion2Options, 0.01,
               /// Fraction of the rows (or columns) orthogonalized per step, in (0, 1].
               (double, fraction, 0.25),
               /// Error-feedback decay of the selected slices of the momentum, in [0, 1] (NorDion2's mu).
               (double, ef_decay, 0.95),
               /// Decoupled weight decay X ← X·(1 − lr·weight_decay), >= 0.
               (double, weight_decay, 0.01),
               /// Newton–Schulz normalization epsilon (X / (‖X‖_F·1.02 + epsilon)), > 0.
               (double, epsilon, 1e-8),
               /// spectral_norm (default) | rms_norm | none.
               (Dion2AdjustLr, adjust_lr, Dion2AdjustLr::kSpectralNorm),
               /// One matrix (dim 0) × (the rest) for 3-D+ parameters, else a batch over the last two dims.
               (bool, flatten, false),
               /// NorDion2: rows always, NorMuon's per-row normalization of O.
               (bool, nordion2, false),
               /// NorDion2's variance decay, in [0, 1) (above 1 the variance turns negative).
               (double, muon_beta2, 0.95),
               /// Newton–Schulz coefficient set (a name of muon/newton_schulz.h).
               (std::string, ns_coefficients, "polar_express_5"),
               /// Newton–Schulz steps (0: the set's default, 5).
               (int64_t, ns_steps, 0),
               /// Newton–Schulz compute dtype: kFloat (default), kBFloat16 (Dion's), kDouble.
               (at::ScalarType, ns_compute_dtype, at::kFloat))
  /// adjust_lr by name.
  Dion2Options& adjust_lr(const std::string& name);
  /// The Newton–Schulz options these fields describe.
  NewtonSchulzOptions ns() const;
  /// "dion2" or "nordion2".
  const char* algorithm() const { return nordion2_ ? "nordion2" : "dion2"; }
  /// Checks every field; raises c10::ValueError "[muon::Dion2] <arg> must be ..., got <value>".
  void validate() const;
};

/// NorDion2's options with NorDion2's defaults (Dion's nordion2.py): Dion2Options with nordion2 on.
Dion2Options NorDion2Options(double lr = 0.01);

/// Per-parameter state of `muon::Dion2`: `momentum` of the parameter's
/// shape and dtype; NorDion2 adds `variance`, one value per row of each
/// matrix (the parameter's shape with the last dim 1; (dim 0, 1) with
/// flatten), in the parameter's dtype. Both split with the parameter's rows
/// (dim 0) in the sharded layout.
MUON_DEFINE_STATE(Dion2ParamState,
                  /// M, with error feedback.
                  momentum,
                  /// NorDion2's per-row second moment.
                  variance);

namespace detail {

/// The (batch, rows, cols) Dion2 sees a parameter of `shape` as (see the top of this header).
std::array<int64_t, 3> dion2_matrix_dims(at::IntArrayRef shape, bool flatten);
/// The shape of NorDion2's variance for a parameter of `shape`.
std::vector<int64_t> dion2_variance_shape(at::IntArrayRef shape, bool flatten);
/// lr adjusted for a parameter of `shape` (Dion's adjust_lr_spectral_norm / adjust_lr_rms_norm).
double dion2_adjusted_lr(at::IntArrayRef shape, const Dion2Options& options);

/// Dion2's step on one whole parameter, without the weight decay and the
/// update of X: M ← M + grad, the selection, error feedback, NS (and
/// NorDion2's normalization) as the top of this header says, creating the
/// state at its first step. Returns the update U of grad's shape: O (or O')
/// on the selected slices, zero elsewhere (X ← X·(1 − lr·wd) − adjusted_lr·U
/// is the rest of the step). One process and the layer-wise layout call it
/// on whole parameters; the sharded layout (muon::distributed::ShardedDion2) on
/// stacked matrices, and on split matrices runs its parts (the norms,
/// dion2_top_k, dion2_orthogonalize at the owner) on the same values.
at::Tensor dion2_update(const at::Tensor& grad, Dion2ParamState& state,
                        const Dion2Options& options);

/// k = max(1, ⌈fraction·n⌉).
int64_t dion2_k(double fraction, int64_t n);
/// The selection's norms of a batch of matrices `mv` (B × r × c): per matrix
/// b, Σ round(|M| · 2^40 / max[b]) over each row (`by_rows`, B × r) or each
/// column (B × c), int64 (0 where max[b] is 0 or not finite). Exact: partial
/// sums over any split of the rows add up to the same norms.
at::Tensor dion2_fixed_point_norms(const at::Tensor& mv, const at::Tensor& max, bool by_rows);
/// The k indices of the largest `norms` along the last dim, ties to the
/// lower index, in ascending order.
at::Tensor dion2_top_k(const at::Tensor& norms, int64_t k);
/// Newton–Schulz of the selected slices (B × a × b), and with `v_sel`
/// (NorDion2: B × k × 1, updated) NorMuon's normalization of the rows.
at::Tensor dion2_orthogonalize(const at::Tensor& selected, at::Tensor* v_sel,
                               const Dion2Options& options);

}  // namespace detail

/// Dion2 (or NorDion2, with Dion2Options::nordion2): a `torch::optim::Optimizer`
/// (see the top of this header). Parameters must have at least 2 dims.
///
///     muon::Dion2 opt(model->parameters(), muon::Dion2Options(0.01).fraction(0.25));
///     muon::Dion2 nor(model->parameters(), muon::NorDion2Options(0.01));
///
/// Every group's `nordion2` must equal the defaults' (one algorithm per
/// optimizer, as Dion's classes). `save`/`load` in LibTorch's optimizer
/// archive layout with the options beside it; an archive of another
/// optimizer (NorDion2's into Dion2 included) is refused.
class Dion2 : public torch::optim::Optimizer, public StateBytes, public StepGuard {
 public:
  /// Over `param_groups`; groups without options get `defaults`.
  explicit Dion2(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                 Dion2Options defaults = {});
  /// Over one group of `params`.
  explicit Dion2(std::vector<at::Tensor> params, Dion2Options defaults = {});

  /// One step on every parameter with a gradient; `closure`, if given, runs
  /// first with grad mode enabled and its loss is returned. The checks of
  /// muon/optim/step_guard.h run first.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Validates every group's options and parameters; raises c10::ValueError.
  void check_before_step() override;
  /// Writes options and state.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores what `save` wrote into a Dion2 of the same algorithm and group
  /// structure (raises otherwise, changing nothing).
  void load(torch::serialize::InputArchive& archive) override;
  /// Bytes held in the state tensors.
  int64_t state_bytes() const override;
  /// Whether this is NorDion2 (the defaults' nordion2).
  bool is_nordion2() const;

  /// The global shape of the whole parameter `param` is (a part of).
  virtual std::vector<int64_t> whole_shape(const at::Tensor& param) const;

 protected:
  /// For layouts: builds the optimizer and checks it.
  Dion2(std::vector<torch::optim::OptimizerParamGroup> param_groups, Dion2Options defaults,
        bool check);
  /// Steps every parameter with a gradient (after the step's checks).
  virtual void step_parameters();
  /// "[muon::Dion2] " or "[muon::NorDion2] ".
  const char* who() const;
};

}  // namespace muon
