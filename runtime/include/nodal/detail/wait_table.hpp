// The job's wait table: for every rank, what its threads are blocked in right now (the call, the
// peers it waits for, since when) and how many blocking calls it has finished. Ranks write their
// own row (wait_record.hpp); nodalrun reads every row to see a stall and to print the status
// table (launcher/src/stall_watch.hpp). Lives in the job arena, found through ArenaControl.
// The idea is torch's NCCL flight recorder (torch/csrc/distributed/c10d/FlightRecorder), reduced
// to the one entry that matters for a hang: the call a thread is blocked in now. Internal.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace nodal {
class Arena;
}

namespace nodal::detail {

/// Threads of one rank that can be shown waiting at the same time (the main thread, a
/// non-blocking collectives' progress thread, a loader thread, ...); more are not shown.
inline constexpr int kWaitEntries = 4;

/// One thread's blocking call. Written only by that thread, read by nodalrun as a seqlock:
/// `version` is odd while the thread writes, so a reader retries instead of seeing half a text.
struct alignas(64) WaitEntry {
  enum State : std::uint32_t {
    free = 0,     ///< no thread holds the entry
    in_call = 1,  ///< inside a blocking call that waited, now working (copying, reducing)
    waiting = 2,  ///< blocked: the call cannot go on until `waiting_for` happens
  };
  std::atomic<std::uint32_t> version;
  std::atomic<std::uint32_t> state;
  std::atomic<std::int32_t> tid;  ///< the holder (gettid), 0 when free
  /// The last stack request (ArenaControl::stack_request) this thread answered.
  std::atomic<std::uint32_t> stack_answered;
  std::int64_t since_ns;   ///< CLOCK_REALTIME when the call first waited
  char what[176];          ///< the call: "allreduce #12 on communicator 'world' (256 f32, sum)"
  char waiting_for[112];   ///< "ranks 1, 3 to make this call", "a put (queue empty)"
};

/// One rank's row. `calls` is the rank's heartbeat: every blocking nodal call bumps it when it
/// returns (one store to a line only this rank writes), so nodalrun sees progress without the
/// ranks doing anything else.
struct alignas(64) RankWaits {
  std::atomic<std::uint64_t> calls;
  alignas(64) WaitEntry entries[kWaitEntries];
};

/// The bytes the table of `world_size` ranks takes: what nodalrun asks Arena::create for as its
/// front region, so that the table is reserved with the arena and never allocated.
std::size_t wait_table_bytes(int world_size) noexcept;

/// Makes the table for `world_size` ranks in `arena`'s front region (nodalrun, before it starts
/// the ranks) and records it in the arena's control block. Throws UsageError when the front
/// region is smaller than wait_table_bytes(world_size).
void create_wait_table(Arena& arena, int world_size);

/// The table of `arena`, or nullptr when its creator made none (a singleton's own arena).
RankWaits* wait_table(const Arena& arena, int* world_size) noexcept;

/// A consistent copy of one entry (retried while its thread writes it).
struct WaitSnapshot {
  WaitEntry::State state = WaitEntry::free;
  int tid = 0;
  std::int64_t since_ns = 0;
  std::string what;
  std::string waiting_for;
};
struct RankSnapshot {
  std::uint64_t calls = 0;
  std::vector<WaitSnapshot> waits;  ///< the entries not free, in_call or waiting
};
RankSnapshot read_rank_waits(const RankWaits& row);

}  // namespace nodal::detail
