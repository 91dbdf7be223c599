#include <nodal/detail/storage.hpp>

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/units.hpp>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

constexpr std::size_t kDefaultArenaBytes = std::size_t{1} << 30;

struct JobArenas {
  std::mutex mutex;             ///< creation and replacement
  std::atomic<Arena*> current;  ///< read without the lock: every tensor allocation asks
  /// Every arena this process made or was given. Never shrinks: storages keep raw pointers to
  /// their arena, and a tensor made before nodal::init() may outlive the switch.
  std::vector<std::unique_ptr<Arena>> all;
};

/// Never destroyed: a tensor in a static object may be freed after static destructors have run,
/// and the kernel unmaps everything at exit anyway.
JobArenas& job_arenas() {
  static auto* arenas = new JobArenas;
  return *arenas;
}

std::size_t default_arena_bytes() {
  std::string text = getenv_or_empty("NODAL_SHM_SIZE");
  if (text.empty()) return kDefaultArenaBytes;
  try {
    std::size_t bytes = parse_bytes(text);
    if (bytes == 0) throw UsageError("the arena needs at least one byte");
    return bytes;
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("NODAL_SHM_SIZE: {}", e.what()));
  }
}

/// Makes `arena` the current one; the caller holds arenas.mutex.
Arena& install(JobArenas& arenas, std::unique_ptr<Arena> arena) {
  arenas.all.push_back(std::move(arena));
  arenas.current.store(arenas.all.back().get(), std::memory_order_release);
  return *arenas.all.back();
}

}  // namespace

Arena& job_arena() {
  JobArenas& arenas = job_arenas();
  if (Arena* arena = arenas.current.load(std::memory_order_acquire)) return *arena;
  std::lock_guard lock(arenas.mutex);
  if (Arena* arena = arenas.current.load(std::memory_order_relaxed)) return *arena;
  return install(arenas, Arena::create(default_arena_bytes()));
}

void set_job_arena(std::unique_ptr<Arena> arena) {
  if (!arena) throw UsageError("set_job_arena: no arena given");
  JobArenas& arenas = job_arenas();
  std::lock_guard lock(arenas.mutex);
  install(arenas, std::move(arena));
}

bool job_arena_exists() noexcept { return job_arenas().current.load(std::memory_order_acquire) != nullptr; }

}  // namespace nodal::detail
