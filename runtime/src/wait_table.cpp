#include <nodal/arena.hpp>
#include <nodal/detail/wait_table.hpp>

#include <nodal/errors.hpp>

#include <cstring>
#include <new>

#include <fmt/format.h>

namespace nodal::detail {

std::size_t wait_table_bytes(int world_size) noexcept {
  return sizeof(RankWaits) * static_cast<std::size_t>(world_size);
}

void create_wait_table(Arena& arena, int world_size) {
  if (arena.control().front_bytes < wait_table_bytes(world_size)) {
    throw UsageError(fmt::format("the wait table of {} ranks needs {} bytes at the arena's front, which has {}",
                                 world_size, wait_table_bytes(world_size), arena.control().front_bytes));
  }
  void* block = arena.front();
  auto* rows = static_cast<RankWaits*>(block);
  for (int r = 0; r < world_size; ++r) new (&rows[r]) RankWaits{};
  ArenaControl& control = arena.control();
  control.wait_table_ranks = world_size;
  control.wait_table_offset = arena.offset_of(block);
}

RankWaits* wait_table(const Arena& arena, int* world_size) noexcept {
  const ArenaControl& control = arena.control();
  if (control.wait_table_offset == 0) return nullptr;
  if (world_size) *world_size = control.wait_table_ranks;
  return static_cast<RankWaits*>(arena.at(control.wait_table_offset));
}

RankSnapshot read_rank_waits(const RankWaits& row) {
  RankSnapshot snapshot;
  snapshot.calls = row.calls.load(std::memory_order_acquire);
  for (const WaitEntry& entry : row.entries) {
    // A seqlock read: a copy taken while the version was even and unchanged is whole.
    for (int attempt = 0; attempt < 1000; ++attempt) {
      std::uint32_t before = entry.version.load(std::memory_order_acquire);
      if (before % 2 != 0) continue;
      WaitSnapshot copy;
      copy.state = static_cast<WaitEntry::State>(entry.state.load(std::memory_order_relaxed));
      copy.tid = entry.tid.load(std::memory_order_relaxed);
      copy.since_ns = entry.since_ns;
      copy.what.assign(entry.what, strnlen(entry.what, sizeof entry.what));
      copy.waiting_for.assign(entry.waiting_for, strnlen(entry.waiting_for, sizeof entry.waiting_for));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (entry.version.load(std::memory_order_relaxed) != before) continue;
      if (copy.state != WaitEntry::free) snapshot.waits.push_back(std::move(copy));
      break;
    }
  }
  return snapshot;
}

}  // namespace nodal::detail
