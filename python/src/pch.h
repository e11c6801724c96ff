// Precompiled header of the Python extension: pybind11 and torch's Python
// casters, the slow part of every binding file.
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/ATen.h>
