// The runtime's GPU layer, internal: the per-job GPU pool (CUDA VMM chunks shared as POSIX file
// descriptors), storages of CUDA memory, the wire form of a CUDA tensor in a queue, interprocess
// event ordering, and copies. Implemented in runtime/src/gpu/ when nodal is built with CUDA, and by
// runtime/src/gpu_disabled.cpp otherwise (every call throws CudaError("nodal was built without
// CUDA")). Used by Tensor, TensorQueue and the GPU collectives.
//
// Ideas: torch.multiprocessing's CUDA sharing (cudaIpcGetMemHandle of the allocation's base +
// offset, the producer keeps memory alive while consumers hold references, reference counts in
// shared memory) and CUDA's VMM API (cuMemCreate + cuMemExportToShareableHandle with POSIX file
// descriptors), which lets a consumer keep memory alive after the producer is gone.
#pragma once

#include <nodal/cuda.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

struct CUctx_st;  // CUcontext is CUctx_st* (cuda.h)

namespace nodal::detail {
class Storage;
}

namespace nodal::detail::gpu {

/// Throws CudaError("<what>: <unavailable_reason()>") unless cuda::available().
void require_available(const char* what);

/// Makes `device` the calling thread's current device (initialising its primary context) for the
/// guard's life. Restores the context that was current before (cuCtxSetCurrent, so a user's own
/// context comes back too) only when one was: a thread that had no current context keeps
/// `device` current afterwards. cudaGetDevice says 0 on a thread that never chose a device, and
/// restoring "0" would create a primary context on GPU 0 (hundreds of MiB) in every rank,
/// whatever GPU it uses. Throws CudaError (also in a build without CUDA).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  CUctx_st* previous_ = nullptr;  ///< restored by the destructor when not null
};

/// Throws CudaError naming what `device` lacks before `processes` processes of the job share it
/// through CUDA IPC (the DEFAULT compute mode, interprocess events; runtime/src/gpu/compatibility.hpp
/// has the rules and the messages). Checked once per (device, processes) per process.
void require_shareable_device(int device, int processes);

/// Whether this process has called into CUDA (the runtime or the driver) through nodal: set by
/// the availability probe (cuda::available(), device_count(), any cuda tensor, copy, queue
/// hand-off) before its first CUDA call, whatever the answer, and never cleared; inherited by a
/// fork. CUDA does not survive fork, so the fork-based start methods (nodal::spawn with
/// StartMethod::fork, starting the fork server, the forkserver zygote of nodalrun) refuse once it
/// is set. CUDA used directly by the program (not through nodal) is not seen. Always false in a
/// build without CUDA.
bool cuda_initialized() noexcept;

// ---- The per-job GPU pool ----
// Every rank has its own pool on each device it allocates on: VMM chunks (cuMemCreate, POSIX fd
// handle type, granularity-aligned, NODAL_GPU_CHUNK_BYTES each, default 256 MiB, larger when one
// allocation needs it). The fd of each chunk is published once to the job's fd broker (nodalrun,
// fd_broker.hpp); a peer imports and maps a chunk on first use and caches the mapping for the
// life of the process. Blocks are carved out of chunks by the owner alone; each block has a
// BlockRecord in the job arena with per-rank reference counts, so the owner reuses a block only
// when no live rank holds it (a dead rank's references do not count).
//
// Lifetime of chunks: cuMemCreate's memory is freed only once every handle to it is released,
// the shareable file descriptors included, and the fd broker (nodalrun) holds a descriptor of
// every published chunk until the job ends. So the chunks of a rank that exits stay allocated
// on the GPU until the whole job ends, whether or not a peer still maps them: a job whose ranks
// come and go (short-lived ranks, restarts) piles up NODAL_GPU_CHUNK_BYTES per device per rank
// that ever allocated; keep the setting small for such jobs.
//
// Stream order of reuse (the single-stream rule): the owner reuses a block once every live
// holder dropped it, and a holder's drop waits only for the work queued on its thread's
// current stream (cuda::current_stream()) at that moment. Work that reads or writes the block on
// any other stream must be synchronized by the user before the last reference goes (the same
// caveat as torch's Tensor.record_stream: the allocator knows only the current stream).

/// A block of some rank's pool, as every process names it (fits in a queue cell or arena slot).
struct PoolBlock {
  std::int32_t owner = -1;   ///< the job rank whose pool holds the block
  std::int32_t device = 0;   ///< the CUDA device (index in CUDA_VISIBLE_DEVICES)
  std::uint32_t chunk = 0;   ///< the owner's chunk number on that device
  /// The chunk's size in kPoolChunkUnit units, set where record is 0 (find_pool_block): an
  /// importer maps whole chunks and takes their size from the record otherwise.
  std::uint32_t chunk_units = 0;
  std::uint64_t offset = 0;  ///< bytes from the chunk's start
  std::uint64_t bytes = 0;
  std::uint64_t record = 0;  ///< arena offset of the block's BlockRecord (reference counts)
};

/// The unit of PoolBlock::chunk_units (chunks are multiples of the VMM granularity, 2 MiB on
/// current GPUs).
inline constexpr std::uint64_t kPoolChunkUnit = 4096;

/// A new pool block of `bytes` on `device` in this rank's pool, as a Storage (Kind::cuda) holding
/// one reference of this process. Throws CudaError (no GPU, out of GPU memory), ShmError (no room
/// for the record in the arena).
std::shared_ptr<Storage> pool_allocate(int device, std::size_t bytes);
/// The pool block behind a storage from pool_allocate or import; nullopt-like owner -1 for CUDA
/// memory that is not in a pool (external_storage).
PoolBlock pool_block(const Storage& storage) noexcept;
/// When [address, address + bytes) lies entirely inside one chunk of this process's own pool (any
/// device), a PoolBlock naming exactly that byte range: owner this rank, record 0 (no reference
/// counts: the caller keeps the memory alive while peers use the block) and chunk_units set, so
/// map_pool_block works on it in any process of the job. nullopt otherwise (bytes == 0 included:
/// memory from another allocator, host memory, a range across chunks or past a chunk's end).
/// Thread-safe, cheap (a lock and a scan of this rank's chunks).
std::optional<PoolBlock> find_pool_block(const void* address, std::size_t bytes) noexcept;
/// This process's device address of a peer's (or its own) pool block: imports and maps the
/// owner's chunk on first use (fd from the broker, cuMemImportFromShareableHandle, cuMemMap,
/// access for every device of this process), cached. Takes no reference. A block with record 0
/// (find_pool_block) takes the chunk's size from chunk_units. Throws CudaError,
/// PeerFailure when the owner's chunk never gets published because the job failed.
void* map_pool_block(const PoolBlock& block);

/// CUDA memory from another allocator (cudaMalloc, a caching allocator, DLPack), shared with the
/// legacy IPC API: cudaIpcGetMemHandle of the allocation's base, plus the offset. `release` runs
/// once no process holds a reference any more (the producer keeps the memory alive while
/// consumers use it: the rule of torch.multiprocessing). Throws CudaError.
std::shared_ptr<Storage> external_storage(void* data, std::size_t bytes, int device, std::function<void()> release);

// ---- Queue hand-off ----

/// What a queue cell carries for a CUDA tensor: the memory, and the event that orders the
/// consumer's stream after the producer's writes.
struct WireTensor {
  enum class Kind : std::uint8_t { none, pool, ipc };
  Kind kind = Kind::none;
  std::int32_t device = 0;
  PoolBlock block{};                            ///< Kind::pool
  std::array<std::uint8_t, 64> ipc_handle{};    ///< Kind::ipc: cudaIpcMemHandle_t of the base
  std::uint64_t ipc_offset = 0;                 ///< Kind::ipc: the storage's start from the base
  std::uint64_t ipc_bytes = 0;
  std::uint64_t ipc_record = 0;                 ///< Kind::ipc: arena offset of its reference counts
  std::int32_t event_owner = -1;                ///< -1: no event (the producer synchronized)
  std::int32_t event_slot = 0;
  std::uint64_t event_generation = 0;
};

/// For TensorQueue::put: describes `storage` (Kind::cuda) for another process, adds one
/// reference held by the handle, and records an interprocess event on `stream` after the
/// producer's queued work. Throws CudaError.
WireTensor export_storage(const Storage& storage, cuda::Stream stream);
/// For TensorQueue::get: the storage behind `wire`, taking over the handle's reference; makes
/// `stream` wait for the producer's event. Throws CudaError.
std::shared_ptr<Storage> import_storage(const WireTensor& wire, cuda::Stream stream);
/// Drops the handle's reference without importing (a queue destroyed with items in it).
void release_wire(const WireTensor& wire) noexcept;

// ---- Copies ----
/// Copies `bytes` between any two of host memory and CUDA memory (cudaMemcpyAsync on
/// cuda::current_stream(), then waits for it). Throws CudaError.
void copy(void* dst, const void* src, std::size_t bytes);
/// Sets `bytes` of CUDA memory to zero (on the current stream, waited for). Throws CudaError.
void zero(void* dst, std::size_t bytes);

/// Page-locks host memory for every device (cudaHostRegister, portable), as torch's pin_memory
/// does for its batches: copies from it to a GPU then run at full speed and asynchronously.
/// Memory already registered is left as it is. Throws CudaError.
void register_host(void* base, std::size_t bytes);

}  // namespace nodal::detail::gpu
