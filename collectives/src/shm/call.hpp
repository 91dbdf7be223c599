// One collective call on one rank: the protocol every shared-memory call follows (shm/call.cpp)
// and the algorithms that move the data (shm/small.cpp, shm/pipelined_reduction.cpp,
// shm/push_allreduce.cpp, shm/pipelined_copy.cpp, shm/cma.cpp, shm/linear_reduce.cpp,
// shm/vector_collectives.cpp), picked by shm/algorithm_table.hpp. Internal.
//
// The header. Every call starts the same way: each rank publishes a CallHeader (what it calls,
// with what count, dtype, op and root, and where its buffers are when they are in the arena) in
// its slot for the call, a small call's data right behind it. A rank publishes the header of call
// k only after it finished call k - 1.
//
// Lockstep calls (every call but the rooted small ones): each rank waits for every member's
// header of the call and compares them; once a rank has seen every header of call k, nobody
// reads or writes anything of call k - 1 any more (staging ring, results, peers' buffers), so the
// pipelined paths reuse their shared buffers freely (the linear reduce relies on nothing else:
// its peers return before the root has read their rings, so no path may write a ring before it
// has seen every header of its call; cma gather's peers too return before the root, once their
// block is written into its output). Within a pipelined call, ring entries are reused only after
// every reader has published `consumed` for the step that used them.
//
// Rooted small calls (broadcast, scatter, gather, reduce whose data fits a slot): one-directional,
// like Open MPI's eager sends. The root of broadcast and scatter, and every non-root of gather and
// reduce, publishes header and data and returns; the receivers (the others; the root of gather
// and reduce) wait only for the headers they read, compare them with their own call, and copy
// or reduce out of the slots.
//
// Credits. Each rank has CommConfig::slot_depth() slots (depth: 64 up to 16 ranks, 32 up to 32, 16
// beyond, with the default small size; comm_state.hpp kCommSlotBudget), used round robin; a rank
// writes its slot of call k once every peer has finished call k - depth (its Progress::done,
// published at the end of a small rooted call, or its latest header, published at the start of
// the next call): a sender waits only when it is depth - 1 calls ahead of its slowest peer.
// The v-variants' staging areas, one per call parity, need every peer done with call k - 2.
// A lockstep exchange of call k tells a rank that every peer finished k - 1 (CommState::known_done)
// without reading their counters.
//
// Mismatches. A rank that sees a header differing from its own throws UsageError at once (its own
// header is already published, so the peers waiting on it see the difference too): in a lockstep
// call, every member throws at that call. A sender of a rooted small call checks nothing; so each
// header also carries `history`, a hash of the calls the rank made since the last lockstep call
// whose headers all agreed. A rooted call whose arguments did not match thus makes its sender
// throw at its next call with a receiver or a lockstep call at the latest, and every rank that
// took part then throws too. Source of the idea: MPI leaves a mismatched call undefined (Open MPI
// detects none of it); nodal keeps the error, deferred by at most one call.
#pragma once

#include "shm/algorithm_table.hpp"
#include "shm/algorithms.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nodal::detail {

/// A staged call whose message (per consumer for scatter and alltoall, per block for
/// reduce_scatter, the whole message otherwise) fits one ring entry takes two pipeline steps from
/// this many bytes (Call::pipeline_step).
constexpr std::size_t kTwoStepMinBytes = 256 * 1024;

/// Room for the per-peer source pointers of a reduction without a heap allocation per call.
class Sources {
 public:
  explicit Sources(int n)
      : heap_(n > kInline ? static_cast<std::size_t>(n) : 0), at_(heap_.empty() ? inline_ : heap_.data()) {}
  Sources(const Sources&) = delete;
  Sources& operator=(const Sources&) = delete;
  const void*& operator[](int j) { return at_[j]; }
  const void* const* data() const { return at_; }

 private:
  static constexpr int kInline = 64;
  const void* inline_[kInline];
  std::vector<const void*> heap_;
  const void** at_;  ///< inline_ or heap_'s
};


/// The most lines of a peer's next slot a receiver of a small rooted call prefetches beyond the
/// header's (Call::prefetch_next_slots).
constexpr std::size_t kPrefetchSlotLines = 8;

class Call {
 public:
  Call(CommState& comm, const CollCall& call)
      : c_(comm), call_(call), n_(comm.size), r_(comm.rank), esize_(element_size(call.dtype)) {}

  /// Runs the call (shm/call.cpp).
  void run();

 private:
  /// The wait table's lines for this call (wait_record.hpp's DescribeCall).
  static void describe_wait(const void* self, std::string& what, std::string& waiting_for);

  // ---- The protocol (shm/call.cpp). ----
  void await_credit(std::uint64_t depth);
  /// Publishes Progress::done = this call.
  void publish_done();
  /// Whether rank j has finished call `need`.
  bool peer_done(int j, std::uint64_t need) const;
  /// Publishes this rank's header (and a small call's data); `wake`: wakes sleeping peers.
  void publish_header(bool small, bool wake);
  /// Waits for the headers of rank `only` (all peers when -1); returns the first rank whose header
  /// differs from this rank's, or -1 once all have come and agree.
  int await_headers(int only);
  bool matches(const CallHeader& theirs) const;
  [[noreturn]] void throw_mismatch(int j);
  void run_lockstep(bool small);
  /// Leaving a call part-way (an exception other than UsageError, the job still alive):
  /// publishes Progress::done = kLeftComm; then, beyond the small path, waits until no peer can
  /// still read or write this rank's buffers for the call: each has finished it or left it too,
  /// or has exited, or has not published its header (it then finds the communicator broken once it
  /// has every header, before it touches a buffer: the fences of both sides' publish make one of
  /// them see the other). Only a failed job ends the wait sooner. Without it a rank could return a
  /// buffer that a peer still writes (cma gather, push allreduce) or reads (cma broadcast: that
  /// peer would return wrong data as a success).
  void leave_part_way(bool small);
  void run_rooted_small();
  /// A receiver of a rooted small call: starts fetching the first line of the slots it reads at
  /// its next call, which its senders (running ahead on credit) have usually written by then, so
  /// that the line crosses between cores while this rank returns and makes that call. On 2 ranks,
  /// reduce and gather at 4-64 B 1.04-1.17x (bench/results/2026-11-28-small-call-path.md); the
  /// same for this rank's own next slot (write intent) made allreduce and scatter 0.6-0.9x. Also
  /// the lines of data this call read there beyond the first (up to kPrefetchSlotLines): on 2
  /// ranks of an Intel Xeon gather and reduce at 64 B-1 KiB 1.25-1.64x (broadcast 0.95-1.2x)
  /// (bench/results/2026-12-02-small-rooted-prefetch.md). The slot of call seq + 2 as well: no gain.
  /// `toward_root`: gather or reduce (every peer sends), else only the root sends.
  void prefetch_next_slots(bool toward_root) const;
  /// In a copy collective (broadcast, allgather, gather, scatter, alltoall): whether rank j
  /// receives data from its peers (broadcast and scatter: all but the root; gather: the root; the
  /// others: all).
  bool reads_from_peers(int j) const {
    switch (call_.kind) {
      case CollKind::broadcast:
      case CollKind::scatter: return j != call_.root;
      case CollKind::gather: return j == call_.root;
      case CollKind::allgather:
      case CollKind::alltoall: return true;
      default: return false;
    }
  }
  bool all_in_arena() const;
  /// Whether every rank's input is its output (read from the headers: the same on every rank).
  bool all_in_place() const;
  bool reads_peer_input(int j) const;
  bool cma_usable() const;
  const void* peer_input(int j) const { return c_.arena->at(c_.header(j, seq_).input_offset); }
  void* peer_output(int j) const { return c_.arena->at(c_.header(j, seq_).output_offset); }
  Progress& progress(int j) const { return c_.progress[j]; }
  std::uint64_t flag(std::uint64_t step) const { return step_flag(seq_, step); }
  void wait_consumed(int j, std::uint64_t step) { wait_flag(c_, progress(j).consumed, flag(step), "collective"); }
  /// Block b of elements [first, first + count) cut into n_ blocks of whole cache lines: where it
  /// starts (an element of the message) and its length (0 past the end).
  std::pair<std::size_t, std::size_t> line_block(int b, std::size_t first, std::size_t count) const {
    const std::size_t line = kCacheLine / esize_;
    const std::size_t per = ceil_div(ceil_div(count, static_cast<std::size_t>(n_)), line) * line;
    const std::size_t begin = std::min(count, static_cast<std::size_t>(b) * per);
    return {first + begin, std::min(count, begin + per) - begin};
  }
  /// The end of a call whose peers read or write this rank's own buffers: publishes `consumed`
  /// (call step 0) and waits for every peer's, so no one touches them after the call returns.
  void finish_with_peers() {
    publish(c_, progress(r_).consumed, flag(0));
    for (int j = 0; j < n_; ++j) {
      if (j != r_) wait_consumed(j, 0);
    }
  }

  // ---- The algorithms. ----
  void run_small();                                // shm/small.cpp
  void run_pipelined_reduction(bool in_place);     // shm/pipelined_reduction.cpp
  void run_push_allreduce();                       // shm/push_allreduce.cpp
  void run_pipelined_copy(Algorithm algorithm);    // shm/pipelined_copy.cpp
  void run_cma_reduce();                           // shm/cma.cpp
  void run_linear_reduce();                        // shm/linear_reduce.cpp
  void run_cma_allreduce();                        // shm/cma.cpp
  /// gather: every peer writes its block into the root's output (process_vm_writev) and returns;
  /// the root copies its own meanwhile and waits for their `posted`.
  void run_cma_gather();                           // shm/cma.cpp
  /// broadcast: receivers read the message from the root's buffer but for its last block, which
  /// the root writes into their outputs meanwhile (process_vm_writev).
  void run_cma_broadcast();                        // shm/cma.cpp
  /// allreduce in place on large messages: my block reduced and written into every output.
  void run_cma_push_allreduce();                   // shm/cma.cpp
  /// Reduces elements [begin, begin + count) of every rank's input into this rank's output, rank
  /// order, reading the peers' parts by process_vm_readv a step at a time (shm/cma.cpp).
  void reduce_from_inputs(std::size_t begin, std::size_t count);
  /// Reads `n` bytes at `address` in rank j's memory into `dst` (process_vm_readv). Throws
  /// PeerFailure when j is gone, Error for any other failure (say which and how to avoid it).
  void cma_read(int j, void* dst, std::uintptr_t address, std::size_t n) const;  // shm/cma.cpp
  /// Writes `n` bytes from `src` to `address` in rank j's memory (process_vm_writev); throws as cma_read.
  void cma_write(int j, std::uintptr_t address, const void* src, std::size_t n) const;
  /// cma_read's and cma_write's one system call, retried until every byte moved.
  void cma_transfer(int j, void* mine, std::uintptr_t address, std::size_t n, bool write) const;
  /// Elements per block per step of a pipelined call: whole cache lines, `blocks` fit one ring entry.
  std::size_t block_elements(std::size_t blocks) const {
    std::size_t lines = c_.config.chunk_bytes / kCacheLine / blocks;
    return (lines > 1 ? lines : 1) * kCacheLine / esize_;
  }
  /// Elements per step of a staged call (not in place) whose ring entry holds up to `most`
  /// elements of the message per step (whole cache lines): the message in equal steps of whole
  /// cache lines and, while every rank has a core of its own, at least two from kTwoStepMinBytes,
  /// so that the consumers copy one step out while the producer stages the next. On 2 ranks, a 1 MiB broadcast in one step (the default 1 MiB chunk) took
  /// 118-133 us, in two 63-70 us; when ranks share cores nothing overlaps (4 ranks on 2 cores:
  /// allreduce 0.93-0.97x in two steps). Figures: bench/results/2026-11-28-two-step-pipeline.md.
  std::size_t pipeline_step(std::size_t most) const {
    std::size_t steps = ceil_div(call_.count, most);
    if (steps == 1 && call_.count * esize_ >= kTwoStepMinBytes && c_.shared->crowded == 0) steps = 2;
    const std::size_t line = kCacheLine / esize_;
    return ceil_div(ceil_div(call_.count, steps), line) * line;
  }

  CommState& c_;
  const CollCall& call_;
  const int n_;
  const int r_;
  const std::size_t esize_;
  std::uint64_t seq_ = 0;
  std::size_t contribution_ = 0;  ///< what this rank puts in its slot on the small path (contribution_bytes)
  std::uint64_t staged_ = 0;  ///< v-variants: the arena offset of this rank's staged counts and data
  std::uint64_t credit_need_ = 0;  ///< while waiting for credit: the call every peer must finish
};

/// What a rank puts in its slot on the small path, in bytes.
std::size_t contribution_bytes(const CollCall& call, int world_size, int rank);

/// Where rank `rank`'s block of a small scatter lies in the root's slot data, for blocks of
/// `block` bytes: at rank x block, or on 2 ranks at 0, since there the root's slot holds the
/// other rank's block alone (its own stays in its input): a block of up to 32 bytes then shares
/// the header's cache line, and 2-rank scatter takes the small path up to the small limit per
/// rank instead of half of it (bench/results/2026-12-08-two-rank-scatter-slot.md).
inline std::size_t scatter_slot_offset(int world_size, int rank, std::size_t block) {
  return world_size == 2 ? 0 : static_cast<std::size_t>(rank) * block;
}

}  // namespace nodal::detail
