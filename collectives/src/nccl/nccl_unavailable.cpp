// The NCCL backend of a build with CUDA but without NCCL (nccl.h or libnccl missing at build
// time): CUDA tensors still travel through queues and the CUDA IPC collectives work; only the
// one-rank-per-GPU path is missing, and asking for it says so.
#include "gpu_backend.hpp"

#include <nodal/errors.hpp>

namespace nodal::detail {

std::unique_ptr<GpuBackend> make_nccl_backend(CommState&, int) {
  throw CudaError("nodal was built without NCCL (nccl.h/libnccl not found at build time)");
}

}  // namespace nodal::detail
