#pragma once

/// Where muon-train-gpt computes (--device): the CPU, or one CUDA device per
/// rank. Every function here compiles against any LibTorch, with or without
/// CUDA (no CUDA headers): a LibTorch without CUDA refuses --device cuda.
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "muon/distributed/runtime/group.h"

namespace train_gpt {

/// Checks a value of --device, "cpu" or "cuda", before anything else runs
/// (no process is started, no rank waits): another value, "cuda" where
/// LibTorch sees no CUDA device, or "cuda" for more `local_ranks` (the
/// ranks this program starts on this machine: --nproc, or 1 under a
/// launcher) than CUDA devices, raises c10::ValueError in one line naming
/// the flag, its value and why, e.g. "[muon-train-gpt] --device cuda: no
/// CUDA device is available (this LibTorch has CUDA: no)".
void check_device_flag(const std::string& value, int64_t local_ranks);

/// This rank's device for --device `value` (checked): the CPU, or
/// cuda:<LOCAL_RANK> (cuda:0 without LOCAL_RANK), which becomes the
/// current CUDA device of the process (NCCL's collectives and the groups'
/// own exchanges run there). Raises c10::ValueError naming --device when
/// LOCAL_RANK is not below the number of CUDA devices.
c10::Device rank_device(const std::string& value);

/// The backend of the process groups on `device`: NCCL for CUDA, Gloo for
/// the CPU (muon::distributed::Backend::kAuto would take NCCL on any machine with
/// a GPU, where a --device cpu run's tensors are on the CPU).
muon::distributed::Backend group_backend(const c10::Device& device);

/// `device` for logs and reports: "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)"
/// (the name from the CUDA driver; "cuda:0" alone where it cannot be read).
std::string describe_device(const c10::Device& device);

/// Where the `world` ranks of a job compute, for its log, table and
/// summary, from this rank's `device` (rank 0's): "cpu", "cuda:0 (NAME)"
/// for one rank, "cuda:<LOCAL_RANK>, rank 0's cuda:0 (NAME)" for several.
std::string describe_devices(const c10::Device& device, int world);

/// Waits until the work queued on `device` is done (CUDA runs
/// asynchronously: a clock read without it times the launches, not the
/// kernels); nothing on the CPU.
void synchronize(const c10::Device& device);

}  // namespace train_gpt
