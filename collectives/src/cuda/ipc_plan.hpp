// The CUDA IPC collectives' arithmetic on sizes, internal and host-only (compiled in every build,
// unit-tested without a GPU by tests/unit/ipc_plan_test.cpp): which algorithm a call uses, which
// share of the elements each rank reduces, how a rank's scratch block is laid out and grown, which
// interprocess event a step records, and the flag protocol's values. ipc_backend.cpp does the CUDA
// calls; everything it decides from numbers alone is here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nodal::detail::cuda_ipc {

/// Most ranks one CUDA IPC communicator may have (the kernels take every source pointer by value).
constexpr int kMaxRanks = 128;
/// Shares start on multiples of this many bytes (coalesced, 16-byte vector loads stay aligned).
constexpr std::size_t kShareAlign = 256;
/// Default of NODAL_IPC_ONE_PASS_MAX_BYTES: calls up to this many bytes per rank use one pass.
constexpr std::size_t kDefaultOnePassMax = 256 * 1024;
/// Smallest scratch block, and the granularity it grows by (powers of two from here).
constexpr std::size_t kMinScratch = 2 * 1024 * 1024;

enum class Algorithm : std::uint8_t {
  /// Every rank reads every rank's whole input and writes its whole result (latency-bound sizes:
  /// one kernel, one host round of flags).
  one_pass,
  /// Each rank reduces its share of every rank's input into its scratch, then copies every peer's
  /// reduced share into its output (traffic O(n) instead of O(n^2) per byte).
  reduce_scatter_allgather,
};

/// NODAL_IPC_ONE_PASS_MAX_BYTES (bytes, units as --shm-size), read once; kDefaultOnePassMax when
/// unset. Every rank must see the same value (it comes from the job's environment).
std::size_t one_pass_max_bytes();

/// allreduce and reduce of `bytes` per rank on `n` ranks.
Algorithm choose_algorithm(std::size_t bytes, int n, std::size_t one_pass_max) noexcept;

/// Elements [begin, end) of a count-element buffer.
struct Range {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const noexcept { return end - begin; }
  bool operator==(const Range&) const = default;
};

/// Rank r's share of `count` elements of `elem_size` bytes split among n ranks: contiguous, in rank
/// order, disjoint, covering [0, count); every boundary is a multiple of kShareAlign bytes (except
/// count itself) and sizes differ by at most one kShareAlign unit. Some shares are empty when
/// count is small.
Range share_range(std::size_t count, std::size_t elem_size, int n, int r) noexcept;
/// The largest share's element count (what a rank's reduced area must hold).
std::size_t max_share(std::size_t count, std::size_t elem_size, int n) noexcept;

/// Which collective a call is, for the scratch layout.
enum class Kind : std::uint8_t { allreduce, reduce, broadcast, allgather, reduce_scatter, barrier };

/// A rank's scratch block for one call: [staging | reduced]. Staging holds a copy of this rank's
/// input that peers read when they do not read it in place (small calls, inputs outside the pool,
/// overlaps that would have a peer read memory its owner is writing: see below); it is laid out
/// either way, since peers compute a rank's layout from the call alone. Reduced holds this rank's
/// reduced share for peers to gather.
struct ScratchLayout {
  std::size_t staging_bytes = 0;   ///< at offset 0
  std::size_t reduced_offset = 0;  ///< kShareAlign-aligned
  std::size_t reduced_bytes = 0;
  std::size_t total() const noexcept { return reduced_offset + reduced_bytes; }
};
/// `count` as the Communicator's call takes it: reduce_scatter's input is n * count elements.
ScratchLayout scratch_layout(Kind kind, Algorithm algorithm, std::size_t count, std::size_t elem_size, int n) noexcept;

// ---- Reading inputs in place (no staging copy) ----
// A rank whose input lies in its own GPU pool (gpu::find_pool_block) may publish that block in its
// per-call record instead of staging a copy; peers then read the input where it is. That is safe
// when (a) nothing writes the bytes peers read while they read them, and (b) the rank returns
// only after every peer finished reading (the user may overwrite or free the buffer then). (b):
// in large calls of every kind each rank records its reduced event after its kernels that read
// peers' inputs, and a rank that published its input makes its stream wait for every peer's
// reduced event before it finishes (allreduce and the root of reduce already do, before
// gathering). (a): see input_readable_in_place. Small (one-pass) calls always stage: they are
// latency-bound, and (b) would add a round.

/// Whether a call is large enough for peers to read pool inputs in place, and so ends with every
/// rank's reduced event (the same on every rank: it depends on kind, count, elem_size, n only).
/// allreduce, reduce: the reduce-scatter + all-gather algorithm; reduce_scatter: the same rule on
/// its n * count-element input; broadcast, allgather: more than one_pass_max bytes per rank.
bool large_call(Kind kind, std::size_t count, std::size_t elem_size, int n, std::size_t one_pass_max) noexcept;

/// How a rank's input and output share memory in a call.
enum class Overlap : std::uint8_t {
  none,      ///< disjoint (or one of them empty)
  in_place,  ///< the collective's in-place form: allreduce, reduce: input == output; allgather:
             ///< input == output + rank * count; reduce_scatter: output == input + rank * count
  partial,   ///< any other overlap
};
/// `count` as the Communicator's call takes it (reduce_scatter's input and allgather's output are
/// n * count elements). broadcast and barrier: none (one buffer, or none).
Overlap input_overlap(Kind kind, const void* input, const void* output, std::size_t count, std::size_t elem_size,
                      int n, int rank) noexcept;

/// Whether, in a large call (large_call), this rank's own writes during the call never touch the
/// bytes of its input that peers read, so it may let them read the input in place. Peers read, and
/// the rank writes:
/// - allreduce, reduce (root): peer p reads share p of the input; the rank's kernel writes its own
///   share of the output while peers read, and the other shares only after every peer's reduced
///   event. In place the own share of output and input coincide (no peer reads it); partial overlap
///   could put the own output share on a share a peer reads: stage.
/// - reduce, not root: writes no output.
/// - reduce_scatter: peer p reads block p of the input; the rank writes its output (block `rank` of
///   the input when in place, which no peer reads); partial overlap: stage.
/// - allgather: peers read the whole input; the rank writes the other ranks' blocks of its output
///   (in place its input is its own block, which it skips); partial overlap: stage.
/// - broadcast: only the root's buffer is read, and the root does not write it. Non-roots: no.
/// - barrier: no input.
bool input_readable_in_place(Kind kind, Overlap overlap, bool root) noexcept;

/// The scratch capacity to allocate when `current` bytes cannot hold `needed`: the next power of
/// two >= needed, at least kMinScratch. Returns `current` when it suffices. Every rank computes the
/// same sequence from the same calls, so the ranks grow together (and no rank asks another).
std::size_t grow_scratch(std::size_t current, std::size_t needed) noexcept;

/// The interprocess events each rank records, double-buffered by call parity.
enum class EventKind : int { posted = 0, reduced = 1 };
constexpr int kEventsPerRank = 4;
/// The slot of a rank's event `kind` for call number `call` (calls count from 1).
constexpr int event_slot(EventKind kind, std::uint64_t call) noexcept {
  return static_cast<int>(kind) * 2 + static_cast<int>(call & 1);
}

/// The copy kernel's 16-byte path applies when every address and the length are multiples of 16.
constexpr bool aligned16(const void* a, const void* b, std::size_t bytes) noexcept {
  return ((reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b) | bytes) & 15u) == 0;
}

/// Whether byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept;

}  // namespace nodal::detail::cuda_ipc
