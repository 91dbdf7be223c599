// How a producer of the pipelined copy path (shm/pipelined_copy.cpp) writes the slices it stages
// into its ring entries: with ordinary (cached) stores or with streaming (non-temporal) ones.
// Internal.
//
// Neither wins everywhere, and which one wins changes while a job runs
// (bench/results/2026-11-29-far-state-pipelined-copy.md). On this 2-vCPU VM a cache line passes
// between the vCPUs in ~0.05 us for seconds to minutes, then in ~0.2 us for a while
// (bench/core-latency). With cached stores the consumers copy lines that are dirty in the
// producer's cache: alltoall of 512 KiB on 2 ranks took 49 us in the first state and 345 us in the
// second, where every such line crosses between dies while both ranks copy at once. Streaming
// stores send the slices to memory: 83 us in the second state, but 1.3-2.1x slower than cached
// stores in the first. So each reader (consumer) picks per call, from what its own calls measured,
// and asks its producers for those stores in its call header (CallHeader::staging); a slice that
// several ranks read is streamed if any of them asks. The rule is the epsilon-greedy one of the
// two-armed bandit (Sutton & Barto, Reinforcement Learning, 2nd ed., section 2.2), per collective
// and size class of the call's blocks: the mode whose recent calls took less time per byte, and the
// other one for kExploreCalls calls in every kExploreEvery recorded, so that a change of state shows
// within kExploreEvery recorded calls. The reader decides because its copies are what the stores
// change: a rank that only produces (gather's peers, broadcast's root) returns before they are done.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace nodal::detail {

enum class CollKind : std::uint8_t;  // comm_state.hpp

/// The stores a producer stages with.
enum class StagingMode : std::uint8_t { cached = 0, streaming = 1 };

/// NODAL_STAGING_STORES: `auto` (the default: chosen per call, as above), `cached` or `streaming`
/// (every staged call).
enum class StagingSetting : std::uint8_t { automatic, cached, streaming };

/// Reads NODAL_STAGING_STORES (comm_config() does, once per process, before a rank's first call).
/// Throws UsageError naming the variable and the values allowed for any other value.
StagingSetting staging_setting_from_env();

/// One communicator's choices on one rank (CommState::staging_stores). Not thread-safe: a
/// communicator's calls run one at a time (on the caller's thread or its progress thread).
class StagingStores {
 public:
  /// Under `auto`, blocks (bytes a producer sends to one consumer in the call) in
  /// [kAdaptiveMinBytes, kAdaptiveEndBytes) are chosen for; others stay cached. The collapse was
  /// seen at 512 KiB-4 MiB (2-7x; bench/results/2026-11-29-adaptive-staging-stores.md); from
  /// 8 MiB it has not been measured.
  static constexpr std::size_t kAdaptiveMinBytes = 64u << 10;
  static constexpr std::size_t kAdaptiveEndBytes = 8u << 20;
  static constexpr bool adaptive(std::size_t block_bytes) {
    return block_bytes >= kAdaptiveMinBytes && block_bytes < kAdaptiveEndBytes;
  }
  /// Once both modes are known, kExploreCalls calls in every kExploreEvery that came as asked take
  /// the mode not chosen. Two, since the first call in a mode after calls in the other is not that
  /// mode's steady state (after streaming, the ring's lines are in memory and the first cached call
  /// fetches them all); the estimate (the least of the last calls, below) then takes the second.
  /// The cycle counts only calls that came as this rank asked. A slice several ranks read is
  /// streamed if any of them asks: counted otherwise, a reader whose every call is overruled by
  /// another's streaming would let its exploring turns pass unmeasured, and readers that all
  /// prefer streaming would never measure cached stores again. This way a reader's turn waits
  /// until its call comes as asked (e.g. once the others' turns ask for cached stores too).
  /// Exploring costs 2 calls in 128 in the other mode (1.3% where that mode takes 1.8x as long);
  /// in the results file's near-state runs auto ran at 0.89-1.05x of cached stores' speed.
  static constexpr std::uint32_t kExploreEvery = 128;
  static constexpr std::uint32_t kExploreCalls = 2;

  explicit StagingStores(StagingSetting setting) : setting_(setting) {}

  /// The stores this rank, as a reader of `kind`'s staged slices, asks its producers for in a call
  /// whose blocks are `block_bytes` each (CallHeader::staging).
  StagingMode choose(CollKind kind, std::size_t block_bytes);
  /// What such a call took this rank, every slice it read staged with `mode`: from its start on
  /// the pipelined copy path to its end, ns. `asked`: what this rank asked for; where another
  /// reader of a shared slice asked for streaming, `mode` is streaming whatever it asked. Only a
  /// call that came as asked moves this rank's exploring turns on: a rank whose exploring call was
  /// overruled asks again at its next call, until every reader's turn has come and its call comes
  /// as asked. Under `auto` only; the others ignore it.
  void record(CollKind kind, std::size_t block_bytes, StagingMode mode, StagingMode asked, std::uint64_t took_ns);

 private:
  /// A mode's estimate is the least time per byte of its last kKept calls. One call slowed by an
  /// interrupt or a preemption does not make the mode look slow (an average would switch to the
  /// other mode, and keep it until the next exploration); one fast call of the mode not chosen,
  /// when the machine has changed, makes it look fast at once. A mode chosen on a stale fast
  /// estimate that is not fast any more loses it within kKept recorded calls in that mode.
  static constexpr std::uint32_t kKept = 4;
  struct SizeClass {
    double recent[2][kKept] = {};       ///< by StagingMode: ns per byte of its last calls
    std::uint64_t written[2] = {0, 0};  ///< calls written into `recent` so far; 0: no estimate yet
    std::uint64_t as_asked = 0;         ///< calls recorded that came as this rank asked: its clock
    double estimate(std::size_t mode) const;
  };
  /// Kinds (CollKind's values are below 16) x block sizes of the adaptive range (bit widths 17-23).
  static constexpr std::size_t kKinds = 16, kWidths = 7;
  static SizeClass* find(std::array<SizeClass, kKinds * kWidths>& classes, CollKind kind, std::size_t block_bytes);

  StagingSetting setting_;
  std::array<SizeClass, kKinds * kWidths> classes_{};
};

}  // namespace nodal::detail
