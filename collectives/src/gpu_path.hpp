// Which GPU path a communicator's calls on cuda tensors take, internal (DESIGN.md "Collectives"):
// NCCL when every rank has its own GPU, CUDA IPC over the job's GPU pool when some ranks share
// one (NCCL 2.28 refuses that: "Duplicate GPU detected"). Decided once per communicator, at its
// first call on cuda tensors, from every rank's GPU identity (the device UUID), the same way on
// every rank.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace nodal::detail {

enum class GpuPath { nccl, cuda_ipc };

/// A GPU as every process names it: cudaDeviceProp::uuid (CUDA_VISIBLE_DEVICES renumbers devices
/// per process; the UUID does not).
using GpuUuid = std::array<std::uint8_t, 16>;

/// The path for ranks on `gpus` (one entry per communicator rank). `nccl_built`: nodal has NCCL.
/// `forced` is NODAL_GPU_BACKEND: "" or "auto" (the rule above; without NCCL always cuda_ipc),
/// "nccl" or "cuda_ipc". Throws UsageError for an unknown value, for nccl forced while ranks
/// share a GPU (naming two of them) and for nccl forced in a build without NCCL.
/// `spans_nodes` (a communicator across nodes): NCCL only, one GPU per rank (CUDA IPC does not
/// cross nodes): UsageError otherwise (without NCCL, cuda_ipc forced, or ranks sharing a GPU).
GpuPath choose_gpu_path(const std::vector<GpuUuid>& gpus, bool nccl_built, std::string_view forced,
                        bool spans_nodes = false);

/// "nccl", "cuda_ipc".
const char* gpu_path_name(GpuPath path) noexcept;

/// The UUID of CUDA device `device` of this process. Throws CudaError (no GPU, a build without CUDA).
GpuUuid gpu_uuid(int device);

}  // namespace nodal::detail
