// A communicator's GPU path, internal: what the Communicator's Tensor calls on cuda tensors hand
// to, once communicator.cpp has checked the arguments on this rank, checked that every rank
// made the same call (kind, count, dtype, op, root: a mismatch is UsageError on every rank, as on
// the CPU path) and picked the backend (gpu_path.hpp): NCCL when every rank has its own GPU
// (src/nccl), CUDA IPC over the job's GPU pool when some ranks share one (src/cuda).
//
// Every call is ordered after the work queued on `stream` (cuda::current_stream()) and returns
// once its result is in place on the GPU (the host waits for it, checking the job's abort word),
// so the semantics are the CPU path's: synchronous, bitwise identical results on every rank, and
// a dead peer turns a pending call into PeerFailure (never a GPU hang). Buffers are device
// addresses on the rank's device, `count` contiguous elements unless said otherwise; input ==
// output means in place, as on the CPU path.
#pragma once

#include <nodal/communicator.hpp>
#include <nodal/cuda.hpp>
#include <nodal/tensor.hpp>

#include <cstddef>
#include <memory>

namespace nodal::detail {

struct CommState;

class GpuBackend {
 public:
  virtual ~GpuBackend() = default;
  /// "nccl" or "cuda_ipc" (Communicator::last_algorithm() reports it).
  virtual const char* name() const noexcept = 0;
  /// Releases the backend's GPU resources now, while CUDA runs (nodal::finalize(): before main
  /// returns or from nodal's atexit handler). The backend takes no calls afterwards (the
  /// Communicator refuses them first). The destructor closes a backend not yet closed.
  virtual void close() noexcept = 0;

  virtual void allreduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                         cuda::Stream stream) = 0;
  /// output is written on root only.
  virtual void reduce(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op, int root,
                      cuda::Stream stream) = 0;
  virtual void broadcast(void* buffer, std::size_t count, DType dtype, int root, cuda::Stream stream) = 0;
  /// output: world_size * count elements, rank order.
  virtual void allgather(const void* input, void* output, std::size_t count, DType dtype, cuda::Stream stream) = 0;
  /// input: world_size * count elements; output: block `rank` of the reduction.
  virtual void reduce_scatter(const void* input, void* output, std::size_t count, DType dtype, ReduceOp op,
                              cuda::Stream stream) = 0;
  /// Returns once every rank's work queued on its stream before the call has finished.
  virtual void barrier(cuda::Stream stream) = 0;
  // gather, scatter, alltoall, send, recv: NCCL only (ncclSend/ncclRecv in groups); the CUDA IPC
  // backend throws UsageError naming what it supports.
  virtual void gather(const void* input, void* output, std::size_t count, DType dtype, int root,
                      cuda::Stream stream) = 0;
  virtual void scatter(const void* input, void* output, std::size_t count, DType dtype, int root,
                       cuda::Stream stream) = 0;
  virtual void alltoall(const void* input, void* output, std::size_t count, DType dtype, cuda::Stream stream) = 0;
  virtual void send(const void* input, std::size_t count, DType dtype, int peer, cuda::Stream stream) = 0;
  virtual void recv(void* output, std::size_t count, DType dtype, int peer, cuda::Stream stream) = 0;
};

/// The NCCL backend for `comm` on `device` (collective: every rank calls it at the same call).
/// Throws CudaError when nodal was built without NCCL or NCCL fails to initialise.
std::unique_ptr<GpuBackend> make_nccl_backend(CommState& comm, int device);
/// The CUDA IPC backend for `comm` on `device` (collective). Throws CudaError.
std::unique_ptr<GpuBackend> make_cuda_ipc_backend(CommState& comm, int device);

}  // namespace nodal::detail
