// The GPU pool's host-side bookkeeping (runtime/src/gpu/block_table.hpp), without a GPU: ranges
// (alignment, first fit, coalescing, chunk growth, out of space), and when a block may be reused
// (the owner's, other ranks' and in-flight references; a dead rank's references ignored).
#include <gtest/gtest.h>

#include "block_table.hpp"

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace nodal::detail::gpu {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

/// A grow callback that records the chunks it "made" and can be told to fail (out of memory).
struct FakeDevice {
  std::vector<std::uint64_t> made;
  std::uint64_t capacity = UINT64_MAX;  ///< total bytes it can make
  std::uint64_t used = 0;
  RangeAllocator::Grow grow() {
    return [this](std::uint32_t chunk, std::uint64_t bytes) -> std::uint64_t {
      EXPECT_EQ(chunk, made.size());
      if (used + bytes > capacity) throw std::runtime_error("out of fake GPU memory");
      used += bytes;
      made.push_back(bytes);
      return bytes;
    };
  }
};

TEST(RangeAllocator, AlignsEveryRangeAndRoundsSizes) {
  FakeDevice dev;
  RangeAllocator ranges(4 * kMiB, 2 * kMiB, dev.grow());
  std::vector<RangeAllocator::Range> got;
  for (std::uint64_t bytes : {1, 255, 256, 257, 1000, 4096, 0}) {
    RangeAllocator::Range r = ranges.allocate(bytes);
    EXPECT_EQ(r.offset % kBlockAlignment, 0u);
    EXPECT_EQ(r.bytes % kBlockAlignment, 0u);
    EXPECT_GE(r.bytes, bytes);
    EXPECT_LT(r.bytes, std::max<std::uint64_t>(bytes, 1) + kBlockAlignment);
    for (const auto& other : got) {  // no overlap
      EXPECT_TRUE(r.chunk != other.chunk || r.offset + r.bytes <= other.offset || other.offset + other.bytes <= r.offset);
    }
    got.push_back(r);
  }
  EXPECT_EQ(dev.made.size(), 1u);
  EXPECT_EQ(dev.made[0], 4 * kMiB);
}

TEST(RangeAllocator, ChunkSizeIsRoundedToTheGranularity) {
  FakeDevice dev;
  RangeAllocator ranges(3 * kMiB, 2 * kMiB, dev.grow());
  (void)ranges.allocate(10);
  ASSERT_EQ(dev.made.size(), 1u);
  EXPECT_EQ(dev.made[0], 4 * kMiB);
  EXPECT_THROW(RangeAllocator(kMiB, 3000, dev.grow()), UsageError);
  EXPECT_THROW(RangeAllocator(kMiB, 0, dev.grow()), UsageError);
}

TEST(RangeAllocator, FreedRangesAreReusedFirstFitAndCoalesced) {
  FakeDevice dev;
  RangeAllocator ranges(2 * kMiB, 2 * kMiB, dev.grow());
  auto a = ranges.allocate(kMiB / 2);
  auto b = ranges.allocate(kMiB / 2);
  auto c = ranges.allocate(kMiB / 2);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(b.offset, kMiB / 2);
  EXPECT_EQ(c.offset, kMiB);
  ranges.free(a);
  auto d = ranges.allocate(1000);  // first fit: the hole at the start
  EXPECT_EQ(d.offset, 0u);
  ranges.free(d);
  ranges.free(b);  // coalesces with [0, 0.5M)
  auto e = ranges.allocate(kMiB);  // fits only in the merged hole
  EXPECT_EQ(e.offset, 0u);
  EXPECT_EQ(dev.made.size(), 1u);
  ranges.free(e);
  ranges.free(c);
  EXPECT_EQ(ranges.free_bytes(), 2 * kMiB);
  auto whole = ranges.allocate(2 * kMiB);  // everything merged back into one range
  EXPECT_EQ(whole.offset, 0u);
  EXPECT_EQ(dev.made.size(), 1u);
}

TEST(RangeAllocator, GrowsNewChunksAndBigOnesForBigAllocations) {
  FakeDevice dev;
  RangeAllocator ranges(2 * kMiB, 2 * kMiB, dev.grow());
  auto a = ranges.allocate(2 * kMiB);
  auto b = ranges.allocate(1);
  EXPECT_EQ(a.chunk, 0u);
  EXPECT_EQ(b.chunk, 1u);
  auto big = ranges.allocate(5 * kMiB + 1);  // one allocation larger than a chunk
  EXPECT_EQ(big.chunk, 2u);
  EXPECT_EQ(big.offset, 0u);
  ASSERT_EQ(dev.made.size(), 3u);
  EXPECT_EQ(dev.made[2], 6 * kMiB);
  EXPECT_EQ(ranges.chunk_bytes(2), 6 * kMiB);
  // The rest of the big chunk is usable.
  auto rest = ranges.allocate(kMiB / 2);
  EXPECT_TRUE(rest.chunk == 1u || rest.chunk == 2u);
}

TEST(RangeAllocator, OutOfSpaceThrowsAndLeavesTheAllocatorUsable) {
  FakeDevice dev;
  dev.capacity = 4 * kMiB;
  RangeAllocator ranges(2 * kMiB, 2 * kMiB, dev.grow());
  auto a = ranges.allocate(2 * kMiB);
  auto b = ranges.allocate(2 * kMiB);
  EXPECT_THROW((void)ranges.allocate(1), std::runtime_error);
  EXPECT_EQ(ranges.chunk_count(), 2u);
  ranges.free(b);
  auto c = ranges.allocate(1);  // fits again after a free
  EXPECT_EQ(c.chunk, 1u);
  (void)a;
}

TEST(RangeAllocator, DoubleAndForeignFreesAreRejected) {
  FakeDevice dev;
  RangeAllocator ranges(2 * kMiB, 2 * kMiB, dev.grow());
  auto a = ranges.allocate(1024);
  (void)ranges.allocate(1024);
  ranges.free(a);
  EXPECT_THROW(ranges.free(a), UsageError);
  EXPECT_THROW(ranges.free({7, 0, 256}), UsageError);
}

class BlockTableTest : public ::testing::Test {
 protected:
  void SetUp() override { arena_ = Arena::create(16 * kMiB); }
  std::unique_ptr<Arena> arena_;
  FakeDevice dev_;
};

TEST_F(BlockTableTest, RecordStartsWithTheOwnersReferenceAndIsFoundByOffset) {
  BlockTable table(*arena_, 0, 4, 0, 2 * kMiB, 2 * kMiB, dev_.grow());
  auto block = table.allocate(1000);
  BlockRecord& record = record_at(*arena_, arena_->offset_of(block.record));
  EXPECT_EQ(&record, block.record);
  EXPECT_EQ(record.owner, 0);
  EXPECT_EQ(record.world_size, 4);
  EXPECT_EQ(record.owner_pid, ::getpid());
  EXPECT_EQ(record.chunk_bytes, 2 * kMiB);
  EXPECT_EQ(record.bytes, 1024u);
  EXPECT_EQ(record.ref(0).load(), 1);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(record.ref(r).load(), 0);
  EXPECT_EQ(record.in_flight.load(), 0);
  EXPECT_THROW((void)record.ref(4), UsageError);
  EXPECT_THROW((void)record_at(*arena_, 64), ShmError);
  EXPECT_THROW((void)record_at(*arena_, 0), ShmError);
}

TEST_F(BlockTableTest, ABlockNobodyElseHoldsIsReusedAtOnce) {
  BlockTable table(*arena_, 0, 2, 0, 2 * kMiB, 2 * kMiB, dev_.grow());
  auto a = table.allocate(4096);
  table.retire(a);
  EXPECT_EQ(table.retired_count(), 0u);
  auto b = table.allocate(4096);
  EXPECT_EQ(b.range.offset, a.range.offset);
  EXPECT_EQ(dev_.made.size(), 1u);
}

TEST_F(BlockTableTest, ALiveConsumersReferenceKeepsTheBlock) {
  BlockTable table(*arena_, 0, 2, 0, 2 * kMiB, 2 * kMiB, dev_.grow());
  register_rank(*arena_, 1, ::getpid());  // rank 1: a live process (this one)
  auto a = table.allocate(4096);
  a.record->ref(1).fetch_add(1);  // rank 1 imported it
  table.retire(a);
  EXPECT_EQ(table.retired_count(), 1u);
  auto b = table.allocate(4096);
  EXPECT_NE(b.range.offset, a.range.offset);  // not reused while held
  a.record->ref(1).fetch_sub(1);              // rank 1 dropped it
  EXPECT_EQ(table.reclaim(), 1u);
  auto c = table.allocate(4096);
  EXPECT_EQ(c.range.offset, a.range.offset);
}

TEST_F(BlockTableTest, InFlightReferencesKeepTheBlock) {
  BlockTable table(*arena_, 0, 2, 0, 2 * kMiB, 2 * kMiB, dev_.grow());
  auto a = table.allocate(100);
  a.record->in_flight.fetch_add(2);  // in two queue cells
  table.retire(a);
  EXPECT_EQ(table.reclaim(), 0u);
  a.record->in_flight.fetch_sub(1);
  EXPECT_EQ(table.reclaim(), 0u);
  a.record->in_flight.fetch_sub(1);
  EXPECT_EQ(table.reclaim(), 1u);
  EXPECT_EQ(table.retired_count(), 0u);
}

TEST_F(BlockTableTest, TheOwnersOwnSecondReferenceKeepsTheBlock) {
  // The owner's tensor came back through a queue: its first Storage is gone, the second lives.
  BlockTable table(*arena_, 0, 1, 0, 2 * kMiB, 2 * kMiB, dev_.grow());
  auto a = table.allocate(100);
  a.record->ref(0).fetch_add(1);
  table.retire(a);
  EXPECT_EQ(table.retired_count(), 1u);
  a.record->ref(0).fetch_sub(1);
  EXPECT_EQ(table.reclaim(), 1u);
}

TEST_F(BlockTableTest, ADeadRanksReferencesAreIgnored) {
  BlockTable table(*arena_, 0, 3, 0, 2 * kMiB, 2 * kMiB, dev_.grow());
  auto a = table.allocate(8192);
  // Rank 2, a real process, registers, takes a reference and dies holding it.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    register_rank(*arena_, 2, ::getpid());
    a.record->ref(2).fetch_add(1);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(a.record->ref(2).load(), 1);  // its count is still there...
  EXPECT_FALSE(rank_alive(*arena_, 2));
  EXPECT_TRUE(rank_alive(*arena_, 0));
  EXPECT_FALSE(rank_alive(*arena_, 1));  // never registered
  table.retire(a);                        // ...but does not pin the block
  EXPECT_EQ(table.retired_count(), 0u);
  auto b = table.allocate(8192);
  EXPECT_EQ(b.range.offset, a.range.offset);
}

TEST_F(BlockTableTest, ALiveChildsReferenceCountsUntilItDies) {
  BlockTable table(*arena_, 0, 2, 0, 2 * kMiB, 2 * kMiB, dev_.grow());
  auto a = table.allocate(8192);
  // Two pipes: one each way (with one, the child could read back its own byte and leave the
  // parent waiting forever).
  int ready[2];
  int go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    register_rank(*arena_, 1, ::getpid());
    a.record->ref(1).fetch_add(1);
    char byte;
    (void)::write(ready[1], "r", 1);
    (void)::read(go[0], &byte, 1);  // until the parent has checked
    ::_exit(0);
  }
  char byte;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  table.retire(a);
  EXPECT_EQ(table.retired_count(), 1u);  // rank 1 lives and holds it
  ASSERT_EQ(::write(go[1], "g", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(table.reclaim(), 1u);
  for (int fd : {ready[0], ready[1], go[0], go[1]}) ::close(fd);
}

TEST_F(BlockTableTest, OutOfGpuMemoryFreesTheRecordAndRethrows) {
  dev_.capacity = 2 * kMiB;
  BlockTable table(*arena_, 0, 1, 0, 2 * kMiB, 2 * kMiB, dev_.grow());
  auto a = table.allocate(2 * kMiB);
  const std::size_t free_before = arena_->free_bytes();
  EXPECT_THROW((void)table.allocate(1), std::runtime_error);
  EXPECT_EQ(arena_->free_bytes(), free_before);  // no record leaked
  table.retire(a);
  EXPECT_NO_THROW((void)table.allocate(1));
}

TEST_F(BlockTableTest, BadRanksAreUsageErrors) {
  EXPECT_THROW((void)create_record(*arena_, 3, 2), UsageError);
  EXPECT_THROW((void)create_record(*arena_, 0, 0), UsageError);
  EXPECT_THROW(register_rank(*arena_, kMaxRanks, ::getpid()), UsageError);
  EXPECT_FALSE(rank_alive(*arena_, -1));
}

}  // namespace
}  // namespace nodal::detail::gpu
