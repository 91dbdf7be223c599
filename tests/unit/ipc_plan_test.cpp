// The CUDA IPC collectives' size arithmetic (collectives/src/cuda/ipc_plan.hpp): host-only, so it
// is checked on every machine, GPU or not.
#include "cuda/ipc_plan.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

using namespace nodal::detail::cuda_ipc;

TEST(IpcPlan, SharesCoverTheBufferInRankOrderAligned) {
  const std::vector<std::size_t> counts = {0, 1, 7, 63, 64, 65, 255, 256, 257, 1000, 4096, 65536, 1000003, 16777216, 16777217};
  for (std::size_t es : {1u, 2u, 4u, 8u}) {
    for (int n = 1; n <= 9; ++n) {
      for (std::size_t count : counts) {
        std::size_t next = 0;
        std::size_t smallest = count, largest = 0;
        for (int r = 0; r < n; ++r) {
          const Range share = share_range(count, es, n, r);
          ASSERT_EQ(share.begin, next) << "count " << count << " es " << es << " n " << n << " r " << r;
          ASSERT_LE(share.begin, share.end);
          if (share.begin != count) {
            ASSERT_EQ(share.begin * es % kShareAlign, 0u);
          }
          if (share.end != count) {
            ASSERT_EQ(share.end * es % kShareAlign, 0u);
          }
          next = share.end;
          smallest = std::min(smallest, share.size());
          largest = std::max(largest, share.size());
        }
        ASSERT_EQ(next, count) << "count " << count << " es " << es << " n " << n;
        // Even: at most one alignment unit apart (the last share may be cut short by the count).
        if (count >= static_cast<std::size_t>(n) * kShareAlign / es) {
          const Range last = share_range(count, es, n, n - 1);
          if (last.end == count && count * es % kShareAlign == 0) {
            EXPECT_LE(largest - smallest, kShareAlign / es);
          }
        }
        EXPECT_EQ(max_share(count, es, n), largest) << "count " << count << " es " << es << " n " << n;
      }
    }
  }
}

TEST(IpcPlan, SharesOfTypicalSizes) {
  // 64 MiB of f32 on 4 ranks: 16 MiB each.
  const std::size_t count = 16u << 20;
  for (int r = 0; r < 4; ++r) {
    const Range share = share_range(count, 4, 4, r);
    EXPECT_EQ(share.begin, static_cast<std::size_t>(r) * (4u << 20));
    EXPECT_EQ(share.size(), 4u << 20);
  }
  // A tiny buffer goes to the first ranks whole units at a time; the others get nothing.
  EXPECT_EQ(share_range(10, 4, 4, 0), (Range{0, 10}));
  EXPECT_EQ(share_range(10, 4, 4, 1), (Range{10, 10}));
  EXPECT_EQ(share_range(10, 4, 4, 3), (Range{10, 10}));
  // Out-of-range arguments give an empty range rather than garbage.
  EXPECT_EQ(share_range(100, 4, 4, 4).size(), 0u);
  EXPECT_EQ(share_range(100, 4, 0, 0).size(), 0u);
}

TEST(IpcPlan, AlgorithmThreshold) {
  EXPECT_EQ(choose_algorithm(4096, 8, kDefaultOnePassMax), Algorithm::one_pass);
  EXPECT_EQ(choose_algorithm(kDefaultOnePassMax, 8, kDefaultOnePassMax), Algorithm::one_pass);
  EXPECT_EQ(choose_algorithm(kDefaultOnePassMax + 1, 8, kDefaultOnePassMax), Algorithm::reduce_scatter_allgather);
  EXPECT_EQ(choose_algorithm(64u << 20, 2, kDefaultOnePassMax), Algorithm::reduce_scatter_allgather);
  EXPECT_EQ(choose_algorithm(64u << 20, 1, kDefaultOnePassMax), Algorithm::one_pass);  // nothing to scatter
  EXPECT_EQ(choose_algorithm(0, 4, 0), Algorithm::one_pass);
}

TEST(IpcPlan, ScratchLayouts) {
  const std::size_t count = 1000003;  // odd: the reduced area must start aligned all the same
  const ScratchLayout big = scratch_layout(Kind::allreduce, Algorithm::reduce_scatter_allgather, count, 4, 4);
  EXPECT_EQ(big.staging_bytes, count * 4);
  EXPECT_EQ(big.reduced_offset % kShareAlign, 0u);
  EXPECT_GE(big.reduced_offset, big.staging_bytes);
  EXPECT_EQ(big.reduced_bytes, max_share(count, 4, 4) * 4);
  EXPECT_EQ(big.total(), big.reduced_offset + big.reduced_bytes);
  // Every rank's reduced share fits.
  for (int r = 0; r < 4; ++r) EXPECT_LE(share_range(count, 4, 4, r).size() * 4, big.reduced_bytes);

  const ScratchLayout small = scratch_layout(Kind::allreduce, Algorithm::one_pass, 1024, 4, 8);
  EXPECT_EQ(small.staging_bytes, 4096u);
  EXPECT_EQ(small.reduced_bytes, 0u);
  EXPECT_EQ(small.total(), 4096u);

  EXPECT_EQ(scratch_layout(Kind::reduce_scatter, Algorithm::one_pass, 100, 8, 3).staging_bytes, 3u * 100 * 8);
  EXPECT_EQ(scratch_layout(Kind::allgather, Algorithm::one_pass, 100, 2, 3).total(), 200u);
  EXPECT_EQ(scratch_layout(Kind::broadcast, Algorithm::one_pass, 100, 1, 3).total(), 100u);
  EXPECT_EQ(scratch_layout(Kind::barrier, Algorithm::one_pass, 0, 1, 3).total(), 0u);
  EXPECT_EQ(scratch_layout(Kind::allreduce, Algorithm::one_pass, 0, 4, 3).total(), 0u);
}

TEST(IpcPlan, ScratchGrowsInPowersOfTwoAndNeverShrinks) {
  EXPECT_EQ(grow_scratch(0, 0), 0u);
  EXPECT_EQ(grow_scratch(0, 1), kMinScratch);
  EXPECT_EQ(grow_scratch(0, kMinScratch), kMinScratch);
  EXPECT_EQ(grow_scratch(kMinScratch, kMinScratch + 1), 2 * kMinScratch);
  EXPECT_EQ(grow_scratch(64u << 20, 4096), 64u << 20);
  EXPECT_EQ(grow_scratch(2u << 20, (64u << 20) + (16u << 20)), 128u << 20);
  // Every rank replays the same calls, so the same capacities at the same calls.
  std::size_t a = 0, b = 0;
  for (std::size_t need : {100u, 5000000u, 4096u, 80000000u, 3u}) {
    const std::size_t ga = grow_scratch(a, need), gb = grow_scratch(b, need);
    EXPECT_EQ(ga, gb);
    EXPECT_GE(ga, need);
    a = ga;
    b = gb;
  }
}

TEST(IpcPlan, EventSlotsAlternateByParityPerKind) {
  EXPECT_EQ(event_slot(EventKind::posted, 1), 1);
  EXPECT_EQ(event_slot(EventKind::posted, 2), 0);
  EXPECT_EQ(event_slot(EventKind::reduced, 1), 3);
  EXPECT_EQ(event_slot(EventKind::reduced, 2), 2);
  for (std::uint64_t call = 1; call < 10; ++call) {
    EXPECT_NE(event_slot(EventKind::posted, call), event_slot(EventKind::posted, call + 1));
    EXPECT_NE(event_slot(EventKind::posted, call), event_slot(EventKind::reduced, call));
    EXPECT_LT(event_slot(EventKind::reduced, call), kEventsPerRank);
  }
}

TEST(IpcPlan, AlignmentAndOverlap) {
  alignas(16) static char buffer[256];
  EXPECT_TRUE(aligned16(buffer, buffer + 32, 64));
  EXPECT_FALSE(aligned16(buffer + 1, buffer + 32, 64));
  EXPECT_FALSE(aligned16(buffer, buffer + 32, 63));
  EXPECT_TRUE(overlaps(buffer, 10, buffer + 9, 10));
  EXPECT_FALSE(overlaps(buffer, 10, buffer + 10, 10));
  EXPECT_FALSE(overlaps(buffer, 0, buffer, 10));
  EXPECT_TRUE(overlaps(buffer + 20, 10, buffer, 64));
}

TEST(IpcPlan, LargeCallsAgreeWithTheAlgorithm) {
  const std::size_t max = kDefaultOnePassMax;
  for (int n : {1, 2, 3, 4, 8}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, max / 4, max / 4 + 1, std::size_t{16} << 20}) {
      // allreduce and reduce: exactly the two-phase algorithm (whose path already ends with every
      // rank's reduced event).
      for (Kind kind : {Kind::allreduce, Kind::reduce}) {
        EXPECT_EQ(large_call(kind, count, 4, n, max),
                  choose_algorithm(count * 4, n, max) == Algorithm::reduce_scatter_allgather)
            << "n " << n << " count " << count;
      }
    }
  }
  // reduce_scatter: the same rule on its whole (n * count) input.
  EXPECT_FALSE(large_call(Kind::reduce_scatter, max / 4 / 4, 4, 4, max));
  EXPECT_TRUE(large_call(Kind::reduce_scatter, max / 4 / 4 + 1, 4, 4, max));
  EXPECT_FALSE(large_call(Kind::reduce_scatter, std::size_t{1} << 24, 4, 1, max));
  // broadcast, allgather: more than one_pass_max per rank, and a peer to read it.
  for (Kind kind : {Kind::broadcast, Kind::allgather}) {
    EXPECT_FALSE(large_call(kind, max, 1, 4, max));
    EXPECT_TRUE(large_call(kind, max + 1, 1, 4, max));
    EXPECT_FALSE(large_call(kind, max + 1, 1, 1, max));
    EXPECT_FALSE(large_call(kind, 0, 4, 4, 0));
  }
  EXPECT_FALSE(large_call(Kind::barrier, 0, 1, 4, 0));
  // The 64 MiB f32 allreduce the bandwidth target is about.
  EXPECT_TRUE(large_call(Kind::allreduce, std::size_t{16} << 20, 4, 2, max));
}

TEST(IpcPlan, InputOverlapPerKind) {
  alignas(16) static std::byte memory[4096];
  std::byte* const base = memory;
  const std::size_t count = 16, es = 4, bytes = count * es;  // 64 bytes per block
  const int n = 4;
  // allreduce, reduce: in place only when input == output.
  for (Kind kind : {Kind::allreduce, Kind::reduce}) {
    EXPECT_EQ(input_overlap(kind, base, base, count, es, n, 2), Overlap::in_place);
    EXPECT_EQ(input_overlap(kind, base, base + bytes, count, es, n, 2), Overlap::none);
    EXPECT_EQ(input_overlap(kind, base, base + 4, count, es, n, 2), Overlap::partial);
    EXPECT_EQ(input_overlap(kind, base + 4, base, count, es, n, 2), Overlap::partial);
    EXPECT_EQ(input_overlap(kind, base, nullptr, count, es, n, 2), Overlap::none);  // reduce, non-root
    EXPECT_EQ(input_overlap(kind, base, base, 0, es, n, 2), Overlap::none);         // nothing to read
  }
  // allgather: in place when the input is this rank's block of the output.
  EXPECT_EQ(input_overlap(Kind::allgather, base + 2 * bytes, base, count, es, n, 2), Overlap::in_place);
  EXPECT_EQ(input_overlap(Kind::allgather, base + 1 * bytes, base, count, es, n, 2), Overlap::partial);  // another rank's block
  EXPECT_EQ(input_overlap(Kind::allgather, base + 2 * bytes + 4, base, count, es, n, 2), Overlap::partial);
  EXPECT_EQ(input_overlap(Kind::allgather, base + 4 * bytes, base, count, es, n, 2), Overlap::none);
  EXPECT_EQ(input_overlap(Kind::allgather, base, base + bytes, count, es, n, 0), Overlap::none);
  // reduce_scatter: in place when the output is this rank's block of the input.
  EXPECT_EQ(input_overlap(Kind::reduce_scatter, base, base + 3 * bytes, count, es, n, 3), Overlap::in_place);
  EXPECT_EQ(input_overlap(Kind::reduce_scatter, base, base + 3 * bytes, count, es, n, 1), Overlap::partial);
  EXPECT_EQ(input_overlap(Kind::reduce_scatter, base, base, count, es, n, 1), Overlap::partial);
  EXPECT_EQ(input_overlap(Kind::reduce_scatter, base, base, count, es, n, 0), Overlap::in_place);
  EXPECT_EQ(input_overlap(Kind::reduce_scatter, base, base + 4 * bytes, count, es, n, 0), Overlap::none);
  // One buffer, or none.
  EXPECT_EQ(input_overlap(Kind::broadcast, base, base, count, es, n, 0), Overlap::none);
  EXPECT_EQ(input_overlap(Kind::barrier, nullptr, nullptr, 0, 1, n, 0), Overlap::none);
}

TEST(IpcPlan, InputReadableInPlace) {
  for (Kind kind : {Kind::allreduce, Kind::allgather, Kind::reduce_scatter}) {
    for (bool root : {false, true}) {
      EXPECT_TRUE(input_readable_in_place(kind, Overlap::none, root));
      EXPECT_TRUE(input_readable_in_place(kind, Overlap::in_place, root));
      EXPECT_FALSE(input_readable_in_place(kind, Overlap::partial, root));  // own writes may meet peers' reads
    }
  }
  // reduce: the root writes its output; a non-root writes none.
  EXPECT_TRUE(input_readable_in_place(Kind::reduce, Overlap::in_place, true));
  EXPECT_FALSE(input_readable_in_place(Kind::reduce, Overlap::partial, true));
  EXPECT_TRUE(input_readable_in_place(Kind::reduce, Overlap::partial, false));
  // broadcast: only the root's buffer is read.
  EXPECT_TRUE(input_readable_in_place(Kind::broadcast, Overlap::none, true));
  EXPECT_FALSE(input_readable_in_place(Kind::broadcast, Overlap::none, false));
  EXPECT_FALSE(input_readable_in_place(Kind::barrier, Overlap::none, true));
}

}  // namespace
