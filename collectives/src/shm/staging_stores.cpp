#include "shm/staging_stores.hpp"

#include "comm_state.hpp"  // CollKind

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>

#include <algorithm>
#include <bit>
#include <string>

#include <fmt/format.h>

namespace nodal::detail {

StagingSetting staging_setting_from_env() {
  const std::string value = getenv_or_empty("NODAL_STAGING_STORES");
  if (value.empty() || value == "auto") return StagingSetting::automatic;
  if (value == "cached") return StagingSetting::cached;
  if (value == "streaming") return StagingSetting::streaming;
  throw UsageError(fmt::format("NODAL_STAGING_STORES='{}': use auto, cached or streaming", value));
}

static_assert(static_cast<std::size_t>(CollKind::reduce_scatterv) < 16, "kKinds covers every CollKind");
static_assert(std::bit_width(StagingStores::kAdaptiveMinBytes) == 17 && std::bit_width(StagingStores::kAdaptiveEndBytes - 1) == 23,
              "kWidths covers the adaptive range");

StagingStores::SizeClass* StagingStores::find(std::array<SizeClass, kKinds * kWidths>& classes, CollKind kind,
                                              std::size_t block_bytes) {
  const auto k = static_cast<std::size_t>(kind);
  if (k >= kKinds || !adaptive(block_bytes)) return nullptr;
  return &classes[k * kWidths + static_cast<std::size_t>(std::bit_width(block_bytes)) - 17];
}

double StagingStores::SizeClass::estimate(std::size_t mode) const {
  double best = recent[mode][0];
  for (std::uint64_t i = 1; i < std::min<std::uint64_t>(written[mode], kKept); ++i) best = std::min(best, recent[mode][i]);
  return best;
}

StagingMode StagingStores::choose(CollKind kind, std::size_t block_bytes) {
  if (setting_ == StagingSetting::cached) return StagingMode::cached;
  if (setting_ == StagingSetting::streaming) return StagingMode::streaming;
  const SizeClass* c = find(classes_, kind, block_bytes);
  if (c == nullptr) return StagingMode::cached;
  // Each mode kExploreCalls times first, cached before streaming: the first call of a size may
  // fault its pages in, and the first in a mode after the other is not its steady state.
  if (c->written[0] < kExploreCalls) return StagingMode::cached;
  if (c->written[1] < kExploreCalls) return StagingMode::streaming;
  const auto best = c->estimate(1) < c->estimate(0) ? StagingMode::streaming : StagingMode::cached;
  const auto other = best == StagingMode::cached ? StagingMode::streaming : StagingMode::cached;
  // The cycle counts calls that came as this rank asked (record()): a call that was not staged
  // (cma, in place) measured nothing, and one overruled by another reader did not try this rank's
  // choice; neither may use up an exploring turn.
  const std::uint64_t turn = c->as_asked % kExploreEvery;
  return turn >= kExploreEvery - kExploreCalls ? other : best;
}

void StagingStores::record(CollKind kind, std::size_t block_bytes, StagingMode mode, StagingMode asked,
                           std::uint64_t took_ns) {
  if (setting_ != StagingSetting::automatic) return;
  SizeClass* c = find(classes_, kind, block_bytes);
  if (c == nullptr) return;
  const auto m = static_cast<std::size_t>(mode);
  c->recent[m][c->written[m]++ % kKept] = static_cast<double>(took_ns) / static_cast<double>(block_bytes);
  if (mode == asked) ++c->as_asked;
}

}  // namespace nodal::detail
