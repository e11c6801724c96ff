// muon_cpp._C: the bindings of the muon-cpp engine. One file per C++ module
// (newton_schulz.cpp, config.cpp, optim.cpp, distributed.cpp); this one
// defines the module, the conversions they share, and how C++ errors reach
// Python: c10::ValueError → ValueError, c10::TypeError → TypeError,
// c10::IndexError → IndexError, other c10::Error → RuntimeError, each with
// the C++ message without its backtrace.
#include <c10/util/Exception.h>
#include <torch/csrc/Dtype.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "common.h"
#include "util/dtype_names.h"

namespace muon::python {

namespace {

// Bounded messages: a value echoed into an error is cut here.
constexpr size_t kMaxEcho = 80;

std::string echo(const py::handle& value) {
  std::string text = py::repr(value);
  if (text.size() > kMaxEcho) text = text.substr(0, kMaxEcho) + "...";
  return text;
}

}  // namespace

FieldValue to_field_value(const py::handle& value, const std::string& what) {
  if (py::isinstance<py::bool_>(value)) return FieldValue(value.cast<bool>());
  if (py::isinstance<py::int_>(value)) {
    try {
      return FieldValue(value.cast<int64_t>());
    } catch (const py::cast_error&) {
      TORCH_CHECK_VALUE(false, what, " must fit in a 64-bit integer, got ", echo(value));
    }
  }
  if (py::isinstance<py::float_>(value)) return FieldValue(value.cast<double>());
  if (py::isinstance<py::str>(value)) return FieldValue(value.cast<std::string>());
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    const auto seq = py::reinterpret_borrow<py::sequence>(value);
    bool all_str = true;
    bool all_int = true;
    for (const auto& item : seq) {
      all_str = all_str && py::isinstance<py::str>(item);
      all_int = all_int && py::isinstance<py::int_>(item) && !py::isinstance<py::bool_>(item);
    }
    if (all_int) return FieldValue(seq.cast<std::vector<int64_t>>());
    if (all_str) return FieldValue(seq.cast<std::vector<std::string>>());
  }
  // Numbers from torch and numpy (0-d tensors, numpy scalars) by their protocols.
  if (py::hasattr(value, "__index__")) return FieldValue(value.attr("__index__")().cast<int64_t>());
  if (py::hasattr(value, "__float__") && !py::isinstance<py::str>(value)) {
    return FieldValue(value.attr("__float__")().cast<double>());
  }
  TORCH_CHECK_VALUE(false, what,
                    " must be a bool, int, float, str, or a list of ints or of strs, got ",
                    echo(value), " of type ", std::string(py::str(py::type::handle_of(value).attr("__name__"))));
}

py::object from_field_value(const FieldValue& value) {
  return std::visit([](const auto& v) -> py::object { return py::cast(v); }, value);
}

std::map<std::string, FieldValue> to_field_map(const py::dict& values, const std::string& what) {
  std::map<std::string, FieldValue> out;
  for (const auto& [k, v] : values) {
    TORCH_CHECK_VALUE(py::isinstance<py::str>(k), what, ": keys must be strings, got ", echo(k));
    const auto key = k.cast<std::string>();
    out[key] = to_field_value(v, what + " '" + key.substr(0, kMaxEcho) + "'");
  }
  return out;
}

torch::OrderedDict<std::string, at::Tensor> named_parameters(const std::vector<std::string>& names,
                                                             const std::vector<at::Tensor>& params) {
  TORCH_CHECK_VALUE(names.size() == params.size(), "got ", names.size(), " names for ", params.size(),
                    " parameters");
  torch::OrderedDict<std::string, at::Tensor> named;
  for (size_t i = 0; i < names.size(); ++i) {
    TORCH_CHECK_VALUE(named.find(names[i]) == nullptr, "two parameters are named '", names[i], "'");
    named.insert(names[i], params[i]);
  }
  return named;
}

at::ScalarType to_dtype(const py::handle& value, const std::string& what) {
  if (THPDtype_Check(value.ptr())) return reinterpret_cast<THPDtype*>(value.ptr())->scalar_type;
  TORCH_CHECK_VALUE(py::isinstance<py::str>(value), what, " must be a torch.dtype or a dtype name, got ",
                    echo(value));
  return muon::detail::parse_dtype(value.cast<std::string>(), "", what.c_str());
}

}  // namespace muon::python

PYBIND11_MODULE(_C, m) {
  namespace mp = muon::python;
  m.doc() = "muon-cpp engine bindings (use the muon_cpp package, not this module)";
  // Local to this module: torch's own translators keep serving torch.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
  mp::bind_newton_schulz(m);
  mp::bind_config(m);
  mp::bind_optim(m);
  mp::bind_distributed(m);
  mp::bind_qk_clip(m);
  mp::bind_build_info(m);
}
