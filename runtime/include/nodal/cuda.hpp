// nodal::cuda: what a rank needs to know about the GPUs nodal can use, and the stream nodal
// orders its GPU work on. CUDA is optional: a build without it (or a machine without a GPU)
// answers available() == false with the reason, and every GPU call throws CudaError saying so.
#pragma once

#include <string>

struct CUstream_st;  // cudaStream_t is CUstream_st* (cuda_runtime_api.h / driver_types.h)

namespace nodal::cuda {

/// cudaStream_t without including the CUDA headers. nullptr is the legacy default stream.
using Stream = CUstream_st*;

/// True when nodal was built with CUDA (nvcc found at build time).
bool built_with_cuda() noexcept;
/// True when nodal was built with NCCL (the one-rank-per-GPU collectives backend).
bool built_with_nccl() noexcept;
/// True when this process can run CUDA work: built with CUDA, a driver, and at least one GPU.
bool available() noexcept;
/// Why available() is false, in words ("nodal was built without CUDA", "no CUDA driver
/// (cudaErrorInsufficientDriver: ...)", "no GPU visible (CUDA_VISIBLE_DEVICES='')"); "" when true.
std::string unavailable_reason();
/// GPUs this process sees (0 when !available()).
int device_count() noexcept;

/// The stream this thread's nodal GPU work is ordered on: TensorQueue::put records an event on it
/// after the producer's writes, get() makes it wait for that event, and GPU collectives run on it.
/// Default: the legacy default stream (nullptr). Per thread, like torch.cuda.current_stream().
Stream current_stream() noexcept;
void set_current_stream(Stream stream) noexcept;
/// Waits until every operation queued on current_stream() has finished. Throws CudaError.
void synchronize();

}  // namespace nodal::cuda
