#include "gpu_path.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/gpu.hpp>

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#if NODAL_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace nodal::detail {

GpuPath choose_gpu_path(const std::vector<GpuUuid>& gpus, bool nccl_built, std::string_view forced, bool spans_nodes) {
  if (!forced.empty() && forced != "auto" && forced != "nccl" && forced != "cuda_ipc") {
    throw UsageError(fmt::format("NODAL_GPU_BACKEND='{}': expected auto, nccl or cuda_ipc", forced));
  }
  if (spans_nodes) {
    if (forced == "cuda_ipc") {
      throw UsageError("NODAL_GPU_BACKEND=cuda_ipc on a communicator that spans nodes: CUDA IPC does not cross "
                       "nodes (NCCL does)");
    }
    if (!nccl_built) {
      throw UsageError("calls on cuda tensors across nodes take NCCL, and nodal was built without it");
    }
    forced = "nccl";  // refuses ranks sharing a GPU, naming them
  }
  if (forced == "cuda_ipc") return GpuPath::cuda_ipc;
  // Two ranks on one GPU: the first such pair, for the message.
  int first = -1, second = -1;
  for (std::size_t a = 0; a < gpus.size() && first < 0; ++a) {
    for (std::size_t b = a + 1; b < gpus.size(); ++b) {
      if (gpus[a] == gpus[b]) {
        first = static_cast<int>(a);
        second = static_cast<int>(b);
        break;
      }
    }
  }
  if (forced == "nccl") {
    if (!nccl_built) throw UsageError("NODAL_GPU_BACKEND=nccl, but nodal was built without NCCL");
    if (first >= 0 && spans_nodes) {
      throw UsageError(fmt::format("ranks {} and {} share a GPU, and across nodes calls on cuda tensors take NCCL, "
                                   "which refuses that (\"Duplicate GPU detected\"): use one rank per GPU",
                                   first, second));
    }
    if (first >= 0) {
      throw UsageError(fmt::format("NODAL_GPU_BACKEND=nccl, but ranks {} and {} share a GPU, which NCCL refuses "
                                   "(\"Duplicate GPU detected\"); use cuda_ipc or one rank per GPU",
                                   first, second));
    }
    return GpuPath::nccl;
  }
  return first < 0 && nccl_built ? GpuPath::nccl : GpuPath::cuda_ipc;
}

const char* gpu_path_name(GpuPath path) noexcept { return path == GpuPath::nccl ? "nccl" : "cuda_ipc"; }

GpuUuid gpu_uuid(int device) {
  gpu::require_available("a collective on cuda tensors");
  GpuUuid uuid{};
#if NODAL_WITH_CUDA
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    throw CudaError(fmt::format("cudaGetDeviceProperties(cuda:{}): {}: {}", device, cudaGetErrorName(e),
                                cudaGetErrorString(e)));
  }
  std::memcpy(uuid.data(), prop.uuid.bytes, uuid.size());
#else
  (void)device;
#endif
  return uuid;
}

}  // namespace nodal::detail
