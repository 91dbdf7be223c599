// The per-rank GPU pool (gpu.hpp "The per-job GPU pool"): VMM chunks made with cuMemCreate and a
// POSIX file descriptor handle type, mapped once in the owner, their descriptors published to
// the job's fd broker, imported and mapped once per process by the ranks that receive blocks.
// An imported chunk stays mapped for the life of the process, and its memory stays alive as long
// as any process maps it, so a consumer keeps reading after its producer freed the block or
// exited (DESIGN.md "GPU facts").
#include "block_table.hpp"
#include "common.hpp"
#include "driver.hpp"

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/fd_broker.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/units.hpp>

#include <unistd.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

namespace nodal::detail::gpu {
namespace {

// chunk_units sits in what was padding: queue cells and arena records that hold a PoolBlock keep
// their size.
static_assert(sizeof(PoolBlock) == 40);

constexpr std::uint64_t kDefaultChunkBytes = std::uint64_t{256} << 20;

/// NODAL_GPU_CHUNK_BYTES ("256M", "1G", bytes), default 256 MiB.
std::uint64_t chunk_bytes_setting() {
  std::string text = getenv_or_empty("NODAL_GPU_CHUNK_BYTES");
  if (text.empty()) return kDefaultChunkBytes;
  try {
    std::uint64_t bytes = parse_bytes(text);
    if (bytes == 0) throw UsageError("a chunk needs at least one byte");
    return bytes;
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("NODAL_GPU_CHUNK_BYTES: {}", e.what()));
  }
}

/// The broker key of a chunk: device in the high half, chunk number in the low half.
std::uint64_t chunk_key(int device, std::uint32_t chunk) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(device)) << 32) | chunk;
}

/// Pinned device memory on `device`, exportable as a POSIX file descriptor.
CUmemAllocationProp allocation_properties(int device) {
  CUdevice handle = 0;
  check(driver().device_get(&handle, device), "cuDeviceGet");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = handle;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

/// Reserves an address range for `bytes` of `handle`, maps it and gives `device` read-write
/// access. Returns the address; leaves nothing behind when it throws.
CUdeviceptr map_handle(CUmemGenericAllocationHandle handle, std::uint64_t bytes, std::uint64_t alignment,
                       const CUmemAllocationProp& prop) {
  const Driver& d = driver();
  CUdeviceptr base = 0;
  check(d.mem_address_reserve(&base, bytes, alignment, 0, 0), "cuMemAddressReserve");
  CUresult result = d.mem_map(base, bytes, 0, handle, 0);
  if (result != CUDA_SUCCESS) {
    (void)d.mem_address_free(base, bytes);
    check(result, "cuMemMap");
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  result = d.mem_set_access(base, bytes, &access, 1);
  if (result != CUDA_SUCCESS) {
    (void)d.mem_unmap(base, bytes);
    (void)d.mem_address_free(base, bytes);
    check(result, "cuMemSetAccess");
  }
  return base;
}

struct Chunk {
  CUdeviceptr base = 0;
  std::uint64_t bytes = 0;
};

/// This rank's pool on one device.
struct DevicePool {
  std::unique_ptr<BlockTable> table;
  std::vector<Chunk> chunks;
};

/// A peer's chunk mapped here, and the devices of this process granted access to it so far.
struct ImportedChunk {
  Chunk chunk;
  std::vector<int> access;
};

struct Pools {
  std::mutex mutex;  ///< everything below; chunk creation and import happen under it (rare)
  std::map<int, DevicePool> own;
  std::map<std::tuple<int, int, std::uint32_t>, ImportedChunk> imported;  ///< (owner, device, chunk)
};

/// Never destroyed: storages may be released by static destructors or after them.
Pools& pools() {
  static auto* p = new Pools;
  return *p;
}

/// Makes chunk `chunk` of this rank on `device` (at least `bytes`, a multiple of the
/// granularity), maps it here and publishes its descriptor. Called by the BlockTable under the
/// pools' lock.
Chunk make_chunk(int device, std::uint32_t chunk, std::uint64_t bytes, std::uint64_t granularity) {
  const Driver& d = driver();
  DeviceGuard guard(device);
  CUmemAllocationProp prop = allocation_properties(device);
  CUmemGenericAllocationHandle handle = 0;
  CUresult result = d.mem_create(&handle, bytes, &prop, 0);
  if (result == CUDA_ERROR_OUT_OF_MEMORY) {
    throw CudaError(fmt::format("out of GPU memory on cuda:{}: rank {} could not add a pool chunk of {} "
                                "(NODAL_GPU_CHUNK_BYTES; chunks so far: {})",
                                device, self().rank, format_bytes(bytes), chunk));
  }
  check(result, "cuMemCreate");
  CUdeviceptr base = 0;
  int fd = -1;
  try {
    base = map_handle(handle, bytes, granularity, prop);
    check(d.mem_export_to_shareable_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle");
    publish_fd(chunk_key(device, chunk), fd);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    if (base != 0) {
      (void)d.mem_unmap(base, bytes);
      (void)d.mem_address_free(base, bytes);
    }
    (void)d.mem_release(handle);
    throw;
  }
  ::close(fd);  // the broker keeps its own duplicate
  // The mapping keeps the memory alive (and so do the broker's descriptor and the peers'
  // mappings); the handle itself is not needed any more.
  (void)d.mem_release(handle);
  return Chunk{base, bytes};
}

DevicePool& own_pool(Pools& p, int device) {
  auto it = p.own.find(device);
  if (it != p.own.end()) return it->second;
  DevicePool& pool = p.own[device];
  try {
    const Driver& d = driver();
    require_capabilities(device, GpuUse::pool_export);  // a plain error, not a bare cuMemCreate failure
    DeviceGuard guard(device);
    CUmemAllocationProp prop = allocation_properties(device);
    std::size_t granularity = 0;
    check(d.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
          "cuMemGetAllocationGranularity");
    const Self& me = self();
    pool.table = std::make_unique<BlockTable>(
        job_arena(), me.rank, me.world_size, device, chunk_bytes_setting(), granularity,
        [&pool, device, granularity](std::uint32_t chunk, std::uint64_t bytes) {
          pool.chunks.push_back(make_chunk(device, chunk, bytes, granularity));
          return bytes;
        });
  } catch (...) {
    p.own.erase(device);
    throw;
  }
  return pool;
}

}  // namespace

std::shared_ptr<Storage> pool_allocate(int device, std::size_t bytes) {
  require_available("a cuda tensor");
  collect_limbo();
  if (device < 0 || device >= cuda::device_count()) {
    throw UsageError(fmt::format("a cuda:{} tensor: this process sees {} GPU(s)", device, cuda::device_count()));
  }
  Pools& p = pools();
  std::lock_guard lock(p.mutex);
  DevicePool& pool = own_pool(p, device);
  BlockTable::Block block = pool.table->allocate(bytes);
  const Chunk& chunk = pool.chunks.at(block.range.chunk);
  auto state = std::make_shared<GpuState>();
  state->kind = WireTensor::Kind::pool;
  state->block = PoolBlock{self().rank, device, block.range.chunk, 0, block.range.offset, bytes,
                           job_arena().offset_of(block.record)};
  void* data = reinterpret_cast<void*>(chunk.base + block.range.offset);
  return Storage::cuda(data, bytes, device, std::move(state), [device, block]() {
    Pools& all = pools();
    std::lock_guard held(all.mutex);
    all.own.at(device).table->retire(block);
  });
}

PoolBlock pool_block(const Storage& storage) noexcept {
  if (storage.kind() != Storage::Kind::cuda || !storage.gpu_state()) return {};
  const auto& state = *static_cast<const GpuState*>(storage.gpu_state().get());
  return state.kind == WireTensor::Kind::pool ? state.block : PoolBlock{};
}

std::optional<PoolBlock> find_pool_block(const void* address, std::size_t bytes) noexcept {
  if (address == nullptr || bytes == 0) return std::nullopt;
  try {
    const auto begin = reinterpret_cast<std::uintptr_t>(address);
    Pools& p = pools();
    std::lock_guard lock(p.mutex);
    for (const auto& [device, pool] : p.own) {
      for (std::size_t chunk = 0; chunk < pool.chunks.size(); ++chunk) {
        const Chunk& c = pool.chunks[chunk];
        // Inside [base, base + c.bytes), written so that nothing overflows.
        if (begin < c.base || begin - c.base > c.bytes || bytes > c.bytes - (begin - c.base)) continue;
        if (c.bytes % kPoolChunkUnit != 0 || c.bytes / kPoolChunkUnit > std::numeric_limits<std::uint32_t>::max()) {
          return std::nullopt;  // not describable without a record (never with 2 MiB granularity)
        }
        PoolBlock block;
        block.owner = self().rank;  // set up by the first pool_allocate, which made this chunk
        block.device = device;
        block.chunk = static_cast<std::uint32_t>(chunk);
        block.chunk_units = static_cast<std::uint32_t>(c.bytes / kPoolChunkUnit);
        block.offset = begin - c.base;
        block.bytes = bytes;
        block.record = 0;
        return block;
      }
    }
  } catch (...) {
    // a lock failure or self() throwing: not found (the caller takes its general path)
  }
  return std::nullopt;
}

namespace {

/// Gives `device` of this process read-write access to the imported chunk `chunk` of `owner_device`
/// (once per device: recorded in `chunk.access`). Throws CudaError when `device` cannot access
/// `owner_device`'s memory (no peer access between the two GPUs).
void grant_access(ImportedChunk& chunk, int owner_device, int device) {
  for (int granted : chunk.access) {
    if (granted == device) return;
  }
  if (device != owner_device) {
    int can = 0;
    check(cudaDeviceCanAccessPeer(&can, device, owner_device), "cudaDeviceCanAccessPeer");
    if (can == 0) {
      throw CudaError(fmt::format("a GPU pool block on cuda:{} used by a thread whose current device is cuda:{}: "
                                  "these GPUs cannot access each other's memory (no peer access); copy the tensor "
                                  "on cuda:{} first, or use it with cuda:{} current",
                                  owner_device, device, owner_device, owner_device));
    }
  }
  CUdevice handle = 0;
  check(driver().device_get(&handle, device), "cuDeviceGet");
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = handle;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(driver().mem_set_access(chunk.chunk.base, chunk.chunk.bytes, &access, 1), "cuMemSetAccess (a peer device)");
  chunk.access.push_back(device);
}

}  // namespace

void* map_pool_block(const PoolBlock& block) {
  require_available("a GPU pool block");
  // record 0: a range from find_pool_block (no reference counts; its size travels in the block).
  BlockRecord* record = block.record != 0 ? &record_of(block.record) : nullptr;
  Pools& p = pools();
  std::lock_guard lock(p.mutex);
  if (block.owner == self().rank) {
    // Our own block (a tensor that came back): already mapped here.
    auto it = p.own.find(block.device);
    if (it == p.own.end() || block.chunk >= it->second.chunks.size()) {
      throw CudaError(fmt::format("GPU pool block of rank {} on cuda:{} chunk {}: this rank has no such chunk",
                                  block.owner, block.device, block.chunk));
    }
    return reinterpret_cast<void*>(it->second.chunks[block.chunk].base + block.offset);
  }
  // The device this thread's kernels run on: the one of its current context, or the owner's
  // device when it has none (the guard below then leaves that one current).
  const int user_device = current_device_or(block.device);
  auto key = std::make_tuple(block.owner, block.device, block.chunk);
  auto it = p.imported.find(key);
  if (it == p.imported.end()) {
    const Driver& d = driver();
    DeviceGuard guard(block.device);
    CUmemAllocationProp prop = allocation_properties(block.device);
    const std::uint64_t bytes = record != nullptr ? record->chunk_bytes : std::uint64_t{block.chunk_units} * kPoolChunkUnit;
    if (bytes == 0) {
      throw CudaError(fmt::format("GPU pool block of rank {} on cuda:{} chunk {}: no chunk size (no record, no chunk_units)",
                                  block.owner, block.device, block.chunk));
    }
    int fd = fetch_fd(block.owner, chunk_key(block.device, block.chunk));
    CUmemGenericAllocationHandle handle = 0;
    // The POSIX fd handle type takes the descriptor itself as the "pointer" argument.
    CUresult result = d.mem_import_from_shareable_handle(&handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(fd);  // the imported handle does not need it
    check(result, "cuMemImportFromShareableHandle");
    CUdeviceptr base = 0;
    try {
      // The chunk's own granularity as the alignment (the owner's chunks are multiples of it).
      std::size_t granularity = 0;
      check(d.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            "cuMemGetAllocationGranularity");
      base = map_handle(handle, bytes, granularity, prop);
    } catch (...) {
      (void)d.mem_release(handle);
      throw;
    }
    (void)d.mem_release(handle);  // the mapping keeps the memory
    it = p.imported.emplace(key, ImportedChunk{Chunk{base, bytes}, {block.device}}).first;
  }
  // A thread on another GPU of this process reads the chunk too (gpu.hpp: access for every
  // device of this process that uses it); the mapping stays, whether or not this succeeds.
  grant_access(it->second, block.device, user_device);
  return reinterpret_cast<void*>(it->second.chunk.base + block.offset);
}

std::shared_ptr<Storage> pool_import(const WireTensor& wire) {
  const PoolBlock& block = wire.block;
  void* data = map_pool_block(block);
  BlockRecord& record = record_of(block.record);
  const int rank = self().rank;
  // The wire's reference becomes this rank's: count ours first, so the block is never unheld.
  record.ref(rank).fetch_add(1, std::memory_order_acq_rel);
  record.in_flight.fetch_sub(1, std::memory_order_acq_rel);
  auto state = std::make_shared<GpuState>();
  state->kind = WireTensor::Kind::pool;
  state->block = block;
  BlockRecord* held = &record;
  const int device = wire.device;
  return Storage::cuda(data, block.bytes, device, std::move(state), [held, rank, device]() {
    // The job failed: keep the reference (leaked on purpose; a dead rank's do not count).
    if (!quiesce_before_release(device)) return;
    held->ref(rank).fetch_sub(1, std::memory_order_acq_rel);
  });
}

}  // namespace nodal::detail::gpu
