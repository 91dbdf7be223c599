// Tensor storage: private heap memory, a block of the job arena (reference-counted across
// processes), a mapped file, memory owned by a DLPack producer, or CUDA memory (the GPU layer,
// gpu.hpp). Internal.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace nodal {
class Arena;
enum class DType : std::uint8_t;
}  // namespace nodal

namespace nodal::detail {

/// At the start of every arena storage block; the bytes follow at +64. `refs` counts references
/// in all processes: each in-process Storage object holds one, and each tensor sitting in a queue
/// holds one. The block is freed when it drops to zero, in whichever process that happens.
struct alignas(64) ArenaStorageHeader {
  static constexpr std::uint64_t kMagic = 0x656761726f74536eULL;
  std::uint64_t magic;
  std::atomic<std::int64_t> refs;
  std::uint64_t bytes;
};
inline constexpr std::size_t kArenaStorageDataOffset = 64;

class Storage {
 public:
  enum class Kind { heap, arena, file, external, cuda };

  /// Private memory (uninitialised, or zeroed).
  static std::shared_ptr<Storage> heap(std::size_t bytes, bool zero = false);
  /// A new arena block with refs = 1. Throws ShmError.
  static std::shared_ptr<Storage> arena(Arena& arena, std::size_t bytes);
  /// Takes over one existing reference to the arena block whose header is at `header_offset`
  /// (what a queue's get() does with the reference put() added). Throws ShmError when the
  /// offset does not hold a storage header.
  static std::shared_ptr<Storage> adopt_arena(Arena& arena, std::uint64_t header_offset);
  /// A MAP_SHARED mapping of `bytes` of a file (already opened and sized by the caller).
  static std::shared_ptr<Storage> file(int fd, std::size_t bytes, bool writable);
  /// Memory someone else owns; `release` runs once when this storage goes.
  static std::shared_ptr<Storage> external(void* data, std::size_t bytes, std::function<void()> release);
  /// CUDA memory on `device` (a device address): `gpu_state` is the GPU layer's bookkeeping
  /// (pool block or IPC export, gpu.hpp), `release` runs once when this storage goes.
  static std::shared_ptr<Storage> cuda(void* data, std::size_t bytes, int device, std::shared_ptr<void> gpu_state,
                                       std::function<void()> release);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Kind kind() const noexcept { return kind_; }
  std::byte* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  /// Arena kind only: the header's offset in the arena (the handle other processes use).
  std::uint64_t arena_offset() const noexcept { return arena_offset_; }
  /// Arena kind only: the arena the block is in (a process may have had one before init()).
  const Arena* arena() const noexcept { return arena_; }
  /// Cuda kind only: the device index and the GPU layer's bookkeeping.
  int device() const noexcept { return device_; }
  const std::shared_ptr<void>& gpu_state() const noexcept { return gpu_state_; }
  /// Arena kind only: adds a reference for a handle about to leave this process.
  void retain_for_handle() const noexcept;
  /// Copies a heap or external storage into a new arena block and becomes that block (so every
  /// tensor holding this Storage sees the move). No-op for arena and file storage. Throws ShmError.
  void move_to_arena(Arena& arena);

 private:
  Storage() = default;
  void release() noexcept;

  Kind kind_ = Kind::heap;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  Arena* arena_ = nullptr;
  std::uint64_t arena_offset_ = 0;
  int device_ = -1;
  std::shared_ptr<void> gpu_state_;
  std::function<void()> release_;  ///< heap/file/external/cuda: frees or unmaps
  std::mutex move_mutex_;          ///< move_to_arena from two threads at once
};

/// The job's arena in this process: the one nodal::init() attached, or (without nodalrun, or
/// before init) a private arena of NODAL_SHM_SIZE bytes (default 1 GiB, reserved page by page as
/// it is used) created on first use. Throws ShmError.
Arena& job_arena();
/// Makes `arena` the job's arena in this process (nodal::init(), once it has attached the
/// launcher's). An arena made earlier by job_arena() stays mapped until exit: tensors made
/// before init may still live in it.
void set_job_arena(std::unique_ptr<Arena> arena);

/// Whether this process has made or been given an arena yet (without making one).
bool job_arena_exists() noexcept;

/// Row-major strides (in elements) for `shape`, as Tensor::empty makes them.
std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape);
/// The bytes a strided view with at least one element reaches, as [low, high) relative to its
/// first element (low < 0 with negative strides): what its storage must hold. Strides are in
/// elements. Throws UsageError when the span does not fit in 64 bits.
std::pair<std::int64_t, std::int64_t> byte_span(const std::vector<std::int64_t>& shape,
                                                const std::vector<std::int64_t>& strides, DType dtype);

}  // namespace nodal::detail
