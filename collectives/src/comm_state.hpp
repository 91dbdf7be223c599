// A communicator's state: the part in the arena every member maps (slots, flags, staging ring)
// and this process's handle on it. Internal.
#pragma once

#include <nodal/arena.hpp>
#include <nodal/communicator.hpp>
#include <nodal/detail/p2p_channel.hpp>  // step_flag
#include <nodal/detail/wait.hpp>

#include "shm/staging_stores.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace nodal::detail {

class GpuBackend;
class ProgressThread;
struct BridgeClient;

constexpr std::size_t kCacheLine = 64;

/// Which collective a call is (in the call header, so that ranks can tell a mismatch).
enum class CollKind : std::uint8_t {
  barrier = 1, allreduce, reduce, broadcast, allgather, reduce_scatter, gather, scatter, alltoall, split,
  // The v-variants (per-rank counts; shm/vector_collectives.hpp).
  allgatherv, gatherv, scatterv, alltoallv, reduce_scatterv
};
const char* coll_kind_name(CollKind kind) noexcept;

/// A rank's description of its current call, published in its slot. The data of a small call
/// follows its first 32 bytes, over the buffers' offsets, which small calls do not use: up to
/// 32 bytes of data share the cache line of flag and description (one transfer carries all three).
struct CallHeader {
  std::atomic<std::uint64_t> seq;  ///< the call this header describes; stored last (release)
  CollKind kind;
  DType dtype;
  ReduceOp op;
  std::uint8_t in_arena;   ///< 1: this rank's input is in the arena at input_offset; 0: input_offset
                           ///< is its address in this rank's own memory (for cross-memory attach).
                           ///< v-variants: input_offset is the rank's staged counts and data.
                           ///< Like out_arena, not written (stale) for a small call.
  std::int32_t root;
  std::uint64_t count;
  /// A hash of this rank's calls since the last call every member checked against every other
  /// (shm/call.hpp "History"): equal on every rank unless an earlier rooted call did not match.
  std::uint32_t history;
  std::uint8_t out_arena;  ///< 1: this rank's output is in the arena at output_offset
  std::uint8_t on_gpu;     ///< 1: a call on cuda tensors (only the header is exchanged)
  /// A StagingMode: the stores this rank asks its producers to stage the slices it reads with,
  /// in a copy collective beyond the small path (shm/staging_stores.hpp). Not compared; stale
  /// for a small call.
  std::uint8_t staging;
  // Calls beyond the small path only (a small call's data is here instead).
  std::uint64_t input_offset;
  std::uint64_t output_offset;  ///< like input_offset, by out_arena
};
constexpr std::size_t kInlineOffset = 32;  ///< where a small call's data starts in its slot
static_assert(offsetof(CallHeader, input_offset) == kInlineOffset && sizeof(CallHeader) <= kCacheLine);

/// Slots per rank (CommConfig::slot_depth), a power of two. A rank writes its slot of call k once
/// every peer has finished call k - depth (shm/call.hpp "Credits"), so the senders of small rooted
/// calls run up to depth - 1 calls ahead of their slowest receiver. Where ranks share cores, a
/// receiver catches up only when it is scheduled, so the depth sets how many calls one time slice
/// serves: on 4 ranks sharing 2 cores, small broadcast took 0.78 us a call at depth 16, 0.52 at 32
/// and 0.41 at 64 (bench/results/2026-12-02-slot-depth.md; 16 was 3x faster than 4).
/// The depth is as many slots as fit kCommSlotBudget of slot data for the whole communicator (up
/// to kMaxSlotDepth: 64 up to 16 ranks, 32 up to 32, with the default small path), and never less
/// than as many as fit kSlotBudget per rank (2 to kRankBudgetMaxDepth: 16 from 33 ranks), so large
/// communicators keep their depth and memory. The cost is arena room, taken when the communicator
/// opens and kept for the job (no communicator's part of the arena is freed): 2-4 ranks 2.0, 3.0
/// and 4.0 MiB, or 8.0, 12.0 and 16.0 MiB where they outnumber cores (their slots then hold 64 KiB,
/// kSmallSlotMaxBytes); 5 ranks 5.0 MiB, 16 ranks 16 MiB (its pipelined ring 64 MiB). A job that
/// opens hundreds of communicators needs a larger --shm-size.
constexpr std::size_t kSmallMaxBytes = 16 * 1024;
constexpr std::size_t kSmallSlotMaxBytes = 64 * 1024;
/// Whether a communicator of `world_size` members, `crowded` when its node's ranks outnumber the
/// cores, has slots of kSmallSlotMaxBytes and ops that take the small path past kSmallMaxBytes: 2-4
/// crowded members. The one rule behind both (CommConfig::slot_data_bytes and
/// shm/algorithm_table.hpp small_max_bytes), so that no small call outgrows its slot.
constexpr bool has_wide_slots(std::size_t world_size, bool crowded) noexcept {
  return crowded && world_size >= 2 && world_size <= 4;
}
constexpr std::size_t kCommSlotBudget = 16 * 1024 * 1024;
constexpr std::size_t kSlotBudget = 512 * 1024;
constexpr std::uint64_t kRankBudgetMaxDepth = 16;
constexpr std::uint64_t kMaxSlotDepth = 64;

/// A rank's progress through the steps of a pipelined call, each counter on its own cache line.
/// Values are step_flag(seq, step): they only grow over the communicator's life.
struct alignas(kCacheLine) Progress {
  /// My staged data of the step is ready (cma gather: my block is in the root's output).
  alignas(kCacheLine) std::atomic<std::uint64_t> posted{0};
  alignas(kCacheLine) std::atomic<std::uint64_t> reduced{0};   ///< my reduced block of the step is ready
  alignas(kCacheLine) std::atomic<std::uint64_t> consumed{0};  ///< I have read all I need of the step
  /// A call this rank has finished, published at the end of small rooted calls, of mismatched
  /// ones and of every call beyond the small path (a rank's header of call k says as much for
  /// k - 1: shm/call.cpp peer_done): it reads and writes nothing of that call or earlier ones any
  /// more. kLeftComm once it left a call part-way (Call::leave_part_way): nothing of any call.
  alignas(kCacheLine) std::atomic<std::uint64_t> done{0};
  /// Written once when the rank opens the communicator, before its first header. The line also
  /// keeps the next rank's flags out of the 128-byte pair the adjacent-line prefetcher fetches.
  alignas(kCacheLine) std::int32_t pid = 0;
  std::uint8_t cma = 0;  ///< 1: peers may read and write this rank's memory (process_vm_readv/writev)
};

/// Progress::done of a member that left a call part-way: it touches nothing of the communicator's
/// calls any more (every later call of its throws PeerFailure at once).
constexpr std::uint64_t kLeftComm = ~std::uint64_t{0};

/// Sizes every member must agree on (they come from the same environment).
struct CommConfig {
  /// NODAL_SMALL_MAX_BYTES where set (small_max_set): every op's small limit and the slots' data
  /// bytes; else kSmallMaxBytes, the limit of every op beyond the per-op exceptions
  /// (shm/algorithm_table.hpp small_max_bytes).
  std::size_t small_max;
  bool small_max_set;
  std::size_t chunk_bytes;  ///< bytes per pipeline step (all blocks together)
  int ring_depth;           ///< steps in flight
  /// Bytes per rank from which copies of private buffers read the peers' memory with one
  /// process_vm_readv (shm/algorithm_table.hpp "cma") instead of staging them.
  std::size_t cma_min_bytes;
  StagingSetting staging;  ///< NODAL_STAGING_STORES (shm/staging_stores.hpp)
  /// Bytes of small-call data a slot of a communicator of `world_size` members holds: small_max
  /// where set, else kSmallSlotMaxBytes on 2-4 ranks that outnumber the cores (`crowded`: where
  /// some ops take the small path further, shm/algorithm_table.hpp small_max_bytes), else
  /// kSmallMaxBytes.
  std::size_t slot_data_bytes(std::size_t world_size, bool crowded) const;
  /// A slot: its header and slot_data_bytes, in whole cache lines.
  std::size_t slot_bytes(std::size_t world_size, bool crowded) const;
  /// Slots per rank of a communicator of `world_size` members (kCommSlotBudget).
  std::uint64_t slot_depth(std::size_t world_size, bool crowded) const;
};

/// The arena part, found by name.
struct SharedComm {
  std::uint64_t magic;
  std::int32_t world_size;
  std::uint64_t slot_bytes;
  std::uint64_t cma_min_bytes;
  std::uint64_t members_hash;  ///< of the members' global ranks in rank order (members_hash())
  /// Whether this node runs more ranks than a rank may use CPUs (detail::oversubscribed()), as
  /// the member that made the communicator saw it: every member picks algorithms by this one
  /// value. On 2-4 members it also sizes the slots (CommConfig::slot_data_bytes), so there a
  /// member that sees otherwise (NODAL_CROWDED set differently) gets UsageError at open.
  std::uint8_t crowded;
  WaitWord word;  ///< every flag of the communicator notifies this one word
  /// Set once, by the first member that left a call part-way (mark_comm_broken): an error other
  /// than a mismatch after its header was published, or a peer found gone. Its peers may be
  /// waiting for flags it will never publish: every wait of the communicator and every later call
  /// throws PeerFailure with `broken_reason` instead (check_comm_intact). On a line of its own
  /// with the claim and the reason: read by every waiter, each written at most once.
  alignas(kCacheLine) std::atomic<std::uint32_t> broken{0};  ///< 1 once `broken_reason` is written
  std::atomic<std::uint32_t> broken_claim{0};                ///< taken by the one member that writes it
  char broken_reason[248];
};

/// The pipelined path's buffers (allocated by the first call that needs them).
struct SharedRing {
  std::uint64_t magic;
};

/// This process's handle.
struct CommState : std::enable_shared_from_this<CommState> {
  Arena* arena = nullptr;
  std::string name;  ///< unique in the job; children's names derive from it
  int rank = 0;
  int size = 1;
  std::vector<int> global_ranks;
  CommConfig config{};
  SharedComm* shared = nullptr;
  std::byte* slots = nullptr;       ///< [rank][call % slot_depth] slots of slot_bytes
  std::uint64_t slot_depth = 2;     ///< config.slot_depth(), kept: the hot path divides by nothing
  std::size_t slot_bytes = 0;       ///< config.slot_bytes()
  Progress* progress = nullptr;     ///< [rank]
  std::byte* stages = nullptr;      ///< [rank][ring_depth] * chunk_bytes (pipelined path)
  std::byte* results = nullptr;     ///< [rank][ring_depth] * chunk_bytes
  std::uint64_t seq = 0;            ///< collective calls made so far
  std::uint64_t known_done = 0;     ///< every peer's Progress::done is at least this (credits)
  std::uint32_t history = 0;        ///< CallHeader::history of the next call
  std::uint64_t history_since = 1;  ///< the first call `history` covers
  int splits = 0;                   ///< split() calls made so far
  /// create_group() calls made so far, per hash of (set of members, tag).
  std::map<std::uint64_t, int> groups;
  /// What this rank, reading a staged copy, asks its producers to stage with
  /// (shm/staging_stores.hpp); open_comm makes it from config.staging.
  StagingStores staging_stores{StagingSetting::automatic};
  std::atomic<const char*> last_algorithm{""};  ///< a static string; set by whichever thread runs calls
  /// send/recv's state, made by the first of them. A thread sending and one receiving may use the
  /// communicator at once (Communicator::send): the vectors are made and the channels looked up
  /// under p2p_mutex; an element of p2p_sent (p2p_received) is then used by the sending
  /// (receiving) thread of that peer only.
  std::mutex p2p_mutex;
  std::vector<std::uint64_t> p2p_sent, p2p_received;  ///< per peer
  std::vector<void*> p2p_channels;                   ///< per ordered pair (from, to), lazily
  /// The GPU path (gpu_backend.hpp), made by the first call on cuda tensors, for `gpu_device`.
  std::shared_ptr<GpuBackend> gpu;
  int gpu_device = -1;
  /// The progress thread of the non-blocking calls (progress.hpp), made by the first of them; from
  /// then on every collective of this communicator runs there, in call order.
  std::shared_ptr<ProgressThread> worker;
  /// The v-variants' staging, per call parity (shm/vector_collectives.cpp): this rank's counts
  /// and data, read by its peers; grown on demand, kept for the life of the communicator.
  std::byte* vector_scratch[2] = {nullptr, nullptr};
  /// A private buffer of a step: the peers' chunks read by the cma paths (shm/cma.cpp), a reduced
  /// step on its way to every output (shm/push_allreduce.cpp).
  std::vector<std::byte> scratch;
  std::size_t vector_capacity[2] = {0, 0};
  /// Set on the world communicator of a job that spans nodes (internode/across_nodes.hpp): its
  /// calls go through the node bridge; of the shared-memory fields above only `shared` is mapped
  /// (its wake word, for send/recv between ranks of one node).
  std::shared_ptr<BridgeClient> across_nodes;

  CallHeader& header(int r, std::uint64_t call) const {
    return *reinterpret_cast<CallHeader*>(slots + (static_cast<std::size_t>(r) * slot_depth + (call & (slot_depth - 1))) *
                                                      slot_bytes);
  }
  std::byte* inline_data(int r, std::uint64_t call) const {
    return reinterpret_cast<std::byte*>(&header(r, call)) + kInlineOffset;
  }
  std::byte* stage(int r, std::uint64_t step) const {
    return stages + (static_cast<std::size_t>(r) * config.ring_depth + step % config.ring_depth) * config.chunk_bytes;
  }
  std::byte* result(int r, std::uint64_t step) const {
    return results + (static_cast<std::size_t>(r) * config.ring_depth + step % config.ring_depth) * config.chunk_bytes;
  }
  /// Maps (or creates) the pipelined buffers; every member calls it at the same call.
  void ensure_ring();
};

/// Whether peers can read and write this process's memory with process_vm_readv/writev
/// (cross-memory attach, the single-copy path of Open MPI's vader and MPICH for private buffers):
/// Yama's ptrace_scope 0, or 1 with this process naming any process of its user as a ptracer
/// (done here), a dumpable process, and NODAL_CMA not 0. Asked at every open_comm.
bool cma_allowed();

/// The configuration from the environment (NODAL_SMALL_MAX_BYTES, NODAL_CHUNK_BYTES,
/// NODAL_CMA_MIN_BYTES), read once.
const CommConfig& comm_config();

/// FNV-1a over `ranks` in order, then `salt`: equal on every member that lists the same ranks the
/// same way.
std::uint64_t members_hash(const std::vector<int>& ranks, std::string_view salt = {}) noexcept;

/// Maps (creating it if this rank is first) the communicator `name` of `global_ranks`, in which
/// this process is `rank`. Throws ShmError when the arena has no room.
std::shared_ptr<CommState> open_comm(Arena& arena, std::string name, int rank, std::vector<int> global_ranks);

/// Publishes `value` in `flag` and wakes the sleepers of `word`.
inline void publish(WaitWord& word, std::atomic<std::uint64_t>& flag, std::uint64_t value) {
  flag.store(value, std::memory_order_release);
  notify(word);
}
/// Publishes `value` in `flag` and wakes sleepers of the communicator.
inline void publish(const CommState& comm, std::atomic<std::uint64_t>& flag, std::uint64_t value) {
  publish(comm.shared->word, flag, value);
}

/// For a member that leaves call `seq` (a `kind`) part-way with `error` once its header is out
/// (Call::run: anything but a UsageError, which a mismatch makes every member throw; run_on_gpu:
/// anything after the agreement, its own UsageErrors included): marks the communicator
/// broken (SharedComm::broken), unless a member already did or the job has failed (which ends
/// every member already), and wakes its waiters. Without it, peers that wait for this member's
/// flags would wait until the job ends, or for ever if the member catches the error and goes on
/// (or exits 0). Source of the idea: ULFM's MPI_Comm_revoke (a revoked communicator fails every
/// pending and later operation on every member), here done without being asked.
void mark_comm_broken(const CommState& comm, CollKind kind, std::uint64_t seq, const std::exception& error);

/// Throws PeerFailure with the reason once the communicator is broken. Cheap: one load of a line
/// no member writes until then.
[[noreturn]] void throw_comm_broken(const CommState& comm);
inline void check_comm_intact(const CommState& comm) {
  if (comm.shared->broken.load(std::memory_order_acquire) != 0) [[unlikely]] throw_comm_broken(comm);
}

/// Waits on the communicator's word (the runtime's waiting helper: spin, yield when
/// oversubscribed, futex) until ready() holds; throws PeerFailure when the job fails or the
/// communicator is broken (looked at only while not ready: no cost to a wait that ends at once).
template <class Ready>
void wait_on_comm(const CommState& comm, Ready&& ready, const char* what) {
  wait_until(
      comm.shared->word,
      [&] {
        if (ready()) return true;
        check_comm_intact(comm);
        return false;
      },
      Deadline{}, what);
}

/// wait_on_comm until `flag` >= value.
void wait_flag(const CommState& comm, const std::atomic<std::uint64_t>& flag, std::uint64_t value, const char* what);

}  // namespace nodal::detail
