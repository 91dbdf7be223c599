#include "block_table.hpp"

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <new>
#include <utility>

#include <fmt/format.h>

namespace nodal::detail::gpu {
namespace {

/// pid of every rank that took a reference, 0 for ranks that never did.
struct RankTable {
  std::atomic<std::int32_t> pid[kMaxRanks];
};

RankTable& rank_table(Arena& arena) {
  return arena.find_or_construct<RankTable>("gpu:ranks");  // value-initialised: all 0
}

std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

std::size_t record_bytes(int world_size) {
  return sizeof(BlockRecord) + sizeof(std::atomic<std::int32_t>) * static_cast<std::size_t>(world_size);
}

}  // namespace

std::atomic<std::int32_t>& BlockRecord::ref(int rank) {
  if (rank < 0 || rank >= world_size) {
    throw UsageError(fmt::format("GPU block of rank {}: rank {} is outside its world of {}", owner, rank, world_size));
  }
  return refs()[rank];
}

BlockRecord* create_record(Arena& arena, int owner, int world_size) {
  if (world_size < 1 || world_size > kMaxRanks || owner < 0 || owner >= world_size) {
    throw UsageError(fmt::format("GPU block record: rank {} of {} is not a rank of a job", owner, world_size));
  }
  void* where = arena.allocate(record_bytes(world_size), alignof(BlockRecord));
  auto* record = new (where) BlockRecord;
  record->owner = owner;
  record->world_size = world_size;
  for (int r = 0; r < world_size; ++r) new (&record->refs()[r]) std::atomic<std::int32_t>(0);
  return record;
}

BlockRecord& record_at(Arena& arena, std::uint64_t offset) {
  if (offset == 0 || offset + sizeof(BlockRecord) > arena.size() || offset % alignof(BlockRecord) != 0 ||
      static_cast<BlockRecord*>(arena.at(offset))->magic != BlockRecord::kMagic) {
    throw ShmError(fmt::format("no GPU block record at arena offset {}: a queue cell or handle is corrupt", offset));
  }
  return *static_cast<BlockRecord*>(arena.at(offset));
}

void destroy_record(Arena& arena, BlockRecord* record) noexcept {
  if (record == nullptr) return;
  record->magic = 0;
  arena.deallocate(record);
}

void register_rank(Arena& arena, int rank, pid_t pid) {
  if (rank < 0 || rank >= kMaxRanks) throw UsageError(fmt::format("GPU rank table: rank {} out of range", rank));
  rank_table(arena).pid[rank].store(static_cast<std::int32_t>(pid), std::memory_order_release);
}

bool rank_alive(Arena& arena, int rank) {
  if (rank < 0 || rank >= kMaxRanks) return false;
  pid_t pid = rank_table(arena).pid[rank].load(std::memory_order_acquire);
  if (pid <= 0) return false;  // never registered: it never took a reference either
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

bool record_unused(Arena& arena, const BlockRecord& record) {
  if (record.in_flight.load(std::memory_order_acquire) != 0) return false;
  for (int r = 0; r < record.world_size; ++r) {
    if (record.refs()[r].load(std::memory_order_acquire) != 0 && rank_alive(arena, r)) return false;
  }
  return true;
}

// ---- RangeAllocator ----

RangeAllocator::RangeAllocator(std::uint64_t chunk_bytes, std::uint64_t granularity, Grow grow)
    : chunk_bytes_(chunk_bytes), granularity_(granularity), grow_(std::move(grow)) {
  if (granularity == 0 || (granularity & (granularity - 1)) != 0) {
    throw UsageError(fmt::format("GPU pool: allocation granularity {} is not a power of two", granularity));
  }
  chunk_bytes_ = round_up(std::max<std::uint64_t>(chunk_bytes, 1), granularity_);
}

RangeAllocator::Range RangeAllocator::allocate(std::uint64_t bytes) {
  const std::uint64_t size = round_up(std::max<std::uint64_t>(bytes, 1), kBlockAlignment);
  if (size < bytes) throw UsageError(fmt::format("GPU pool: {} bytes cannot be allocated", bytes));
  for (std::uint32_t c = 0; c < free_.size(); ++c) {
    auto& ranges = free_[c];
    for (auto it = ranges.begin(); it != ranges.end(); ++it) {
      if (it->second < size) continue;
      Range range{c, it->first, size};
      std::uint64_t rest = it->second - size;
      std::uint64_t rest_at = it->first + size;
      ranges.erase(it);
      if (rest != 0) ranges.emplace(rest_at, rest);
      return range;
    }
  }
  const auto chunk = static_cast<std::uint32_t>(chunks_.size());
  const std::uint64_t wanted = std::max(chunk_bytes_, round_up(size, granularity_));
  const std::uint64_t got = grow_(chunk, wanted);
  if (got < size) throw UsageError(fmt::format("GPU pool: a new chunk of {} bytes for {} bytes", got, size));
  chunks_.push_back(got);
  free_.emplace_back();
  if (got > size) free_.back().emplace(size, got - size);
  return Range{chunk, 0, size};
}

void RangeAllocator::free(const Range& range) {
  if (range.chunk >= free_.size() || range.offset + range.bytes > chunks_[range.chunk] || range.bytes == 0) {
    throw UsageError(fmt::format("GPU pool: freeing [{}, +{}) of chunk {} that was never allocated", range.offset,
                                 range.bytes, range.chunk));
  }
  auto& ranges = free_[range.chunk];
  std::uint64_t offset = range.offset;
  std::uint64_t bytes = range.bytes;
  auto next = ranges.lower_bound(offset);
  if (next != ranges.end() && next->first < offset + bytes) {
    throw UsageError(fmt::format("GPU pool: double free of [{}, +{}) in chunk {}", offset, bytes, range.chunk));
  }
  if (next != ranges.end() && next->first == offset + bytes) {
    bytes += next->second;
    next = ranges.erase(next);
  }
  if (next != ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > offset) {
      throw UsageError(fmt::format("GPU pool: double free of [{}, +{}) in chunk {}", offset, range.bytes, range.chunk));
    }
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  ranges.emplace(offset, bytes);
}

std::uint64_t RangeAllocator::free_bytes() const noexcept {
  std::uint64_t total = 0;
  for (const auto& ranges : free_) {
    for (const auto& [offset, bytes] : ranges) total += bytes;
  }
  return total;
}

// ---- BlockTable ----

BlockTable::BlockTable(Arena& arena, int rank, int world_size, int device, std::uint64_t chunk_bytes,
                       std::uint64_t granularity, RangeAllocator::Grow grow)
    : arena_(arena), rank_(rank), world_size_(world_size), device_(device),
      ranges_(chunk_bytes, granularity, std::move(grow)) {
  register_rank(arena_, rank_, ::getpid());
}

BlockTable::~BlockTable() {
  // The records of blocks still held elsewhere stay: their holders still read them.
  reclaim();
}

BlockTable::Block BlockTable::allocate(std::uint64_t bytes) {
  if (!retired_.empty()) reclaim();
  BlockRecord* record = create_record(arena_, rank_, world_size_);
  RangeAllocator::Range range;
  try {
    range = ranges_.allocate(bytes);
  } catch (...) {
    destroy_record(arena_, record);
    throw;
  }
  record->owner_pid = static_cast<std::int32_t>(::getpid());
  record->device = device_;
  record->chunk = range.chunk;
  record->chunk_bytes = ranges_.chunk_bytes(range.chunk);
  record->offset = range.offset;
  record->bytes = range.bytes;
  record->ref(rank_).store(1, std::memory_order_release);
  return Block{range, record};
}

void BlockTable::retire(const Block& block) {
  block.record->ref(rank_).fetch_sub(1, std::memory_order_acq_rel);
  retired_.push_back(block);
  reclaim();
}

std::size_t BlockTable::reclaim() {
  std::size_t freed = 0;
  for (std::size_t i = 0; i < retired_.size();) {
    Block& block = retired_[i];
    // Our own count too: the owner may hold the block again through a queue (its tensor came back).
    if (record_unused(arena_, *block.record)) {
      ranges_.free(block.range);
      destroy_record(arena_, block.record);
      retired_[i] = retired_.back();
      retired_.pop_back();
      ++freed;
    } else {
      ++i;
    }
  }
  return freed;
}

}  // namespace nodal::detail::gpu
