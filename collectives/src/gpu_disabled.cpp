// The GPU backends of a build without CUDA: a cuda tensor cannot exist there, so these only
// say why if anything asks.
#include "gpu_backend.hpp"

#include <nodal/cuda.hpp>
#include <nodal/errors.hpp>

#include <fmt/format.h>

namespace nodal::detail {

std::unique_ptr<GpuBackend> make_nccl_backend(CommState&, int) {
  throw CudaError(fmt::format("the NCCL backend: {}", cuda::unavailable_reason()));
}
std::unique_ptr<GpuBackend> make_cuda_ipc_backend(CommState&, int) {
  throw CudaError(fmt::format("the CUDA IPC collectives: {}", cuda::unavailable_reason()));
}

}  // namespace nodal::detail
