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
// stores in the first. So each consumer picks per call, from what its own calls measured, and asks
// its producers for those stores in its call header (CallHeader::staging): the epsilon-greedy rule
// of the two-armed bandit (Sutton & Barto, Reinforcement Learning, 2nd ed., section 2.2), per size
// class of the call's blocks. It takes the mode whose recent calls took less time per byte, and the
// other one for kExploreCalls calls in every kExploreEvery, so that a change of state shows within
// kExploreEvery calls. The consumer decides because its copies are what the stores change: a
// producer that only produces (gather's peers, broadcast's root) returns before they are done.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace nodal::detail {

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
  /// Once both modes are known, kExploreCalls calls in every kExploreEvery take the mode not
  /// chosen. Two, since the first call in a mode after calls in the other is not that mode's steady
  /// state (after streaming, the ring's lines are in memory and the first cached call fetches them
  /// all); the estimate (the least of the last calls, below) then takes the second. On 2 ranks in
  /// the fast state, where streaming takes 1.8x as long, exploring costs about (0.8 x 2) / 128 =
  /// 1.3 % of a call's time; a change of state shows within 128 calls (6 ms at 512 KiB).
  static constexpr std::uint32_t kExploreEvery = 128;
  static constexpr std::uint32_t kExploreCalls = 2;

  explicit StagingStores(StagingSetting setting) : setting_(setting) {}

  /// The stores this rank, as a consumer, asks its producers for in a call whose blocks are
  /// `block_bytes` each (CallHeader::staging).
  StagingMode choose(std::size_t block_bytes);
  /// What that call took this rank with `mode` asked for: from its start on the pipelined copy
  /// path to its end, ns. Under `auto` only; the others ignore it.
  void record(std::size_t block_bytes, StagingMode mode, std::uint64_t took_ns);

 private:
  /// A mode's estimate is the least time per byte of its last kKept calls. One call slowed by an
  /// interrupt or a preemption does not make the mode look slow (an average would switch to the
  /// other mode, and keep it until the next exploration); one fast call of the mode not chosen,
  /// when the machine has changed, makes it look fast at once. A mode chosen on a stale fast
  /// estimate that is not fast any more loses it within kKept calls.
  static constexpr std::uint32_t kKept = 4;
  struct SizeClass {
    double recent[2][kKept] = {};       ///< by StagingMode: ns per byte of its last calls
    std::uint64_t written[2] = {0, 0};  ///< calls written into `recent` so far; 0: no estimate yet
    std::uint32_t calls = 0;            ///< calls chosen once both modes are known
    double estimate(std::size_t mode) const;
  };
  static std::size_t class_of(std::size_t block_bytes);

  StagingSetting setting_;
  std::array<SizeClass, 64> classes_{};  ///< by the bit width of block_bytes
};

}  // namespace nodal::detail
