// muon_cpp._C.build_info(): how this extension was built, for
// muon_cpp's check that it matches the running torch and for
// `python3 -m muon_cpp.doctor`.
#include <torch/version.h>

#include <string>

#include "common.h"
#include "muon/distributed/runtime/group.h"
#include "muon/newton_schulz.h"
#include "muon/version.h"

#ifndef MUON_BUILD_CBLAS
#define MUON_BUILD_CBLAS ""
#endif
#ifndef MUON_BUILD_DNNL
#define MUON_BUILD_DNNL ""
#endif

namespace muon::python {

namespace {

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("g++ ") + __VERSION__;
#else
  return "unknown";
#endif
}

}  // namespace

void bind_build_info(py::module_& m) {
  m.def(
      "build_info",
      [] {
        py::dict info;
        info["version"] = std::string(muon::kVersionString);
        info["torch_version"] = std::to_string(TORCH_VERSION_MAJOR) + "." +
                                std::to_string(TORCH_VERSION_MINOR) + "." +
                                std::to_string(TORCH_VERSION_PATCH);
        info["compiler"] = compiler();
        info["cxx11_abi"] = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);
        info["pybind11"] = std::to_string(PYBIND11_VERSION_MAJOR) + "." +
                           std::to_string(PYBIND11_VERSION_MINOR) + "." +
                           std::to_string(PYBIND11_VERSION_PATCH);
        info["python"] = std::to_string(PY_MAJOR_VERSION) + "." + std::to_string(PY_MINOR_VERSION);
        info["cblas_library"] = std::string(MUON_BUILD_CBLAS);
        info["dnnl_library"] = std::string(MUON_BUILD_DNNL);
        py::list backends;
        backends.append("gloo");
        if (muon::distributed::nccl_available()) backends.append("nccl");
        info["c10d_backends"] = backends;
        info["cuda_kernels"] = muon::cuda_kernels_available();
        return info;
      },
      "How this extension was built: muon_cpp's version, the LibTorch version it was compiled "
      "against, compiler, C++11 ABI, pybind11, Python, the CBLAS and oneDNN libraries it links "
      "(empty: built without), its c10d backends and whether it has the CUDA kernels.");
}

}  // namespace muon::python
