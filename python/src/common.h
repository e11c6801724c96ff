#pragma once
// Shared by the binding files: conversions between Python values and the
// library's config values, dtypes, and the registration functions of each
// binding file (one per C++ module).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/ordered_dict.h>

#include <map>
#include <string>
#include <vector>

#include "muon/config.h"

namespace muon::python {

namespace py = pybind11;

/// A Python bool, int, float, str, list of str or list of int (or tuple) as
/// a config value; anything else raises ValueError naming `what`.
FieldValue to_field_value(const py::handle& value, const std::string& what);
/// The Python value of a config value.
py::object from_field_value(const FieldValue& value);
/// A dict of str → value as config values (ValueError naming the bad key).
std::map<std::string, FieldValue> to_field_map(const py::dict& values, const std::string& what);
/// Names and tensors as named parameters (ValueError for unequal lengths or
/// a repeated name).
torch::OrderedDict<std::string, at::Tensor> named_parameters(const std::vector<std::string>& names,
                                                             const std::vector<at::Tensor>& params);
/// A torch.dtype or a dtype name ("float32", "bfloat16", ...) as a ScalarType.
at::ScalarType to_dtype(const py::handle& value, const std::string& what);

void bind_newton_schulz(py::module_& m);
void bind_config(py::module_& m);
void bind_optim(py::module_& m);
void bind_distributed(py::module_& m);
void bind_qk_clip(py::module_& m);
void bind_build_info(py::module_& m);

}  // namespace muon::python
