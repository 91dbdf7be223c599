// The CUDA IPC collectives' kernels, declared in plain C++ (ipc_backend.cpp is a .cpp): an
// elementwise rank-order fold of n sources, bitwise identical to the CPU's reduce_n
// (src/reduce_kernels.cpp), and a batched copy. Both are enqueued on a stream and return at once;
// neither ever waits on memory another process writes (ordering is the host's business). Internal.
#pragma once

#include "cuda/ipc_plan.hpp"

#include <nodal/communicator.hpp>
#include <nodal/cuda.hpp>
#include <nodal/tensor.hpp>

#include <cstddef>

namespace nodal::detail::cuda_ipc {

/// out[i] = srcs[0][i] op ... op srcs[n-1][i] for i < count, with the CPU path's exact arithmetic
/// (reduce_kernels.hpp). out2, when not null, gets the same values. out may be one of the sources
/// (each element is read before it is written, by the same thread). 1 <= n <= kMaxRanks; (op,
/// dtype) defined (reduce_op_defined). Throws CudaError when the launch fails.
void launch_reduce(DType dtype, ReduceOp op, const void* const* srcs, int n, void* out, void* out2, std::size_t count,
                   cuda::Stream stream);

/// One copy of a batch: `bytes` from src to dst (device addresses, not overlapping).
struct CopySegment {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t bytes = 0;
};
/// Copies every segment (at most kMaxRanks): one kernel when every segment is 16-byte aligned,
/// cudaMemcpyAsync per segment otherwise. Throws CudaError.
void launch_copies(const CopySegment* segments, int n, cuda::Stream stream);

}  // namespace nodal::detail::cuda_ipc
