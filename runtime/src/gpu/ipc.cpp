// CUDA memory from other allocators (Tensor::from_cuda: cudaMalloc, a caching allocator, DLPack)
// shared with the legacy IPC API, as torch.multiprocessing does: cudaIpcGetMemHandle of the
// allocation's base plus the offset of the storage in it. The rules, torch's too:
// - the producer keeps the memory alive while consumers hold references: its release is deferred
//   (the "limbo", torch's CudaIPCSentDataLimbo) until the BlockRecord's counts are 0, re-checked
//   on every nodal GPU call and at exit; a dead consumer's references do not count;
// - a consumer opens each handle once per process (cudaIpcOpenMemHandle costs ~240 us) however
//   many storages of it it holds at once, and closes it (cudaIpcCloseMemHandle) when the last of
//   them goes, BEFORE it drops that storage's reference: "calling cudaFree on an exported memory
//   region before calling cudaIpcCloseMemHandle in the importing context will result in undefined
//   behavior" (cuda_runtime_api.h), and the producer's release (typically cudaFree) runs as soon
//   as the counts are 0. No idle handle is kept open for reuse: a consumer that receives the same
//   allocation again pays the open again (torch's consumers do the same).
//   Two exports of one allocation (two Tensor::from_cuda over it, each with its own record and
//   release) share the consumer's open handle: each record can reach 0 while the other export
//   keeps the handle open, so such releases must not free the allocation before the last export
//   is released (the producer's own storages over it would be invalid then too).
#include "block_table.hpp"
#include "common.hpp"
#include "driver.hpp"

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/storage.hpp>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace nodal::detail::gpu {
namespace {

using Handle = std::array<std::uint8_t, 64>;
static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(Handle));

/// How long exit waits for consumers to drop the memory this process exported.
constexpr auto kExitWait = std::chrono::seconds(10);

struct Opened {
  void* base = nullptr;
  int device = 0;
  int live = 0;  ///< storages over it in this process (the entry goes when it reaches 0)
};

struct Deferred {
  BlockRecord* record;
  std::function<void()> release;
};

struct Ipc {
  std::mutex mutex;
  std::map<Handle, Opened> opened;  ///< handles open in this process, each once
  std::vector<Deferred> limbo;
  bool exit_hook = false;
};

/// Never destroyed (storages are released during and after static destruction).
Ipc& ipc() {
  static auto* state = new Ipc;
  return *state;
}

/// Closes an opened handle (in the context it was opened in). Errors are ignored: a release path.
void close_opened(const Opened& entry) noexcept {
  try {
    DeviceGuard guard(entry.device);
    if (cudaIpcCloseMemHandle(entry.base) != cudaSuccess) (void)cudaGetLastError();
  } catch (...) {
    (void)cudaGetLastError();
  }
}

/// At exit: waits (up to kExitWait, or until the job fails) for consumers to drop what this
/// process exported, then runs those releases; warns about what is still held.
/// An atexit handler: nothing may escape it (std::terminate otherwise).
void drain_limbo_at_exit() noexcept {
  try {
    auto deadline = std::chrono::steady_clock::now() + kExitWait;
    for (;;) {
      collect_limbo();
      std::size_t left = 0;
      {
        std::lock_guard lock(ipc().mutex);
        left = ipc().limbo.size();
      }
      if (left == 0) return;
      if (job_failed() || std::chrono::steady_clock::now() >= deadline) {
        std::fprintf(stderr,
                     "nodal: rank %d exits while other ranks still use %zu CUDA allocation(s) it shared with "
                     "Tensor::from_cuda; they become invalid now (pool tensors, Tensor::empty on a GPU, do not)\n",
                     self().rank, left);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nodal: at exit, waiting for consumers of shared CUDA allocations failed: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "nodal: at exit, waiting for consumers of shared CUDA allocations failed\n");
  }
}

}  // namespace

void collect_limbo() noexcept {
  Ipc& s = ipc();
  std::vector<std::function<void()>> ready;
  {
    std::lock_guard lock(s.mutex);
    if (s.limbo.empty()) return;
    try {
      Arena& arena = job_arena();
      for (std::size_t i = 0; i < s.limbo.size();) {
        if (record_unused(arena, *s.limbo[i].record)) {
          destroy_record(arena, s.limbo[i].record);
          ready.push_back(std::move(s.limbo[i].release));
          s.limbo[i] = std::move(s.limbo.back());
          s.limbo.pop_back();
        } else {
          ++i;
        }
      }
    } catch (...) {
      return;
    }
  }
  for (auto& release : ready) {
    try {
      if (release) release();
    } catch (...) {
      // a user's release that throws: nothing sensible to do in a release path
    }
  }
}

std::shared_ptr<Storage> external_storage(void* data, std::size_t bytes, int device, std::function<void()> release) {
  require_available("Tensor::from_cuda");
  collect_limbo();
  if (device < 0 || device >= cuda::device_count()) {
    throw UsageError(fmt::format("Tensor::from_cuda: device cuda:{}, this process sees {} GPU(s)", device,
                                 cuda::device_count()));
  }
  if (bytes == 0) {
    // Nothing to share: an empty storage (its wire carries no memory).
    return Storage::cuda(data, 0, device, std::make_shared<GpuState>(), std::move(release));
  }
  DeviceGuard guard(device);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  check(driver().mem_get_address_range(&base, &size, reinterpret_cast<CUdeviceptr>(data)),
        "cuMemGetAddressRange (Tensor::from_cuda: is the pointer device memory?)");
  const std::uint64_t offset = reinterpret_cast<CUdeviceptr>(data) - base;
  if (offset + bytes > size) {
    throw UsageError(fmt::format("Tensor::from_cuda: {} bytes at offset {} of an allocation of {} bytes", bytes, offset, size));
  }
  cudaIpcMemHandle_t handle{};
  cudaError_t result = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
  if (result != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(fmt::format("Tensor::from_cuda: cudaIpcGetMemHandle failed: {} ({}); only memory from cudaMalloc "
                                "(not cudaMallocAsync pools or VMM) can be shared this way: use Tensor::empty on the "
                                "device instead",
                                cudaGetErrorName(result), cudaGetErrorString(result)));
  }
  const Self& me = self();
  Arena& arena = job_arena();
  BlockRecord* record = create_record(arena, me.rank, me.world_size);
  record->owner_pid = static_cast<std::int32_t>(me.pid);
  record->device = device;
  record->offset = offset;
  record->bytes = bytes;
  record->chunk_bytes = size;
  record->owner_address = base;
  record->ref(me.rank).store(1, std::memory_order_release);

  auto state = std::make_shared<GpuState>();
  state->kind = WireTensor::Kind::ipc;
  std::memcpy(state->ipc_handle.data(), &handle, sizeof handle);
  state->ipc_offset = offset;
  state->ipc_record = arena.offset_of(record);
  {
    Ipc& s = ipc();
    std::lock_guard lock(s.mutex);
    if (!s.exit_hook) {
      s.exit_hook = true;
      std::atexit(drain_limbo_at_exit);  // after the CUDA runtime started: runs before its teardown
    }
  }
  const int rank = me.rank;
  return Storage::cuda(data, bytes, device, std::move(state), [record, rank, release = std::move(release)]() mutable {
    record->ref(rank).fetch_sub(1, std::memory_order_acq_rel);
    Ipc& s = ipc();
    {
      std::lock_guard lock(s.mutex);
      s.limbo.push_back({record, std::move(release)});
    }
    collect_limbo();  // released at once when no consumer holds it
  });
}

/// Refuses (closing the handle) an opened range that may not be the producer's allocation
/// (compatibility.hpp opened_range_problem) rather than read the wrong bytes.
void check_opened_range(void* opened, const BlockRecord& record) {
  OpenedRange range;
  range.opened = reinterpret_cast<CUdeviceptr>(opened);
  std::size_t size = 0;
  CUdeviceptr base = 0;
  const CUresult result = driver().mem_get_address_range(&base, &size, range.opened);
  range.range_base = base;
  range.range_size = size;
  const std::string problem =
      result == CUDA_SUCCESS ? opened_range_problem(range, record.chunk_bytes, record.offset + record.bytes) : "";
  if (result == CUDA_SUCCESS && problem.empty()) return;
  (void)cudaIpcCloseMemHandle(opened);
  check(result, "cuMemGetAddressRange (of an opened IPC handle)");
  throw CudaError(fmt::format("a cuda tensor from rank {} (Tensor::from_cuda): {}", record.owner, problem));
}

std::shared_ptr<Storage> ipc_import(const WireTensor& wire) {
  BlockRecord& record = record_of(wire.ipc_record);
  const Self& me = self();
  std::byte* base = nullptr;
  Handle key = wire.ipc_handle;
  const bool own = record.owner_pid == me.pid;
  Ipc& s = ipc();
  if (own) {
    // Our own allocation came back: a process cannot open its own handle, and need not.
    base = reinterpret_cast<std::byte*>(record.owner_address);
  } else {
    std::lock_guard lock(s.mutex);
    auto it = s.opened.find(key);
    if (it == s.opened.end()) {
      DeviceGuard guard(wire.device);
      cudaIpcMemHandle_t handle;
      std::memcpy(&handle, key.data(), sizeof handle);
      void* opened = nullptr;
      check(cudaIpcOpenMemHandle(&opened, handle, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      check_opened_range(opened, record);
      it = s.opened.emplace(key, Opened{opened, wire.device, 0}).first;
    }
    it->second.live += 1;
    base = static_cast<std::byte*>(it->second.base);
  }
  record.ref(me.rank).fetch_add(1, std::memory_order_acq_rel);
  record.in_flight.fetch_sub(1, std::memory_order_acq_rel);
  auto state = std::make_shared<GpuState>();
  state->kind = WireTensor::Kind::ipc;
  state->ipc_handle = key;
  state->ipc_offset = wire.ipc_offset;
  state->ipc_record = wire.ipc_record;
  BlockRecord* held = &record;
  const int rank = me.rank;
  const int device = wire.device;
  return Storage::cuda(base + wire.ipc_offset, wire.ipc_bytes, device, std::move(state), [held, rank, key, own, device]() {
    // The job failed: keep the handle open and the reference (the memory is leaked on purpose;
    // the producer does not count a dead rank's references, and the driver closes at exit).
    if (!quiesce_before_release(device)) return;
    if (!own) {
      // Close first, then drop the reference: the producer may free the memory as soon as the
      // counts reach 0, and must not do so while the handle is open here. The lock is held
      // across the close so that no other thread of this process finds the entry meanwhile.
      Ipc& cache = ipc();
      std::lock_guard lock(cache.mutex);
      auto it = cache.opened.find(key);
      if (it != cache.opened.end() && --it->second.live == 0) {
        close_opened(it->second);
        cache.opened.erase(it);
      }
    }
    held->ref(rank).fetch_sub(1, std::memory_order_acq_rel);
  });
}

}  // namespace nodal::detail::gpu
