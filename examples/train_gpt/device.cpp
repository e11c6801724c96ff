// --device: the CPU or a CUDA device per rank, without CUDA headers.
#include "device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <torch/cuda.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "text.h"

namespace train_gpt {
namespace {

constexpr const char* kWho = "[muon-train-gpt] ";

// Whether this LibTorch was built with CUDA (its CUDA library is loaded and
// registered its device guard), whether or not a device is present.
bool libtorch_has_cuda() { return c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA); }

int64_t cuda_devices() {
  return torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
}

// The CUDA driver's name of device `index` ("" where it cannot be read):
// libcuda's C entry points, loaded at run time, since the names come from
// CUDA headers (at::cuda::getDeviceProperties) that a LibTorch without CUDA
// does not ship. The driver's ordinals are the runtime's (both follow
// CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER).
std::string cuda_device_name(int index) {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);  // loaded by LibTorch's CUDA
  if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_LAZY);
  if (driver == nullptr) return "";
  using Init = int (*)(unsigned int);
  using Get = int (*)(int*, int);
  using Name = int (*)(char*, int, int);
  const auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
  const auto get = reinterpret_cast<Get>(dlsym(driver, "cuDeviceGet"));
  const auto name = reinterpret_cast<Name>(dlsym(driver, "cuDeviceGetName"));
  int device = 0;
  char text[256] = {};
  if (init == nullptr || get == nullptr || name == nullptr || init(0) != 0 ||
      get(&device, index) != 0 || name(text, static_cast<int>(sizeof text) - 1, device) != 0) {
    return "";
  }
  return text;
}

// LOCAL_RANK (0 when unset): this rank's index on its machine.
int64_t local_rank() {
  const char* text = std::getenv("LOCAL_RANK");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  TORCH_CHECK_VALUE(errno == 0 && *end == '\0' && v >= 0, kWho,
                    "--device cuda: LOCAL_RANK must be a whole number >= 0, got '", clip(text, 40),
                    "'");
  return v;
}

}  // namespace

void check_device_flag(const std::string& value, int64_t local_ranks) {
  TORCH_CHECK_VALUE(value == "cpu" || value == "cuda", kWho, "--device ", clip(value, 40),
                    ": not a device of this program; give cpu or cuda");
  if (value == "cpu") return;
  const int64_t devices = cuda_devices();
  TORCH_CHECK_VALUE(devices > 0, kWho,
                    "--device cuda: no CUDA device is available (this LibTorch has CUDA: ",
                    libtorch_has_cuda() ? "yes, and sees no device" : "no", ")");
  TORCH_CHECK_VALUE(local_ranks <= devices, kWho, "--device cuda: --nproc ", local_ranks,
                    " needs a CUDA device per rank; this machine has ", devices);
}

c10::Device rank_device(const std::string& value) {
  if (value != "cuda") return c10::Device(c10::DeviceType::CPU);
  const int64_t index = local_rank();
  const int64_t devices = cuda_devices();
  TORCH_CHECK_VALUE(index < devices, kWho, "--device cuda: this rank's LOCAL_RANK is ", index,
                    ", and this machine has ", devices, " CUDA device(s): one rank per device");
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
  return device;
}

muon::distributed::Backend group_backend(const c10::Device& device) {
  return device.is_cuda() ? muon::distributed::Backend::kNccl : muon::distributed::Backend::kGloo;
}

std::string describe_device(const c10::Device& device) {
  if (!device.is_cuda()) return device.str();
  const auto name = cuda_device_name(device.has_index() ? device.index() : 0);
  return name.empty() ? device.str() : device.str() + " (" + name + ")";
}

std::string describe_devices(const c10::Device& device, int world) {
  if (!device.is_cuda() || world == 1) return describe_device(device);
  return "cuda:<LOCAL_RANK>, rank 0's " + describe_device(device);
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

}  // namespace train_gpt
