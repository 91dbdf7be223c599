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
/// input that peers read (so an in-place call never has a peer read memory its owner is writing);
/// reduced holds this rank's reduced share for peers to gather.
struct ScratchLayout {
  std::size_t staging_bytes = 0;   ///< at offset 0
  std::size_t reduced_offset = 0;  ///< kShareAlign-aligned
  std::size_t reduced_bytes = 0;
  std::size_t total() const noexcept { return reduced_offset + reduced_bytes; }
};
/// `count` as the Communicator's call takes it: reduce_scatter's input is n * count elements.
ScratchLayout scratch_layout(Kind kind, Algorithm algorithm, std::size_t count, std::size_t elem_size, int n) noexcept;

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
