// Copies for the collectives' data paths. Internal.
#pragma once

#include <cstddef>

namespace nodal::detail {

/// Messages from this size on (bytes per rank) write their outputs with streaming (non-temporal)
/// stores: DESIGN.md measured +20-40 % at >= 16 MiB, and 2-5x slower at <= 1 MiB, where the
/// output still fits the caches and the caller reads it next.
constexpr std::size_t kStreamMinBytes = 16u << 20;

/// memcpy, with non-temporal stores when `stream` (ordered before the caller's next release
/// store by an sfence). Nothing happens when dst == src (in-place calls).
void copy_bytes(void* dst, const void* src, std::size_t n, bool stream = false);

}  // namespace nodal::detail
