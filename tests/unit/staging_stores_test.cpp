// The choice between cached and streaming stores for staged copies (collectives/src/shm/
// staging_stores.hpp), against a simulated machine whose costs per mode the test sets.
#include "shm/staging_stores.hpp"

#include "comm_state.hpp"  // CollKind

#include <nodal/errors.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

using nodal::detail::CollKind;
using nodal::detail::StagingMode;
using nodal::detail::StagingSetting;
using nodal::detail::StagingStores;

constexpr std::size_t kBlock = 512 << 10;  // inside the adaptive range
constexpr CollKind kKind = CollKind::alltoall;
constexpr StagingMode kCached = StagingMode::cached;
constexpr StagingMode kStreaming = StagingMode::streaming;

/// A machine on which a call of `kBlock` bytes takes `ns[mode]` (the same for every call).
struct Machine {
  double ns[2];
  std::uint64_t took(StagingMode mode) const { return static_cast<std::uint64_t>(ns[static_cast<int>(mode)]); }
};

/// Runs `calls` calls of `block` bytes on `machine`; returns how many were streaming.
int run(StagingStores& stores, const Machine& machine, int calls, std::size_t block = kBlock) {
  int streaming = 0;
  for (int i = 0; i < calls; ++i) {
    const StagingMode mode = stores.choose(kKind, block);
    streaming += mode == kStreaming;
    stores.record(kKind, block, mode, mode, machine.took(mode));
  }
  return streaming;
}

TEST(StagingStores, ForcedSettingsGiveTheirModeForEveryCall) {
  StagingStores cached(StagingSetting::cached), streaming(StagingSetting::streaming);
  for (std::size_t block : {std::size_t{64}, kBlock, std::size_t{64} << 20}) {
    EXPECT_EQ(cached.choose(kKind, block), kCached);
    EXPECT_EQ(streaming.choose(kKind, block), kStreaming);
  }
  // What they are told changes nothing.
  const Machine slow_cached{{1e6, 1e3}};
  EXPECT_EQ(run(cached, slow_cached, 300), 0);
  EXPECT_EQ(run(streaming, Machine{{1e3, 1e6}}, 300), 300);
}

TEST(StagingStores, AutoStaysCachedOutsideItsRange) {
  StagingStores stores(StagingSetting::automatic);
  const Machine slow_cached{{1e6, 1e3}};  // streaming would win by 1000x
  EXPECT_EQ(run(stores, slow_cached, 300, StagingStores::kAdaptiveMinBytes - 1), 0);
  EXPECT_EQ(run(stores, slow_cached, 300, StagingStores::kAdaptiveEndBytes), 0);
  // The range's ends are in it and out of it, as documented.
  EXPECT_TRUE(StagingStores::adaptive(StagingStores::kAdaptiveMinBytes));
  EXPECT_FALSE(StagingStores::adaptive(StagingStores::kAdaptiveEndBytes));
}

TEST(StagingStores, AutoTriesBothThenTakesTheFasterAndExploresTheOther) {
  StagingStores stores(StagingSetting::automatic);
  const Machine fast_cached{{1000, 1800}};
  // Two calls in each mode first.
  std::string first;
  for (int i = 0; i < 4; ++i) {
    const StagingMode mode = stores.choose(kKind, kBlock);
    first += mode == kCached ? 'c' : 's';
    stores.record(kKind, kBlock, mode, mode, fast_cached.took(mode));
  }
  EXPECT_EQ(first, "ccss");
  // Then cached, with kExploreCalls streaming calls in every kExploreEvery.
  const int windows = 10;
  EXPECT_EQ(run(stores, fast_cached, windows * StagingStores::kExploreEvery),
            windows * static_cast<int>(StagingStores::kExploreCalls));
  // The other way round on a fresh chooser.
  StagingStores other(StagingSetting::automatic);
  EXPECT_EQ(run(other, Machine{{1800, 1000}}, 4), 2);
  EXPECT_EQ(run(other, Machine{{1800, 1000}}, windows * StagingStores::kExploreEvery),
            windows * static_cast<int>(StagingStores::kExploreEvery - StagingStores::kExploreCalls));
}

TEST(StagingStores, AutoFollowsTheMachineWhenItChangesState) {
  StagingStores stores(StagingSetting::automatic);
  const Machine near{{1000, 1800}}, far{{6000, 1600}};  // far: cached collapses (alltoall 512 KiB: 49 vs 345 us)
  run(stores, near, 4 * StagingStores::kExploreEvery);
  EXPECT_EQ(run(stores, near, StagingStores::kExploreEvery), static_cast<int>(StagingStores::kExploreCalls));
  // Within one exploring window of the change it has switched, and stays switched.
  run(stores, far, StagingStores::kExploreEvery + 1);
  EXPECT_EQ(run(stores, far, StagingStores::kExploreEvery),
            static_cast<int>(StagingStores::kExploreEvery - StagingStores::kExploreCalls));
  // And back.
  run(stores, near, StagingStores::kExploreEvery + 1);
  EXPECT_EQ(run(stores, near, StagingStores::kExploreEvery), static_cast<int>(StagingStores::kExploreCalls));
}

TEST(StagingStores, ASlowFirstCallAfterASwitchDoesNotHideAFasterMode) {
  // After streaming calls the ring's lines are in memory: the first cached call fetches them all
  // and is slow. Were an exploration that one call, cached would never win back.
  StagingStores stores(StagingSetting::automatic);
  run(stores, Machine{{6000, 1600}}, 4 * StagingStores::kExploreEvery);  // settled on streaming
  bool last_cached = false;
  auto call = [&] {  // near again, but each first cached call after streaming ones takes 100x as long
    const StagingMode mode = stores.choose(kKind, kBlock);
    const bool first_cached = mode == kCached && !last_cached;
    stores.record(kKind, kBlock, mode, mode, mode == kStreaming ? 1800 : first_cached ? 100000 : 1000);
    last_cached = mode == kCached;
    return mode == kStreaming;
  };
  for (int i = 0; i < 2 * static_cast<int>(StagingStores::kExploreEvery); ++i) call();
  int streaming = 0;
  for (int i = 0; i < static_cast<int>(StagingStores::kExploreEvery); ++i) streaming += call();
  EXPECT_EQ(streaming, static_cast<int>(StagingStores::kExploreCalls)) << "it did not go back to cached";
}

TEST(StagingStores, AColdFirstCallDoesNotDecide) {
  // The first call of a size faults its output's pages in: 50x as long. Decided on that one call,
  // streaming would run until the first exploration (all of a short run).
  StagingStores stores(StagingSetting::automatic);
  int streaming = 0;
  for (int i = 0; i < 100; ++i) {
    const StagingMode mode = stores.choose(kKind, kBlock);
    streaming += mode == kStreaming;
    stores.record(kKind, kBlock, mode, mode, i == 0 ? 50000 : mode == kStreaming ? 1800 : 1000);
  }
  EXPECT_EQ(streaming, 2) << "only the two calls that learn streaming's time";
}

TEST(StagingStores, AnOccasionalSlowCallDoesNotSwitch) {
  // Every 7th call of the chosen mode takes 10x as long (an interrupt, a preemption): the choice
  // stays cached, streaming only for the exploring calls.
  StagingStores stores(StagingSetting::automatic);
  run(stores, Machine{{1000, 1800}}, 4 * StagingStores::kExploreEvery);
  int streaming = 0;
  for (int i = 0; i < 10 * static_cast<int>(StagingStores::kExploreEvery); ++i) {
    const StagingMode mode = stores.choose(kKind, kBlock);
    streaming += mode == kStreaming;
    stores.record(kKind, kBlock, mode, mode, mode == kStreaming ? 1800 : i % 7 == 0 ? 10000 : 1000);
  }
  EXPECT_EQ(streaming, 10 * static_cast<int>(StagingStores::kExploreCalls));
}

TEST(StagingStores, OnlyCallsThatCameAsAskedTakeExploringTurns) {
  // Calls that were not staged (cma, in place) are not recorded, and calls overruled by another
  // reader came otherwise than asked: however many there are, the turn stays where it is, so the
  // mode asked for does not change, whether it is an exploring turn or not.
  StagingStores stores(StagingSetting::automatic);
  run(stores, Machine{{1000, 1800}}, 4 * StagingStores::kExploreEvery);
  for (int round = 0; round < 3; ++round) {
    const StagingMode first = stores.choose(kKind, kBlock);
    int same = 1;
    for (int i = 0; i < 500; ++i) {
      const StagingMode mode = stores.choose(kKind, kBlock);
      same += mode == first;
      if (i % 2 == 0) {  // overruled: came the other way
        const StagingMode came = mode == kCached ? kStreaming : kCached;
        stores.record(kKind, kBlock, came, mode, came == kCached ? 1000 : 1800);
      }
    }
    EXPECT_EQ(same, 501) << "round " << round;
    run(stores, Machine{{1000, 1800}}, 50);  // calls that come as asked move the turns on
  }
  // And the counted calls still explore 2 in 128.
  EXPECT_EQ(run(stores, Machine{{1000, 1800}}, StagingStores::kExploreEvery), static_cast<int>(StagingStores::kExploreCalls));
}

/// broadcast to two readers: the root streams the slice if either asks, each reader records the
/// call under what came. A cached call costs reader 1 `one_cached_ns`, reader 2 `two_cached_ns`.
struct TwoReaders {
  StagingStores one{StagingSetting::automatic}, two{StagingSetting::automatic};
  bool call(double one_cached_ns, double two_cached_ns) {
    const StagingMode a = one.choose(kKind, kBlock), b = two.choose(kKind, kBlock);
    const StagingMode came = a == kStreaming || b == kStreaming ? kStreaming : kCached;
    one.record(kKind, kBlock, came, a, came == kStreaming ? 1800 : static_cast<std::uint64_t>(one_cached_ns));
    two.record(kKind, kBlock, came, b, came == kStreaming ? 1600 : static_cast<std::uint64_t>(two_cached_ns));
    return came == kStreaming;
  }
  int calls(int n, double one_cached_ns, double two_cached_ns) {
    int streamed = 0;
    for (int i = 0; i < n; ++i) streamed += call(one_cached_ns, two_cached_ns);
    return streamed;
  }
};

TEST(StagingStores, ReadersOfASharedSliceGoBackToCachedWhenOneCollapsedAlone) {
  // Reader 2 sits where cached copies collapse for a while, then not any more; reader 1 never
  // does. Reader 1's calls, overruled by reader 2's streaming, must not use up its turns.
  TwoReaders r;
  const int window = static_cast<int>(StagingStores::kExploreEvery);
  r.calls(4 * window, 1000, 6000);
  EXPECT_GE(r.calls(4 * window, 1000, 6000), 4 * window - 8);
  r.calls(2 * window, 1000, 1000);  // both near again
  EXPECT_LE(r.calls(4 * window, 1000, 1000), 4 * 2 * static_cast<int>(StagingStores::kExploreCalls)) << "stuck on streaming";
}

TEST(StagingStores, ReadersOfASharedSliceGoBackToCachedWhenBothCollapsed) {
  // The machine-wide case: both readers prefer streaming for a while. An exploring turn for cached
  // stores that the other reader's streaming overrules waits until the call comes as asked; a
  // clock that counted overruled calls would let the turns pass unmeasured once they drift apart.
  TwoReaders r;
  const int window = static_cast<int>(StagingStores::kExploreEvery);
  run(r.two, Machine{{6000, 1600}}, 37);  // reader 2's turns 37 calls ahead of reader 1's
  r.calls(4 * window, 6000, 6000);
  EXPECT_GE(r.calls(4 * window, 6000, 6000), 4 * window - 8);
  r.calls(4 * window, 1000, 1000);  // both near again
  EXPECT_LE(r.calls(4 * window, 1000, 1000), 4 * 2 * static_cast<int>(StagingStores::kExploreCalls)) << "stuck on streaming";
}

TEST(StagingStores, SizeClassesAndKindsChooseApart) {
  StagingStores stores(StagingSetting::automatic);
  run(stores, Machine{{6000, 1600}}, 4 * StagingStores::kExploreEvery, 512 << 10);
  run(stores, Machine{{1000, 1800}}, 4 * StagingStores::kExploreEvery, 2 << 20);
  int broadcast_streaming = 0;
  for (int i = 0; i < 100; ++i) {
    const StagingMode mode = stores.choose(CollKind::broadcast, 512 << 10);  // nothing learnt for broadcast yet
    broadcast_streaming += mode == kStreaming;
    stores.record(CollKind::broadcast, 512 << 10, mode, mode, mode == kStreaming ? 1800 : 1000);
  }
  EXPECT_EQ(broadcast_streaming, 2);
}

TEST(StagingStores, SizeClassesChooseApart) {
  StagingStores stores(StagingSetting::automatic);
  run(stores, Machine{{6000, 1600}}, 4 * StagingStores::kExploreEvery, 512 << 10);
  run(stores, Machine{{1000, 1800}}, 4 * StagingStores::kExploreEvery, 2 << 20);
  int streaming_small = 0, streaming_large = 0;
  for (int i = 0; i < 100; ++i) {
    streaming_small += stores.choose(kKind, 512 << 10) == kStreaming;
    streaming_large += stores.choose(kKind, 2 << 20) == kStreaming;
  }
  EXPECT_GE(streaming_small, 95);
  EXPECT_LE(streaming_large, 5);
}

TEST(StagingStores, TheSettingIsReadFromTheEnvironmentAndCheckedThere) {
  const char* name = "NODAL_STAGING_STORES";
  const char* saved = std::getenv(name);
  const std::string before = saved ? saved : "";
  auto read = [&](const char* value) {
    if (value) ::setenv(name, value, 1); else ::unsetenv(name);
    return nodal::detail::staging_setting_from_env();
  };
  EXPECT_EQ(read(nullptr), StagingSetting::automatic);
  EXPECT_EQ(read(""), StagingSetting::automatic);
  EXPECT_EQ(read("auto"), StagingSetting::automatic);
  EXPECT_EQ(read("cached"), StagingSetting::cached);
  EXPECT_EQ(read("streaming"), StagingSetting::streaming);
  try {
    read("nt");
    ADD_FAILURE() << "no UsageError for 'nt'";
  } catch (const nodal::UsageError& e) {
    EXPECT_STREQ(e.what(), "NODAL_STAGING_STORES='nt': use auto, cached or streaming");
  }
  if (saved) ::setenv(name, before.c_str(), 1); else ::unsetenv(name);
}

}  // namespace
