// The GPU pool's bookkeeping, host-only (no CUDA): which byte ranges of a rank's pool chunks are
// in use, and who still holds each block. Compiled in every build, so it is unit-tested on
// machines without a GPU (tests/unit/gpu_block_table_test.cpp). Internal.
//
// The model (the producer-keeps-alive rule of torch.multiprocessing's CUDA sharing, with the
// counts in the job arena instead of a file per block):
// - Only the owner rank carves blocks out of its chunks (BlockTable, one per rank and device, in
//   that process's memory). Every block has a BlockRecord in the job arena, so every process of
//   the job sees its counts.
// - refs[r] counts the live Storage objects of rank r over the block; `in_flight` counts the
//   references held by queue cells (a put that nobody has got yet).
// - The owner's allocator reuses a block only after the owner dropped it and the in-flight count
//   and the counts of every live rank are 0. A dead rank's counts are ignored, so a consumer that
//   dies holding a tensor does not pin its producer's memory for the rest of the job.
// - Liveness: every rank records its pid in the arena's rank table (this file) before it takes
//   its first reference; a rank is dead once kill(pid, 0) fails with ESRCH. Caveats: a dead but
//   not yet reaped process (a zombie) still counts as alive, which only delays reuse (nodalrun
//   reaps its ranks at once through their pidfds); pid reuse within one job could make a dead
//   rank look alive, which again only delays reuse. Neither can free memory that is in use.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include <sys/types.h>

namespace nodal {
class Arena;
}

namespace nodal::detail::gpu {

/// Every block starts at a multiple of this (what cudaMalloc guarantees, and enough for any
/// vectorised kernel access).
inline constexpr std::uint64_t kBlockAlignment = 256;
/// nodalrun starts at most this many ranks (its -n limit).
inline constexpr int kMaxRanks = 1024;

/// The reference counts of one shared GPU block (a pool block or an IPC-exported allocation),
/// in the job arena; followed by `world_size` per-rank counts. Created by the owner, destroyed
/// by the owner once nobody holds it.
struct alignas(64) BlockRecord {
  static constexpr std::uint64_t kMagic = 0x6b636f6c42555047ULL;  // "GPUBlock"
  std::uint64_t magic = kMagic;
  std::int32_t owner = -1;       ///< the rank that made the block (and reuses or frees it)
  std::int32_t world_size = 0;   ///< entries in the per-rank counts
  std::int32_t owner_pid = 0;    ///< the owner's process (IPC: whether an importer is the owner)
  std::int32_t device = 0;
  std::uint32_t chunk = 0;       ///< pool: the owner's chunk number
  std::uint32_t reserved = 0;
  std::uint64_t chunk_bytes = 0; ///< pool: the chunk's size (what an importer maps); IPC: the
                                 ///< allocation's size, which an importer checks (ipc.cpp)
  std::uint64_t offset = 0;      ///< pool: from the chunk's start; IPC: from the allocation's base
  std::uint64_t bytes = 0;
  std::uint64_t owner_address = 0;  ///< IPC: the allocation's base in the owner's address space
  std::atomic<std::int32_t> in_flight{0};  ///< references held by queue cells

  std::atomic<std::int32_t>* refs() noexcept { return reinterpret_cast<std::atomic<std::int32_t>*>(this + 1); }
  const std::atomic<std::int32_t>* refs() const noexcept {
    return reinterpret_cast<const std::atomic<std::int32_t>*>(this + 1);
  }
  /// Rank `rank`'s count. Throws UsageError for a rank outside the record's world.
  std::atomic<std::int32_t>& ref(int rank);
};

/// A new record in `arena` (all counts 0) for a block owned by `owner` in a job of `world_size`
/// ranks. Throws ShmError when the arena is full, UsageError for a bad rank or world size.
BlockRecord* create_record(Arena& arena, int owner, int world_size);
/// The record at arena offset `offset`. Throws ShmError when no record is there.
BlockRecord& record_at(Arena& arena, std::uint64_t offset);
void destroy_record(Arena& arena, BlockRecord* record) noexcept;

/// Records this process as rank `rank` in the arena's rank table (before it takes a reference).
/// Throws UsageError for a rank outside [0, kMaxRanks), ShmError when the arena is full.
void register_rank(Arena& arena, int rank, pid_t pid);
/// Whether rank `rank` has registered and its process still exists (see the caveats above).
bool rank_alive(Arena& arena, int rank);
/// No queue cell and no live rank holds the block.
bool record_unused(Arena& arena, const BlockRecord& record);

/// First-fit allocation of aligned byte ranges in a growing list of chunks. Not thread-safe (the
/// caller locks). Freed ranges are coalesced with their neighbours; chunks are never given back
/// (the pool keeps its memory for the life of the process, like a caching allocator).
class RangeAllocator {
 public:
  struct Range {
    std::uint32_t chunk = 0;
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
  };
  /// Makes chunk number `chunk` of at least `min_bytes` and returns its size; throws when it
  /// cannot (out of GPU memory): the allocation fails with that exception.
  using Grow = std::function<std::uint64_t(std::uint32_t chunk, std::uint64_t min_bytes)>;

  /// New chunks are `chunk_bytes` rounded up to `granularity` (a power of two), or the
  /// allocation rounded up to `granularity` when that is larger. Throws UsageError for a zero
  /// or non-power-of-two granularity.
  RangeAllocator(std::uint64_t chunk_bytes, std::uint64_t granularity, Grow grow);

  /// `bytes` (at least 1, rounded up to kBlockAlignment) at a kBlockAlignment-aligned offset.
  Range allocate(std::uint64_t bytes);
  /// Gives back a range from allocate() (the same chunk, offset and rounded size).
  void free(const Range& range);

  std::size_t chunk_count() const noexcept { return chunks_.size(); }
  std::uint64_t chunk_bytes(std::uint32_t chunk) const { return chunks_.at(chunk); }
  std::uint64_t free_bytes() const noexcept;
  std::uint64_t granularity() const noexcept { return granularity_; }

 private:
  std::uint64_t chunk_bytes_;
  std::uint64_t granularity_;
  Grow grow_;
  std::vector<std::uint64_t> chunks_;                            ///< size of each chunk
  std::vector<std::map<std::uint64_t, std::uint64_t>> free_;     ///< per chunk: offset -> bytes
};

/// One rank's pool on one device, host side: ranges plus the records that say when a range the
/// owner dropped may be reused. Not thread-safe (the caller locks).
class BlockTable {
 public:
  struct Block {
    RangeAllocator::Range range;
    BlockRecord* record = nullptr;
  };

  /// `rank` of `world_size` owns the table; records go to `arena`.
  BlockTable(Arena& arena, int rank, int world_size, int device, std::uint64_t chunk_bytes,
             std::uint64_t granularity, RangeAllocator::Grow grow);
  ~BlockTable();
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  /// A block of `bytes`, its record holding one reference of the owner (refs[rank] = 1). First
  /// reclaims retired blocks nobody holds any more. Throws what the grow callback throws,
  /// ShmError (no room for the record).
  Block allocate(std::uint64_t bytes);
  /// The owner's last Storage over the block is gone: drops the owner's reference and queues
  /// the block for reuse once nobody else holds it (reclaimed at once if nobody does).
  void retire(const Block& block);
  /// Frees every retired block nobody holds any more; returns how many.
  std::size_t reclaim();

  std::size_t retired_count() const noexcept { return retired_.size(); }
  const RangeAllocator& ranges() const noexcept { return ranges_; }

 private:
  Arena& arena_;
  int rank_;
  int world_size_;
  int device_;
  RangeAllocator ranges_;
  std::vector<Block> retired_;
};

}  // namespace nodal::detail::gpu
