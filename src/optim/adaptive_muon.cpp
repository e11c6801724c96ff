// Muon with a NorMuon / AdaMuon second moment.
#include "muon/optim/adaptive_muon.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <utility>

#include "muon/newton_schulz.h"
#include "muon/scaling.h"

namespace muon {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::AdaptiveMuon] ";

void check_supported(const MuonOptions& o, size_t group) {
  TORCH_CHECK_VALUE(!o.stacked_experts(), kWho, "param group ", group,
                    " has stacked_experts on; AdaptiveMuon supports plain matrices only");
  TORCH_CHECK_VALUE(o.split_sizes().empty(), kWho, "param group ", group, " has split_sizes ",
                    c10::IntArrayRef(o.split_sizes()),
                    "; AdaptiveMuon supports plain matrices only");
}

}  // namespace

std::string to_string(AdaptiveMode mode) {
  return mode == AdaptiveMode::kNorMuon ? "normuon" : "adamuon";
}

AdaptiveMode parse_adaptive_mode(const std::string& name) {
  if (name == "normuon") return AdaptiveMode::kNorMuon;
  if (name == "adamuon") return AdaptiveMode::kAdaMuon;
  TORCH_CHECK_VALUE(false, kWho, "unknown mode '", name, "'; valid names: normuon, adamuon");
}

AdaptiveMuonOptions& AdaptiveMuonOptions::mode(const std::string& name) {
  mode_ = parse_adaptive_mode(name);
  return *this;
}

void AdaptiveMuonOptions::validate() const {
  TORCH_CHECK_VALUE(beta2_ >= 0 && beta2_ < 1, kWho, "beta2 must be in [0, 1), got ", beta2_);
  TORCH_CHECK_VALUE(std::isfinite(eps_) && eps_ > 0, kWho, "eps must be > 0, got ", eps_);
}

bool operator==(const AdaptiveMuonOptions& a, const AdaptiveMuonOptions& b) {
  return a.mode() == b.mode() && a.beta2() == b.beta2() && a.eps() == b.eps();
}

std::unique_ptr<torch::optim::OptimizerParamState> AdaptiveMuonParamState::clone() const {
  return std::make_unique<AdaptiveMuonParamState>(*this);
}

void AdaptiveMuonParamState::serialize(OutputArchive& archive) const {
  MuonParamState::serialize(archive);
  if (second_moment_.defined()) archive.write("second_moment", second_moment_, /*is_buffer=*/true);
}

void AdaptiveMuonParamState::serialize(InputArchive& archive) {
  MuonParamState::serialize(archive);
  at::Tensor v;
  if (archive.try_read("second_moment", v, /*is_buffer=*/true)) second_moment_ = v;
}

AdaptiveMuon::AdaptiveMuon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults,
                           AdaptiveMuonOptions adaptive)
    : Muon(std::move(param_groups), std::move(defaults)), adaptive_(adaptive) {
  adaptive_.validate();
  for (const auto i : c10::irange(param_groups_.size())) {
    check_supported(static_cast<const MuonOptions&>(param_groups_[i].options()), i);
  }
}

AdaptiveMuon::AdaptiveMuon(std::vector<at::Tensor> params, MuonOptions defaults,
                           AdaptiveMuonOptions adaptive)
    : AdaptiveMuon(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
                   std::move(defaults), adaptive) {}

at::Tensor AdaptiveMuon::orthogonal_update(const at::Tensor& param, const at::Tensor& update,
                                           const MuonOptions& options, MuonParamState& state,
                                           double& alpha) {
  check_supported(options, 0);
  const auto [rows, cols] = matrix_dims(param.sizes());
  const auto work = param.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto o = newton_schulz(update.reshape({rows, cols}), options.ns()).to(work);
  auto& st = static_cast<AdaptiveMuonParamState&>(state);
  const double beta2 = adaptive_.beta2();
  const double eps = adaptive_.eps();
  const bool per_row = adaptive_.mode() == AdaptiveMode::kNorMuon;
  if (!st.second_moment().defined()) {
    st.second_moment(per_row ? at::zeros({rows, 1}, o.options()) : at::zeros({rows, cols}, o.options()));
  }
  auto& v = st.second_moment();
  TORCH_CHECK_VALUE(v.size(0) == rows && v.size(1) == (per_row ? 1 : cols), kWho,
                    "second moment of shape ", v.sizes(), " does not fit mode ",
                    to_string(adaptive_.mode()), " for a ", rows, "x", cols, " matrix");
  const auto sq = o.square();
  v.lerp_(per_row ? sq.mean(1, /*keepdim=*/true) : sq, 1 - beta2);
  auto normalized = o / (v.sqrt() + eps);
  // The norm ratios stay on the device (no host sync); the shape scale goes to alpha.
  const auto out_norm = normalized.norm().clamp_min(eps);
  if (per_row) {
    normalized.mul_(o.norm() / out_norm);
    alpha = scale_factor(rows, cols, options.scale_mode(), options.extra_scale_factor());
  } else {
    normalized.mul_(out_norm.reciprocal());
    alpha = 0.2 * std::sqrt(static_cast<double>(rows) * static_cast<double>(cols)) *
            options.extra_scale_factor();
  }
  return normalized;
}

std::unique_ptr<MuonParamState> AdaptiveMuon::new_state(const at::Tensor& /*param*/) const {
  return std::make_unique<AdaptiveMuonParamState>();
}

std::string AdaptiveMuon::archive_kind() const { return "muon::AdaptiveMuon"; }

int64_t AdaptiveMuon::state_bytes() const {
  int64_t bytes = Muon::state_bytes();
  for (const auto& item : state_) {
    const auto& v = static_cast<const AdaptiveMuonParamState&>(*item.second).second_moment();
    if (v.defined()) bytes += static_cast<int64_t>(v.nbytes());
  }
  return bytes;
}

void AdaptiveMuon::save(OutputArchive& archive) const {
  Muon::save(archive);
  archive.write("adaptive_mode", c10::IValue(to_string(adaptive_.mode())));
  archive.write("adaptive_beta2", c10::IValue(adaptive_.beta2()));
  archive.write("adaptive_eps", c10::IValue(adaptive_.eps()));
}

void AdaptiveMuon::load(InputArchive& archive) {
  c10::IValue mode;
  TORCH_CHECK_VALUE(archive.try_read("adaptive_mode", mode), kWho,
                    "the archive was not written by muon::AdaptiveMuon::save");
  TORCH_CHECK_VALUE(mode.toStringRef() == to_string(adaptive_.mode()), kWho,
                    "the archive holds mode ", mode.toStringRef(), ", this optimizer's is ",
                    to_string(adaptive_.mode()));
  c10::IValue beta2;
  c10::IValue eps;
  archive.read("adaptive_beta2", beta2);
  archive.read("adaptive_eps", eps);
  Muon::load(archive);  // checks everything else before changing anything
  adaptive_.beta2(beta2.toDouble()).eps(eps.toDouble());
}

}  // namespace muon
