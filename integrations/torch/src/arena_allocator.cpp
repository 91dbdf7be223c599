#include <nodal/torch/arena_allocator.hpp>

#include <nodal/torch/backend_base.hpp>

#include "tensor_bridge.hpp"

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/nodal.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/units.hpp>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include <unistd.h>

namespace nodal::torch_backend {
namespace {

/// Above torch's own registration (priority 0), so that SetCPUAllocator takes it.
constexpr std::uint8_t kPriority = 1;

/// One tensor's block: what the DataPtr's deleter needs.
struct Block {
  Arena* arena;
  void* data;
  std::size_t bytes;
  pid_t owner;  ///< the process that allocated it
};

class ArenaAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) NODAL_TORCH_ALLOCATE_CONST override {
    Arena* arena = arena_.load(std::memory_order_acquire);
    if (arena != nullptr && n >= min_bytes_.load(std::memory_order_relaxed)) {
      try {
        void* data = arena->allocate(n, 64);
        live_bytes_.fetch_add(n, std::memory_order_relaxed);
        return {data, new Block{arena, data, n, ::getpid()}, &release, c10::Device(c10::kCPU)};
      } catch (const ShmError& e) {
        fallbacks_.fetch_add(1, std::memory_order_relaxed);
        TORCH_WARN_ONCE("nodal: the job's arena has no room for a tensor of ", n, " bytes (", e.what(),
                        "): it and later tensors the arena cannot hold come from torch's allocator, and nodal's "
                        "collectives copy them");
      }
    }
    return fallback_.load(std::memory_order_acquire)->allocate(n);
  }

#if NODAL_TORCH_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#endif

  /// Installs this allocator (the caller holds mutex_).
  void install(Arena& arena, std::size_t min_bytes) {
    min_bytes_.store(min_bytes, std::memory_order_relaxed);
    arena_.store(&arena, std::memory_order_release);
    c10::Allocator* current = c10::GetCPUAllocator();
    if (current == this) return;
    fallback_.store(current, std::memory_order_release);
    c10::SetCPUAllocator(this, kPriority);
    TORCH_CHECK(c10::GetCPUAllocator() == this,
                "nodal: use_arena_allocator: torch kept its CPU allocator (another was set with a higher priority)");
  }

  /// Puts the allocator it replaced back (the caller holds mutex_).
  void uninstall() {
    if (c10::GetCPUAllocator() != this) return;
    c10::SetCPUAllocator(fallback_.load(std::memory_order_acquire), kPriority);
  }

  ArenaAllocatorStats stats() const noexcept {
    return {c10::GetCPUAllocator() == this, min_bytes_.load(std::memory_order_relaxed),
            live_bytes_.load(std::memory_order_relaxed), fallbacks_.load(std::memory_order_relaxed)};
  }

  std::mutex mutex;  ///< install and uninstall

 private:
  static void release(void* context) {
    auto* block = static_cast<Block*>(context);
    // A forked child (a DataLoader worker, say) holds copies of its parent's tensors, but their
    // memory is shared, not copied: only the allocating process may give it back.
    if (block->owner == ::getpid()) {
      block->arena->deallocate(block->data);
      the().live_bytes_.fetch_sub(block->bytes, std::memory_order_relaxed);
    }
    delete block;
  }

 public:
  /// Never destroyed: torch frees tensors after static destructors have run (arenas live as long).
  static ArenaAllocator& the() {
    static auto* allocator = new ArenaAllocator;
    return *allocator;
  }

 private:
  std::atomic<Arena*> arena_{nullptr};
  std::atomic<c10::Allocator*> fallback_{c10::GetDefaultCPUAllocator()};
  std::atomic<std::size_t> min_bytes_{kArenaAllocatorMinBytes};
  mutable std::atomic<std::size_t> live_bytes_{0};
  mutable std::atomic<std::size_t> fallbacks_{0};
};

}  // namespace

void use_arena_allocator(std::size_t min_bytes) {
  TORCH_CHECK(min_bytes > 0, "nodal: use_arena_allocator: min_bytes must be at least 1");
  Arena* arena = nullptr;
  try {
    arena = &nodal::init().arena();
  } catch (const Error& e) {
    raise(c10::str("nodal: use_arena_allocator: ", e.what()));
  }
  ArenaAllocator& allocator = ArenaAllocator::the();
  std::lock_guard lock(allocator.mutex);
  allocator.install(*arena, min_bytes);
}

void stop_arena_allocator() {
  ArenaAllocator& allocator = ArenaAllocator::the();
  std::lock_guard lock(allocator.mutex);
  allocator.uninstall();
}

ArenaAllocatorStats arena_allocator_stats() noexcept { return ArenaAllocator::the().stats(); }

void use_arena_allocator_from_env() {
  const std::string text = detail::getenv_or_empty("NODAL_TORCH_ARENA_MIN_BYTES");
  if (text.empty()) return;
  std::size_t min_bytes = 0;
  try {
    min_bytes = detail::parse_bytes(text);
  } catch (const UsageError& e) {
    raise(c10::str("nodal: NODAL_TORCH_ARENA_MIN_BYTES: ", e.what()));
  }
  if (min_bytes > 0) use_arena_allocator(min_bytes);
}

}  // namespace nodal::torch_backend
