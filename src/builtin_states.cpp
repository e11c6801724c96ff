// The state schemas of the built-in optimizers.
#include "builtin_states.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "muon/optim/adaptive_muon.h"
#include "muon/optim/dion.h"
#include "muon/optim/dion2.h"
#include "muon/optim/iso.h"
#include "muon/optim/kl_soap.h"
#include "muon/optim/laprop.h"
#include "muon/optim/oblique.h"
#include "muon/optim/signum.h"
#include "muon/optim/sim_ademamix.h"
#include "muon/optim/lion.h"
#include "muon/optim/moso.h"
#include "muon/optim/psgd_pro.h"
#include "muon/optim/muon.h"
#include "muon/optim/soap.h"
#include "muon/scaling.h"

namespace muon::detail {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;

template <typename S>
StateField step_of() {
  return StateField::counter_of<S>("step", [](S& s) -> int64_t& { return s.step(); });
}

// A field of the whole matrix (Opt::whole_matrix_dims: rows m, cols n; its
// shape `shape(m, n)`), held whole by the process that steps it (the owner
// in the sharded layout: Opt::holds_whole_state).
template <typename S, typename Opt, typename Get, typename Shape>
StateField owner_field(std::string name, Get get, Shape shape, StateDtype dtype, StateInit init) {
  auto f = StateField::tensor_of<S>(std::move(name), get, init);
  f.shape = StateShape::kWhole;
  f.dtype = dtype;
  f.split = StateSplit::kOwner;
  f.held = [](const Optimizer& opt, const at::Tensor& param) {
    return static_cast<const Opt&>(opt).holds_whole_state(param);
  };
  f.whole_shape = [shape](const Optimizer& opt, const at::Tensor& param) {
    const auto [rows, cols] = static_cast<const Opt&>(opt).whole_matrix_dims(param);
    return shape(rows, cols);
  };
  return f;
}

// The shape of a whole-matrix field from the matrix's (rows, cols).
using WholeShape = std::function<std::vector<int64_t>(int64_t, int64_t)>;

// Shapes of owner_field: the matrix, its rows' or columns' square, and the
// square of its smaller side.
std::vector<int64_t> matrix_shape(int64_t rows, int64_t cols) { return {rows, cols}; }
std::vector<int64_t> rows_square(int64_t rows, int64_t /*cols*/) { return {rows, rows}; }
std::vector<int64_t> cols_square(int64_t /*rows*/, int64_t cols) { return {cols, cols}; }
std::vector<int64_t> smaller_square(int64_t rows, int64_t cols) {
  const auto k = std::min(rows, cols);
  return {k, k};
}

// Adds to `s` the buffers the ListedParamState S lists (kBuffers, in their
// order), each the field `field(name, get)` makes of its name and getter.
template <typename S, typename Field>
void add_listed_buffers(StateSchema& s, const Field& field) {
  for (size_t i = 0; i < S::kBuffers.size(); ++i) {
    s.add(field(std::string(S::kBuffers[i]), [i](S& st) -> at::Tensor& { return *st.buffers()[i]; }));
  }
}

// The state of an element-wise optimizer Opt: its step and the buffers its
// ListedParamState S lists, each of the parameter's shape, zeros at first use.
template <typename S, typename Opt>
StateSchema listed_state() {
  auto s = StateSchema::of<S>();
  s.is_kind = StateSchema::is_a<Opt>();
  s.add(step_of<S>());
  add_listed_buffers<S>(s, [](const std::string& name, auto get) { return StateField::tensor_of<S>(name, get); });
  return s;
}

// The state of a whole-matrix optimizer Opt (Opt::whole_matrix_dims): its
// step and the buffers S lists, each of the shape `shapes` gives its name,
// fp32 or wider, made by the first step.
template <typename S, typename Opt>
StateSchema whole_matrix_state(const std::map<std::string, WholeShape>& shapes) {
  auto s = StateSchema::of<S>();
  s.is_kind = StateSchema::is_a<Opt>();
  s.add(step_of<S>());
  add_listed_buffers<S>(s, [&shapes](const std::string& name, auto get) {
    return owner_field<S, Opt>(name, get, shapes.at(name), StateDtype::kFloat32Wide, StateInit::kOnFirstUse);
  });
  return s;
}

// Adam's and AdamW's: LibTorch's state, max_exp_avg_sq only under amsgrad.
template <typename O, typename S, typename Options>
StateSchema adam_like() {
  auto s = StateSchema::of<S>();
  s.is_kind = StateSchema::is_a<O>();
  s.add(step_of<S>());
  s.add(StateField::tensor_of<S>("exp_avg", [](S& st) -> at::Tensor& { return st.exp_avg(); }));
  s.add(StateField::tensor_of<S>("exp_avg_sq", [](S& st) -> at::Tensor& { return st.exp_avg_sq(); }));
  auto max = StateField::tensor_of<S>("max_exp_avg_sq", [](S& st) -> at::Tensor& { return st.max_exp_avg_sq(); });
  max.present = [](const Optimizer&, const OptimizerOptions& o) {
    return static_cast<const Options&>(o).amsgrad();
  };
  s.add(std::move(max));
  return s;
}

}  // namespace

StateSchema muon_state() {
  auto s = StateSchema::of<MuonParamState>();
  s.is_kind = StateSchema::is_a<Muon>();
  s.add(step_of<MuonParamState>());
  s.add(StateField::tensor_of<MuonParamState>(
      "momentum_buffer", [](MuonParamState& st) -> at::Tensor& { return st.momentum_buffer(); }));
  return s;
}

StateSchema adaptive_muon_state() {
  using S = AdaptiveMuonParamState;
  auto s = StateSchema::of<S>();
  s.is_kind = StateSchema::is_a<AdaptiveMuon>();
  s.add(step_of<S>());
  s.add(StateField::tensor_of<S>("momentum_buffer", [](S& st) -> at::Tensor& { return st.momentum_buffer(); }));
  // (rows, 1) for normuon and namo, (rows, cols) for adamuon: fp32, made by the first step.
  auto second = StateField::tensor_of<S>("second_moment", [](S& st) -> at::Tensor& { return st.second_moment(); },
                                         StateInit::kOnFirstUse);
  second.shape = StateShape::kRows;
  second.dtype = StateDtype::kFloat32Wide;
  second.shape_of = [](const Optimizer& opt, at::IntArrayRef shape) {
    const auto [rows, cols] = matrix_dims(shape);
    const bool per_row = static_cast<const AdaptiveMuon&>(opt).adaptive_options().mode() != AdaptiveMode::kAdaMuon;
    return std::vector<int64_t>{rows, per_row ? 1 : cols};
  };
  second.shape_note = [](const Optimizer& opt) {
    return "mode " + to_string(static_cast<const AdaptiveMuon&>(opt).adaptive_options().mode());
  };
  s.add(std::move(second));
  return s;
}

StateSchema adam_state() {
  return adam_like<torch::optim::Adam, torch::optim::AdamParamState, torch::optim::AdamOptions>();
}

StateSchema adamw_state() {
  return adam_like<torch::optim::AdamW, torch::optim::AdamWParamState, torch::optim::AdamWOptions>();
}

StateSchema sgd_state() {
  using S = torch::optim::SGDParamState;
  auto s = StateSchema::of<S>();
  s.is_kind = StateSchema::is_a<torch::optim::SGD>();
  // Made by the first step with momentum; no counter.
  s.add(StateField::tensor_of<S>("momentum_buffer", [](S& st) -> at::Tensor& { return st.momentum_buffer(); },
                                 StateInit::kOnFirstUse));
  return s;
}

StateSchema lion_state() { return listed_state<LionParamState, Lion>(); }

StateSchema laprop_state() { return listed_state<LaPropParamState, LaProp>(); }

StateSchema oblique_sgd_state() { return listed_state<ObliqueSGDParamState, ObliqueSGD>(); }

StateSchema oblique_adam_state() { return listed_state<ObliqueAdamParamState, ObliqueAdam>(); }

StateSchema signum_state() { return listed_state<SignumParamState, Signum>(); }

StateSchema sim_ademamix_state() { return listed_state<SimAdEMAMixParamState, SimAdEMAMix>(); }

StateSchema soap_state() {
  using S = SoapParamState;
  auto s = StateSchema::of<S>();
  s.is_kind = StateSchema::is_a<Soap>();
  s.add(step_of<S>());
  // Every tensor is of the whole matrix (Soap::whole_matrix_dims). L and R
  // exist for matrices (L alone for a 1-D parameter with precondition_1d):
  // made by the first step, as the bases by the first refresh.
  // Adam's moments are of the parameter's dtype, zeros at first; the
  // factors and bases fp32 or wider.
  const std::map<std::string, WholeShape> shapes{{"exp_avg", matrix_shape}, {"exp_avg_sq", matrix_shape},
                                                 {"L", rows_square},        {"R", cols_square},
                                                 {"Q_L", rows_square},      {"Q_R", cols_square}};
  add_listed_buffers<S>(s, [&shapes](const std::string& name, auto get) {
    const bool adam = name == "exp_avg" || name == "exp_avg_sq";
    return owner_field<S, Soap>(name, get, shapes.at(name), adam ? StateDtype::kParam : StateDtype::kFloat32Wide,
                                adam ? StateInit::kZeros : StateInit::kOnFirstUse);
  });
  return s;
}

StateSchema dion2_state(const bool nordion2) {
  using S = Dion2ParamState;
  auto s = StateSchema::of<S>();
  s.is_kind = [nordion2](const Optimizer& opt) {
    const auto* d = dynamic_cast<const Dion2*>(&opt);
    return d != nullptr && d->is_nordion2() == nordion2;
  };
  s.add(step_of<S>());
  // Both split with the parameter's rows: the momentum has its shape, the
  // variance one value per row of each matrix (as the defaults' flatten).
  s.add(StateField::tensor_of<S>("momentum", [](S& st) -> at::Tensor& { return st.momentum(); }));
  if (nordion2) {
    auto v = StateField::tensor_of<S>("variance", [](S& st) -> at::Tensor& { return st.variance(); });
    v.shape = StateShape::kRows;
    v.shape_of = [](const Optimizer& opt, at::IntArrayRef shape) {
      return dion2_variance_shape(shape, static_cast<const Dion2Options&>(opt.defaults()).flatten());
    };
    v.shape_note = [](const Optimizer& opt) {
      return std::string(static_cast<const Dion2Options&>(opt.defaults()).flatten() ? "flatten: rows x 1"
                                                                                     : "rows x 1 per matrix");
    };
    s.add(std::move(v));
  }
  return s;
}

StateSchema dion_state() {
  using S = DionParamState;
  auto s = StateSchema::of<S>();
  s.is_kind = StateSchema::is_a<Dion>();
  s.add(step_of<S>());
  // M splits with the parameter's rows; Q is of the whole matrix
  // (Dion::q_shape), held by one process (the owner in the sharded layout)
  // and drawn by the first step.
  s.add(StateField::tensor_of<S>("momentum", [](S& st) -> at::Tensor& { return st.momentum(); }));
  auto q = StateField::tensor_of<S>("Q", [](S& st) -> at::Tensor& { return st.Q(); }, StateInit::kOnFirstUse);
  q.shape = StateShape::kWhole;
  q.split = StateSplit::kOwner;
  q.held = [](const Optimizer& opt, const at::Tensor& param) {
    return static_cast<const Dion&>(opt).holds_whole_state(param);
  };
  q.whole_shape = [](const Optimizer& opt, const at::Tensor& param) {
    return static_cast<const Dion&>(opt).q_shape(param);
  };
  s.add(std::move(q));
  return s;
}

StateSchema iso_state() {
  // Of the m × n matrix, k = min(m, n): U (m × k), Σ (k), V (n × k) and
  // the momenta of U and V.
  const WholeShape left = [](int64_t rows, int64_t cols) { return std::vector<int64_t>{rows, std::min(rows, cols)}; };
  const WholeShape right = [](int64_t rows, int64_t cols) { return std::vector<int64_t>{cols, std::min(rows, cols)}; };
  const WholeShape sigma = [](int64_t rows, int64_t cols) { return std::vector<int64_t>{std::min(rows, cols)}; };
  return whole_matrix_state<IsoParamState, Iso>(
      {{"u", left}, {"sigma", sigma}, {"v", right}, {"momentum_u", left}, {"momentum_v", right}});
}

StateSchema moso_state() {
  // The moments of the m × n matrix; M and Q_M of its smaller side.
  return whole_matrix_state<MosoParamState, Moso>({{"momentum_buffer", matrix_shape},
                                                   {"exp_avg_sq", matrix_shape},
                                                   {"M", smaller_square},
                                                   {"Q_M", smaller_square}});
}

StateSchema psgd_pro_state() {
  // The momentum of the m × n matrix; Q_L and Q_R its rows' and columns'
  // squares; the Lipschitz constants scalars.
  const WholeShape scalar = [](int64_t, int64_t) { return std::vector<int64_t>{}; };
  return whole_matrix_state<PsgdProParamState, PsgdPro>(
      {{"exp_avg", matrix_shape}, {"Q_L", rows_square}, {"Q_R", cols_square}, {"lip_L", scalar}, {"lip_R", scalar}});
}

StateSchema kl_soap_state(const std::string& kind) {
  using S = KlSoapParamState;
  auto s = StateSchema::of<S>();
  s.is_kind = [kind](const Optimizer& opt) {
    const auto* k = dynamic_cast<const KlSoap*>(&opt);
    return k != nullptr && static_cast<const KlSoapOptions&>(k->defaults()).kind() == kind;
  };
  s.add(step_of<S>());
  // Every tensor is of the preconditioned matrix m × n (KlSoap::
  // preconditioned_dims: stacked_soap's stack of a 3-D parameter), fp32 or
  // wider, made by the first step.
  enum Side { kMatrix, kLeftSquare, kRightSquare, kLeft, kRight };
  const auto whole = [](std::string name, auto get, Side side) {
    auto f = owner_field<S, KlSoap>(std::move(name), get, matrix_shape, StateDtype::kFloat32Wide,
                                    StateInit::kOnFirstUse);
    f.whole_shape = [side](const Optimizer& opt, const at::Tensor& param) {
      const auto [m, n] = static_cast<const KlSoap&>(opt).preconditioned_dims(param);
      switch (side) {
        case kLeftSquare: return std::vector<int64_t>{m, m};
        case kRightSquare: return std::vector<int64_t>{n, n};
        case kLeft: return std::vector<int64_t>{m};
        case kRight: return std::vector<int64_t>{n};
        default: return std::vector<int64_t>{m, n};
      }
    };
    return f;
  };
  const std::map<std::string, Side> sides{{"exp_avg", kMatrix}, {"exp_avg_sq", kMatrix}, {"L", kLeftSquare},
                                          {"R", kRightSquare},  {"Q_L", kLeftSquare},    {"Q_R", kRightSquare},
                                          {"eigvals_L", kLeft}, {"eigvals_R", kRight}};
  add_listed_buffers<S>(s, [&](const std::string& name, auto get) { return whole(name, get, sides.at(name)); });
  return s;
}

StateSchema orthogonalized_state(OrthogonalizedKind kind) {
  auto s = muon_state();
  s.is_kind = [kind](const Optimizer& opt) {
    const auto* v = dynamic_cast<const OrthogonalizedVariant*>(&opt);
    return v != nullptr && v->variant_options().kind() == kind;
  };
  return s;
}

}  // namespace muon::detail
