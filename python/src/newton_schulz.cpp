// Bindings of <muon/newton_schulz.h> and <muon/scaling.h>.
#include <c10/util/Exception.h>

#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "muon/newton_schulz.h"
#include "muon/scaling.h"

namespace muon::python {

namespace {

using Tuples = std::vector<std::tuple<double, double, double>>;

Tuples tuples_of(const CoefficientSet& set) {
  Tuples out;
  for (const auto& c : set.coefficients) out.emplace_back(c.a, c.b, c.c);
  return out;
}

NewtonSchulzOptions ns_options(const py::object& coefficients, const py::object& steps, double eps,
                               const std::string& eps_mode, const py::object& compute_dtype,
                               const std::string& method, const std::string& schedule,
                               double safety_factor) {
  NewtonSchulzOptions o;
  if (py::isinstance<py::str>(coefficients)) {
    o.coefficients(coefficients.cast<std::string>());
  } else {
    std::vector<std::vector<double>> rows;
    try {
      for (const auto& t : coefficients) rows.push_back(t.cast<std::vector<double>>());
    } catch (const py::cast_error&) {
      TORCH_CHECK_VALUE(false, "coefficients must be a set name or a list of (a, b, c) tuples, got ",
                        std::string(py::repr(coefficients)).substr(0, 80));
    }
    TORCH_CHECK_VALUE(schedule == "cycle" || schedule == "repeat_last",
                      "schedule must be 'cycle' or 'repeat_last', got '", schedule.substr(0, 40), "'");
    o.coefficients(rows, schedule == "cycle" ? StepSchedule::kCycle : StepSchedule::kRepeatLast,
                   safety_factor);
  }
  if (!steps.is_none()) o.steps(steps.cast<int64_t>());
  o.eps(eps).eps_mode(eps_mode).compute_dtype(to_dtype(compute_dtype, "compute_dtype")).method(method);
  return o;
}

}  // namespace

void bind_newton_schulz(py::module_& m) {
  m.def(
      "newton_schulz",
      [](const at::Tensor& x, const py::object& coefficients, const py::object& steps, double eps,
         const std::string& eps_mode, const py::object& compute_dtype, const std::string& method,
         const std::string& schedule, double safety_factor) {
        const auto options =
            ns_options(coefficients, steps, eps, eps_mode, compute_dtype, method, schedule, safety_factor);
        py::gil_scoped_release release;
        return newton_schulz(x, options);
      },
      py::arg("x"), py::arg("coefficients") = "quintic", py::arg("steps") = py::none(),
      py::arg("eps") = kDefaultNsEps, py::arg("eps_mode") = "add",
      py::arg("compute_dtype") = "float32", py::arg("method") = "auto",
      py::arg("schedule") = "cycle", py::arg("safety_factor") = 1.0,
      R"doc(Orthogonalizes x (m×n, or a batch b×m×n) with a Newton–Schulz schedule.

coefficients: a built-in set name (coefficient_set_names()) or a list of
(a, b, c) tuples (then `schedule` 'cycle' | 'repeat_last' and
`safety_factor` apply); steps: None for the set's default; eps and
eps_mode ('add': X/(‖X‖+eps), 'clamp': X/max(‖X‖, eps)); compute_dtype:
torch.float32 (default), torch.bfloat16 or torch.float64; method: 'auto' |
'standard' | 'gram'. Returns a new tensor of x's shape, dtype and device.
The GIL is released while it runs. Bad values raise ValueError.)doc");
  m.def(
      "newton_schulz_cpu_kernels",
      [](const py::object& compute_dtype) {
        return newton_schulz_cpu_kernels(to_dtype(compute_dtype, "compute_dtype"));
      },
      py::arg("compute_dtype") = "float32",
      "One line naming what newton_schulz runs its CPU products on for compute_dtype on this "
      "machine: oneDNN or the BLAS for fp32; for bf16, oneDNN's native bf16 matmul, or the "
      "operands widened to fp32 with the result rounded once (AVX2, AVX512_CORE).");
  m.def("coefficient_set_names", &coefficient_set_names, "Names of the built-in coefficient sets.");
  m.def("coefficient_set_aliases", &coefficient_set_aliases,
        "Accepted aliases, as (alias, name) pairs.");
  m.def(
      "coefficients", [](const std::string& name) { return tuples_of(coefficient_set(name)); },
      py::arg("name"), "The (a, b, c) tuples of a built-in set, in order.");
  m.def(
      "coefficient_set_info",
      [](const std::string& name) {
        const auto& s = coefficient_set(name);
        py::dict d;
        d["name"] = s.name;
        d["coefficients"] = tuples_of(s);
        d["schedule"] = s.schedule == StepSchedule::kCycle ? "cycle" : "repeat_last";
        d["safety_factor"] = s.safety_factor;
        d["default_steps"] = s.default_steps;
        d["description"] = s.description;
        return d;
      },
      py::arg("name"), "Every field of a built-in set, as a dict.");
  m.def(
      "newton_schulz_flops",
      [](int64_t rows, int64_t cols, const py::object& coefficients, const py::object& steps,
         const py::object& compute_dtype, const std::string& method, const std::string& device) {
        return newton_schulz_flops(
            rows, cols, ns_options(coefficients, steps, kDefaultNsEps, "add", compute_dtype, method, "cycle", 1.0),
            c10::Device(device));
      },
      py::arg("rows"), py::arg("cols"), py::arg("coefficients") = "quintic",
      py::arg("steps") = py::none(), py::arg("compute_dtype") = "float32", py::arg("method") = "auto",
      py::arg("device") = "cpu",
      "Floating-point operations of one newton_schulz call on a rows×cols matrix, with `auto` "
      "resolved as newton_schulz resolves it on `device` ('cpu', 'cuda', 'cuda:1').");
  m.def(
      "newton_schulz_method",
      [](int64_t rows, int64_t cols, const py::object& coefficients, const py::object& steps,
         const py::object& compute_dtype, const std::string& method, const std::string& device) {
        return to_string(resolve_method(
            rows, cols,
            ns_options(coefficients, steps, kDefaultNsEps, "add", compute_dtype, method, "cycle", 1.0),
            c10::Device(device)));
      },
      py::arg("rows"), py::arg("cols"), py::arg("coefficients") = "quintic",
      py::arg("steps") = py::none(), py::arg("compute_dtype") = "float32", py::arg("method") = "auto",
      py::arg("device") = "cpu",
      "The method ('standard' or 'gram') newton_schulz runs for rows×cols matrices on `device`.");
  m.def(
      "scale_factor",
      [](int64_t rows, int64_t cols, const std::string& mode, double extra_scale_factor) {
        return scale_factor(rows, cols, parse_scale_mode(mode), extra_scale_factor);
      },
      py::arg("rows"), py::arg("cols"), py::arg("mode") = "shape_scaling",
      py::arg("extra_scale_factor") = 1.0,
      "The scale of an orthogonalized rows×cols update: 'shape_scaling' | 'spectral' | "
      "'unit_rms_norm' | 'match_rms_adamw', times extra_scale_factor.");
  m.def("scale_mode_names", &scale_mode_names, "Names of the scale modes.");
}

}  // namespace muon::python
