// Coefficient sets of the Newton–Schulz iteration and NewtonSchulzOptions.
#include "muon/newton_schulz.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "util/names.h"

namespace muon {
namespace {

constexpr detail::EnumName<NewtonSchulzMethod> kMethods[] = {
    {NewtonSchulzMethod::kAuto, "auto"},
    {NewtonSchulzMethod::kStandard, "standard"},
    {NewtonSchulzMethod::kGram, "gram"}};

std::vector<CoefficientSet> make_builtin_sets() {
  const NsCoefficients simple{3.4445, -4.7750, 2.0315};
  std::vector<CoefficientSet> sets;
  sets.push_back({"simple", {simple}, StepSchedule::kRepeatLast, 1.0, 5,
                  "Keller Jordan's quintic, one tuple repeated; never converges to 1"});
  sets.push_back({"quintic",
                  {{4.0848, -6.8946, 2.9270},
                   {3.9505, -6.3029, 2.6377},
                   {3.7418, -5.5913, 2.3037},
                   {2.8769, -3.1427, 1.2046},
                   {2.8366, -3.0525, 1.2012}},
                  StepSchedule::kCycle, 1.0, 5,
                  "Jiacheng You's five tuples, cycled (Megatron-Core default)"});
  sets.push_back({"polar_express",
                  {{8.2051, -22.9019, 16.4607},
                   {4.0664, -2.8612, 0.5184},
                   {3.9096, -2.8234, 0.5250},
                   {3.2856, -2.4153, 0.4853},
                   {2.2779, -1.6198, 0.3985},
                   {1.8726, -1.2307, 0.3585},
                   {1.8564, -1.2132, 0.3568},
                   {1.8750, -1.2500, 0.3750}},
                  StepSchedule::kRepeatLast, 1.0, 8,
                  "Polar Express (Amsel et al. 2025), the paper's 8 steps, last repeats: singular "
                  "values converge to 1 (Megatron-Core's and Emerging-Optimizers' polar_express)"});
  sets.push_back({"polar_express_5",
                  {{8.156554524902461, -22.48329292557795, 15.878769915207462},
                   {4.042929935166739, -2.808917465908714, 0.5000178451051316},
                   {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
                   {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
                   {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}},
                  StepSchedule::kRepeatLast, 1.02, 5,
                  "Polar Express 5-step of modded-nanogpt and nanochat, safety factor 1.02, last "
                  "repeats"});
  sets.push_back({"cans",
                  {{8.4703, -25.1081, 18.6293},
                   {4.1828, -3.1087, 0.5806},
                   {3.9619, -2.9541, 0.5630},
                   {3.2866, -2.4647, 0.5074},
                   {2.2737, -1.6447, 0.4162}},
                  StepSchedule::kRepeatLast, 1.0, 5,
                  "CANS (Chebyshev-accelerated Newton–Schulz), last repeats"});
  sets.push_back({"aol",
                  {{4.0098, -7.0585, 2.4635},
                   {3.4585, -5.5479, 2.5959},
                   {2.7573, -3.2939, 1.4254},
                   {2.7215, -3.0494, 1.3169}},
                  StepSchedule::kCycle, 1.0, 4, "AOL-preconditioned schedule, four tuples cycled"});
  std::vector<NsCoefficients> dsv4(8, simple);
  dsv4.push_back({2.0, -1.5, 0.5});
  dsv4.push_back({2.0, -1.5, 0.5});
  sets.push_back({"deepseekv4", dsv4, StepSchedule::kRepeatLast, 1.0, 10,
                  "DeepSeek-V4: simple ×8 then (2, -1.5, 0.5) ×2, last repeats"});
  sets.push_back({"cubic", {{1.5, -0.5, 0.0}}, StepSchedule::kRepeatLast, 1.0, 5,
                  "classical cubic Newton–Schulz (c = 0: one product per step)"});
  sets.push_back({"cubic5",
                  {{3.3656576, -3.3420992, 0.0},
                   {2.5744352, -1.4957376, 0.0},
                   {2.5368962, -1.4312570, 0.0},
                   {2.4418906, -1.2764040, 0.0},
                   {2.2230472, -0.9630650, 0.0}},
                  StepSchedule::kCycle, 1.0, 5,
                  "Emerging-Optimizers' relaxed cubic, five tuples cycled (c = 0: one product "
                  "fewer per step)"});
  return sets;
}

// Other names of built-in sets: (alias, set name).
const std::vector<std::pair<std::string, std::string>>& aliases() {
  static const std::vector<std::pair<std::string, std::string>> list = {
      {"polar_express_8", "polar_express"}};
  return list;
}

constexpr detail::EnumName<NsEpsMode> kEpsModes[] = {{NsEpsMode::kAdd, "add"},
                                                     {NsEpsMode::kClamp, "clamp"}};

const std::vector<CoefficientSet>& builtin_sets() {
  static const std::vector<CoefficientSet> sets = make_builtin_sets();
  return sets;
}

void check_steps(int64_t steps) {
  TORCH_CHECK_VALUE(steps >= kMinNsSteps && steps < kMaxNsSteps,
                    "[muon::NewtonSchulzOptions] steps must be in [", kMinNsSteps, ", ",
                    kMaxNsSteps, "), got ", steps);
}

void check_eps(double eps) {
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps > 0, "[muon::NewtonSchulzOptions] eps must be > 0, got ",
                    eps);
}

void check_compute_dtype(at::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble ||
                        dtype == at::kHalf,
                    "[muon::NewtonSchulzOptions] compute_dtype must be Float, BFloat16, Double or "
                    "Half, got ",
                    dtype);
}

}  // namespace

NsCoefficients CoefficientSet::at_step(int64_t k) const {
  TORCH_INTERNAL_ASSERT(!coefficients.empty() && k >= 0);
  const auto n = static_cast<int64_t>(coefficients.size());
  const int64_t i = schedule == StepSchedule::kCycle ? k % n : std::min(k, n - 1);
  return coefficients[static_cast<size_t>(i)];
}

std::vector<std::string> coefficient_set_names() {
  std::vector<std::string> names;
  for (const auto& s : builtin_sets()) names.push_back(s.name);
  return names;
}

std::vector<std::pair<std::string, std::string>> coefficient_set_aliases() { return aliases(); }

std::vector<std::string> accepted_coefficient_set_names() {
  auto names = coefficient_set_names();
  for (const auto& a : aliases()) names.push_back(a.first);
  return names;
}

const CoefficientSet& coefficient_set(const std::string& name) {
  std::string target = name;
  for (const auto& a : aliases()) {
    if (a.first == name) target = a.second;
  }
  for (const auto& s : builtin_sets()) {
    if (s.name == target) return s;
  }
  detail::check_name(name, accepted_coefficient_set_names(), "[muon::coefficient_set] ",
                     "coefficient set");
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

CoefficientSet custom_coefficient_set(const std::vector<std::vector<double>>& tuples,
                                      StepSchedule schedule, double safety_factor) {
  TORCH_CHECK_VALUE(!tuples.empty(),
                    "[muon::custom_coefficient_set] coefficients must not be empty");
  TORCH_CHECK_VALUE(std::isfinite(safety_factor) && safety_factor > 0,
                    "[muon::custom_coefficient_set] safety_factor must be > 0, got ", safety_factor);
  CoefficientSet set;
  set.name = "custom";
  set.schedule = schedule;
  set.safety_factor = safety_factor;
  set.default_steps = static_cast<int64_t>(tuples.size());
  set.description = "user-supplied coefficients";
  for (size_t i = 0; i < tuples.size(); ++i) {
    const auto& t = tuples[i];
    TORCH_CHECK_VALUE(t.size() == 3, "[muon::custom_coefficient_set] coefficients[", i,
                      "] must be an (a, b, c) tuple of length 3, got length ", t.size());
    for (double v : t) {
      TORCH_CHECK_VALUE(std::isfinite(v), "[muon::custom_coefficient_set] coefficients[", i,
                        "] has a non-finite value ", v);
    }
    set.coefficients.push_back({t[0], t[1], t[2]});
  }
  if (set.default_steps >= kMaxNsSteps) set.default_steps = kMaxNsSteps - 1;
  return set;
}

MUON_DEFINE_ENUM_NAMES(NewtonSchulzMethod, parse_newton_schulz_method, kMethods, "[muon::NewtonSchulzOptions] ",
                       "method");

MUON_DEFINE_ENUM_NAMES(NsEpsMode, parse_ns_eps_mode, kEpsModes, "[muon::NewtonSchulzOptions] ", "eps_mode");

std::vector<std::string> ns_eps_mode_names() { return detail::names_of(kEpsModes); }

NewtonSchulzOptions::NewtonSchulzOptions() : set_(muon::coefficient_set("quintic")) {}

NewtonSchulzOptions& NewtonSchulzOptions::coefficients(const std::string& name) {
  set_ = muon::coefficient_set(name);
  return *this;
}

NewtonSchulzOptions& NewtonSchulzOptions::coefficients(
    const std::vector<std::vector<double>>& tuples, StepSchedule schedule, double safety_factor) {
  set_ = custom_coefficient_set(tuples, schedule, safety_factor);
  return *this;
}

NewtonSchulzOptions& NewtonSchulzOptions::coefficient_set(CoefficientSet set) {
  TORCH_CHECK_VALUE(!set.coefficients.empty(),
                    "[muon::NewtonSchulzOptions] coefficient set '", set.name, "' is empty");
  set_ = std::move(set);
  return *this;
}

NewtonSchulzOptions& NewtonSchulzOptions::steps(int64_t steps) {
  check_steps(steps);
  steps_ = steps;
  return *this;
}

int64_t NewtonSchulzOptions::steps() const { return steps_ > 0 ? steps_ : set_.default_steps; }

NewtonSchulzOptions& NewtonSchulzOptions::eps(double eps) {
  check_eps(eps);
  eps_ = eps;
  return *this;
}

NewtonSchulzOptions& NewtonSchulzOptions::eps_mode(const std::string& name) {
  eps_mode_ = parse_ns_eps_mode(name);
  return *this;
}

NewtonSchulzOptions& NewtonSchulzOptions::compute_dtype(at::ScalarType dtype) {
  check_compute_dtype(dtype);
  compute_dtype_ = dtype;
  return *this;
}

NewtonSchulzOptions& NewtonSchulzOptions::method(NewtonSchulzMethod method) {
  method_ = method;
  return *this;
}

NewtonSchulzOptions& NewtonSchulzOptions::method(const std::string& name) {
  method_ = parse_newton_schulz_method(name);
  return *this;
}

std::vector<NsCoefficients> NewtonSchulzOptions::schedule() const {
  std::vector<NsCoefficients> out;
  const int64_t n = steps();
  out.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) out.push_back(set_.at_step(k));
  return out;
}

void NewtonSchulzOptions::validate() const {
  check_steps(steps());
  check_eps(eps_);
  check_compute_dtype(compute_dtype_);
  TORCH_CHECK_VALUE(!set_.coefficients.empty(), "[muon::NewtonSchulzOptions] coefficient set '",
                    set_.name, "' is empty");
  TORCH_CHECK_VALUE(std::isfinite(set_.safety_factor) && set_.safety_factor > 0,
                    "[muon::NewtonSchulzOptions] safety_factor must be > 0, got ",
                    set_.safety_factor);
}

bool NewtonSchulzOptions::operator==(const NewtonSchulzOptions& o) const {
  if (set_.name != o.set_.name || set_.schedule != o.set_.schedule ||
      set_.safety_factor != o.set_.safety_factor ||
      set_.coefficients.size() != o.set_.coefficients.size()) {
    return false;
  }
  for (size_t i = 0; i < set_.coefficients.size(); ++i) {
    const auto& x = set_.coefficients[i];
    const auto& y = o.set_.coefficients[i];
    if (x.a != y.a || x.b != y.b || x.c != y.c) return false;
  }
  return steps() == o.steps() && eps_ == o.eps_ && eps_mode_ == o.eps_mode_ &&
         compute_dtype_ == o.compute_dtype_ && method_ == o.method_ && symmetric_ == o.symmetric_;
}

}  // namespace muon
