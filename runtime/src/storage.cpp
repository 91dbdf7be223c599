#include <nodal/detail/storage.hpp>

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>

#include <sys/mman.h>

#include <cstring>
#include <new>
#include <utility>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

/// Cache-line alignment, so that no two tensors share a line and vector loads never split one.
constexpr std::align_val_t kHeapAlignment{64};

ArenaStorageHeader* header_of(std::byte* data) noexcept {
  return reinterpret_cast<ArenaStorageHeader*>(data - kArenaStorageDataOffset);
}

}  // namespace

// Each factory makes the Storage object before it takes the memory (arena: frees the block if
// that fails), so that a failure at either step leaves nothing behind.

std::shared_ptr<Storage> Storage::heap(std::size_t bytes, bool zero) {
  std::shared_ptr<Storage> storage(new Storage);
  auto* data = static_cast<std::byte*>(::operator new(bytes, kHeapAlignment));
  if (zero) std::memset(data, 0, bytes);
  storage->data_ = data;
  storage->bytes_ = bytes;
  storage->release_ = [data] { ::operator delete(data, kHeapAlignment); };
  return storage;
}

std::shared_ptr<Storage> Storage::arena(Arena& arena, std::size_t bytes) {
  void* block = arena.allocate(kArenaStorageDataOffset + bytes, 64);
  new (block) ArenaStorageHeader{ArenaStorageHeader::kMagic, 1, bytes};
  try {
    // The new block's one reference goes to the Storage, as if it had come through a queue.
    return adopt_arena(arena, arena.offset_of(block));
  } catch (...) {
    arena.deallocate(block);
    throw;
  }
}

std::shared_ptr<Storage> Storage::adopt_arena(Arena& arena, std::uint64_t header_offset) {
  // A handle comes from another process: check that it points at a live storage block before
  // trusting the size written there.
  const bool in_bounds =
      header_offset % alignof(ArenaStorageHeader) == 0 && header_offset <= arena.size() - kArenaStorageDataOffset;
  auto* header = in_bounds ? static_cast<ArenaStorageHeader*>(arena.at(header_offset)) : nullptr;
  if (!header || header->magic != ArenaStorageHeader::kMagic ||
      header->bytes > arena.size() - header_offset - kArenaStorageDataOffset) {
    throw ShmError(
        fmt::format("arena offset {} does not hold a tensor storage (a stale or corrupt handle)", header_offset));
  }
  std::shared_ptr<Storage> storage(new Storage);
  storage->kind_ = Kind::arena;
  storage->data_ = reinterpret_cast<std::byte*>(header) + kArenaStorageDataOffset;
  storage->bytes_ = header->bytes;
  storage->arena_ = &arena;
  storage->arena_offset_ = header_offset;
  return storage;
}

std::shared_ptr<Storage> Storage::file(int fd, std::size_t bytes, bool writable) {
  std::shared_ptr<Storage> storage(new Storage);
  storage->kind_ = Kind::file;
  storage->bytes_ = bytes;
  if (bytes == 0) return storage;  // mmap rejects a length of 0, and there is nothing to map
  void* data = ::mmap(nullptr, bytes, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) throw_errno("mmap");
  storage->data_ = static_cast<std::byte*>(data);
  storage->release_ = [data, bytes] { ::munmap(data, bytes); };
  return storage;
}

std::shared_ptr<Storage> Storage::external(void* data, std::size_t bytes, std::function<void()> release) {
  std::shared_ptr<Storage> storage(new Storage);
  storage->kind_ = Kind::external;
  storage->data_ = static_cast<std::byte*>(data);
  storage->bytes_ = bytes;
  storage->release_ = std::move(release);
  return storage;
}

std::shared_ptr<Storage> Storage::cuda(void* data, std::size_t bytes, int device, std::shared_ptr<void> gpu_state,
                                       std::function<void()> release) {
  std::shared_ptr<Storage> storage(new Storage);
  storage->kind_ = Kind::cuda;
  storage->data_ = static_cast<std::byte*>(data);
  storage->bytes_ = bytes;
  storage->device_ = device;
  storage->gpu_state_ = std::move(gpu_state);
  storage->release_ = std::move(release);
  return storage;
}

Storage::~Storage() { release(); }

void Storage::retain_for_handle() const noexcept {
  // Relaxed is enough: the caller already holds a reference, so the block cannot go meanwhile.
  if (kind_ == Kind::arena) header_of(data_)->refs.fetch_add(1, std::memory_order_relaxed);
}

void Storage::release() noexcept {
  if (kind_ != Kind::arena) {
    if (release_) release_();
    return;
  }
  ArenaStorageHeader* header = header_of(data_);
  // acq_rel: the last owner, in whichever process, must see every other owner's writes to the
  // block before the allocator hands it out again.
  if (header->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    header->magic = 0;  // a stale handle to this block now fails adopt_arena
    arena_->deallocate(header);
  }
}

void Storage::move_to_arena(Arena& arena) {
  std::lock_guard lock(move_mutex_);
  if (kind_ == Kind::arena || kind_ == Kind::file || kind_ == Kind::cuda) return;
  auto block = Storage::arena(arena, bytes_);
  if (bytes_ != 0) std::memcpy(block->data_, data_, bytes_);
  // Trade places with the new block: this object, which every tensor holds, becomes the arena
  // storage, and `block` takes the old memory, which its destructor frees through release_.
  std::swap(kind_, block->kind_);
  std::swap(data_, block->data_);
  std::swap(arena_, block->arena_);
  std::swap(arena_offset_, block->arena_offset_);
  std::swap(release_, block->release_);
}

}  // namespace nodal::detail
