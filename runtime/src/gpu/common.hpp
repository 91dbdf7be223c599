// What the files of the CUDA GPU layer share: who this process is in the job, the bookkeeping a
// CUDA Storage carries, and the entry points each file offers the others. Internal.
#pragma once

#include <nodal/cuda.hpp>
#include <nodal/detail/gpu.hpp>

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>

namespace nodal {
class Arena;
}

namespace nodal::detail::gpu {

struct BlockRecord;

/// This process in the job: RANK and WORLD_SIZE (rank 0 of 1 without nodalrun), read on first
/// use, and registered in the arena's rank table then (block_table.hpp: liveness).
struct Self {
  int rank = 0;
  int world_size = 1;
  pid_t pid = 0;
};
const Self& self();

/// Storage::gpu_state() of every CUDA storage the layer makes.
struct GpuState {
  WireTensor::Kind kind = WireTensor::Kind::none;  ///< none: an empty (zero-byte) storage
  PoolBlock block{};                               ///< pool
  std::array<std::uint8_t, 64> ipc_handle{};       ///< ipc: cudaIpcMemHandle_t of the base
  std::uint64_t ipc_offset = 0;
  std::uint64_t ipc_record = 0;
};

/// The job arena's record behind a pool block or IPC export (BlockRecord, block_table.hpp).
BlockRecord& record_of(std::uint64_t offset);

// pool.cpp: the consumer's side of a pool block (the wire's in-flight reference becomes one of
// this rank's).
std::shared_ptr<Storage> pool_import(const WireTensor& wire);
// ipc.cpp: the consumer's side of an IPC export, and the producer's deferred releases.
std::shared_ptr<Storage> ipc_import(const WireTensor& wire);
/// Runs the producer's releases whose blocks nobody holds any more (torch's CudaIPCSentDataLimbo).
/// Called by every nodal GPU entry point and at exit.
void collect_limbo() noexcept;
// events.cpp: interprocess events ordering a consumer's stream after a producer's.
/// Records an event of this rank on `stream` (of `device`, current) into wire.event_*; without a
/// free slot synchronizes `stream` instead and leaves event_owner = -1.
void record_event(int device, cuda::Stream stream, WireTensor& wire);
/// Makes `stream` wait for the wire's event and frees its slot for reuse.
void wait_event(const WireTensor& wire, cuda::Stream stream);
/// Frees the wire's event slot without waiting (a wire that is dropped).
void release_event(const WireTensor& wire) noexcept;
/// Before a consumer drops its reference to memory on `device`: waits for the work queued on this
/// thread's current stream there (which may read or write the block), so the owner never reuses
/// memory still in use.
/// Returns false, without waiting further, once the job has failed (the abort word is set): the
/// caller then keeps its reference and the memory (leaked on purpose rather than hanging on a
/// stream that waits for a dead rank). CUDA errors are ignored (called from Storage releases,
/// during stack unwinding, possibly during exit).
bool quiesce_before_release(int device) noexcept;
/// Whether the job has failed (the arena's abort word is set; false without an arena).
bool job_failed() noexcept;

}  // namespace nodal::detail::gpu
