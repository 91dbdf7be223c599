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

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include <unistd.h>

namespace nodal::torch_backend {
namespace {

/// Above torch's own registration (priority 0), so that SetCPUAllocator takes it.
constexpr std::uint8_t kPriority = 1;

/// In front of every arena block this allocator hands out (the tensor's bytes follow at +64, so
/// the DataPtr's context is its data pointer, as torch's raw_allocate requires).
struct alignas(64) BlockHeader {
  std::size_t bytes;
  pid_t owner;  ///< the process that allocated it: only it gives the block back
};
constexpr std::size_t kHeaderBytes = sizeof(BlockHeader);
static_assert(kHeaderBytes == 64);

/// What the allocator leaves free in the arena for nodal itself (communicators, queues, the
/// v-variants' scratch) and for tensors made with nodal_torch.empty_shared: an eighth of the
/// arena, at least 48 MiB and at most 256 MiB. The floor holds a new group of 4 ranks that
/// outnumber the cores with room to spare: its slots take 16 MiB and its pipelined ring 16 MiB
/// (collectives/src/comm_state.hpp kSmallSlotMaxBytes, CommState::ensure_ring).
std::size_t reserve_of(std::size_t arena_bytes) {
  return std::clamp<std::size_t>(arena_bytes / 8, std::size_t{48} << 20, std::size_t{256} << 20);
}

class ArenaAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) NODAL_TORCH_ALLOCATE_CONST override {
    if (n >= min_bytes_.load(std::memory_order_relaxed) && enabled_.load(std::memory_order_acquire)) {
      // A forked child (a DataLoader worker) keeps to torch's memory.
      const pid_t me = ::getpid();
      if (me == installer_.load(std::memory_order_relaxed)) {
        if (void* data = arena_allocate(n, me)) return {data, data, &release, c10::Device(c10::kCPU)};
      }
    }
    return fallback_.load(std::memory_order_acquire)->allocate(n);
  }

  /// For torch's raw_allocate / raw_deallocate (mkldnn's buffers): one deleter for the arena's
  /// blocks and the fallback's.
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  /// torch >= 2.2 declares it pure virtual (copy-on-write tensors); an unrelated member before, so
  /// it carries no `override` (which clang would flag as inconsistent).
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Winconsistent-missing-override"
#endif
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
#if defined(__clang__)
#pragma clang diagnostic pop
#endif

  /// Installs this allocator (the caller holds mutex). Changes nothing when torch refuses it.
  void install(Arena& arena, std::size_t min_bytes) {
    c10::Allocator* current = c10::GetCPUAllocator();
    if (current != this) {
      c10::Allocator* before = fallback_.exchange(current, std::memory_order_acq_rel);
      c10::DeleterFnPtr raw_before = fallback_raw_.exchange(current->raw_deleter(), std::memory_order_acq_rel);
      c10::SetCPUAllocator(this, kPriority);
      if (c10::GetCPUAllocator() != this) {
        fallback_.store(before, std::memory_order_release);
        fallback_raw_.store(raw_before, std::memory_order_release);
        raise("nodal: use_arena_allocator: torch kept its CPU allocator (another was set with a higher priority)");
      }
    }
    min_bytes_.store(min_bytes, std::memory_order_relaxed);
    reserve_.store(reserve_of(arena.size()), std::memory_order_relaxed);
    installer_.store(::getpid(), std::memory_order_relaxed);
    arena_.store(&arena, std::memory_order_release);
    enabled_.store(true, std::memory_order_release);
  }

  /// From now on every allocation is the fallback's. It stays torch's CPU allocator: blocks still
  /// in the arena may be freed through torch's raw_deallocate (mkldnn), which asks the current
  /// allocator's raw_deleter(), and only release() tells arena blocks from the fallback's.
  void uninstall() { enabled_.store(false, std::memory_order_release); }

  ArenaAllocatorStats stats() const noexcept {
    return {enabled_.load(std::memory_order_acquire),
            min_bytes_.load(std::memory_order_relaxed), live_bytes_.load(std::memory_order_relaxed),
            fallbacks_.load(std::memory_order_relaxed)};
  }

  /// Never destroyed: torch frees tensors after static destructors have run (arenas live as long).
  static ArenaAllocator& the() {
    static auto* allocator = new ArenaAllocator;
    return *allocator;
  }

  std::mutex mutex;  ///< install and uninstall

 private:
  /// `n` bytes in the arena for `owner` (this process), or nullptr (counted, warned once) when taking them would leave less
  /// than the reserve free (Arena::allocate_leaving: checked under the arena's lock, so ranks
  /// allocating at once cannot pass it together) or the arena cannot give them.
  void* arena_allocate(std::size_t n, pid_t owner) const {
    Arena* arena = arena_.load(std::memory_order_acquire);
    std::string why;
    try {
      void* block = n <= arena->size() ? arena->allocate_leaving(n + kHeaderBytes, reserve_.load(std::memory_order_relaxed), 64)
                                       : nullptr;
      if (block != nullptr) {
        auto* header = new (block) BlockHeader{n, owner};
        live_bytes_.fetch_add(n, std::memory_order_relaxed);
        return reinterpret_cast<std::byte*>(header) + kHeaderBytes;
      }
      why = no_room_reason(*arena);
    } catch (const Error& e) {  // ShmError: no room in one piece; PeerFailure: the job is failing anyway
      why = e.what();
    }
    fallbacks_.fetch_add(1, std::memory_order_relaxed);
    TORCH_WARN_ONCE("nodal: the job's arena has no room for a tensor of ", n, " bytes (", why,
                    "): it and later tensors the arena cannot hold come from torch's allocator, and nodal's "
                    "collectives copy them");
    return nullptr;
  }

  std::string no_room_reason(const Arena& arena) const {
    return c10::str(arena.free_bytes(), " bytes free of ", arena.size(), ", ", reserve_.load(std::memory_order_relaxed),
                    " kept for nodal itself: raise nodalrun --shm-size");
  }

  /// The DataPtr deleter of arena blocks, and raw_deleter() for every pointer.
  static void release(void* data) {
    ArenaAllocator& self = the();
    Arena* arena = self.arena_.load(std::memory_order_acquire);
    if (arena == nullptr || !arena->contains(data)) {
      // A block of the fallback's that torch's raw_allocate gave out. Torch's own allocator has a
      // raw deleter; one without leaves nothing to call (its raw blocks leak).
      if (c10::DeleterFnPtr raw = self.fallback_raw_.load(std::memory_order_acquire)) raw(data);
      return;
    }
    auto* header = reinterpret_cast<BlockHeader*>(static_cast<std::byte*>(data) - kHeaderBytes);
    // A forked child holds copies of its parent's tensors, but their memory is shared, not
    // copied: only the allocating process may give it back.
    if (header->owner != ::getpid()) return;
    self.live_bytes_.fetch_sub(header->bytes, std::memory_order_relaxed);
    arena->deallocate(header);
  }

  std::atomic<bool> enabled_{false};
  std::atomic<Arena*> arena_{nullptr};
  std::atomic<c10::Allocator*> fallback_{c10::GetDefaultCPUAllocator()};
  std::atomic<c10::DeleterFnPtr> fallback_raw_{nullptr};
  std::atomic<std::size_t> min_bytes_{kArenaAllocatorMinBytes};
  std::atomic<std::size_t> reserve_{0};
  std::atomic<pid_t> installer_{0};
  mutable std::atomic<std::size_t> live_bytes_{0};
  mutable std::atomic<std::size_t> fallbacks_{0};
};

}  // namespace

void use_arena_allocator(std::size_t min_bytes) {
  TORCH_CHECK(min_bytes > 0, "nodal: use_arena_allocator: min_bytes must be at least 1");
  Arena* arena = nullptr;
  bool launched = false;
  try {
    const Context context = nodal::init();
    arena = &context.arena();
    launched = context.launched();
  } catch (const Error& e) {
    raise(c10::str("nodal: use_arena_allocator: ", e.what()));
  }
  if (!launched) {
    TORCH_WARN("nodal: use_arena_allocator: this process was not started by nodalrun, so the arena is its own: "
               "no other process reads its tensors in place");
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
