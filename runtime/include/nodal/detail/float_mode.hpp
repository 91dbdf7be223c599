// The parts of a thread's floating-point mode a reduction's bits depend on beyond IEEE 754's
// defaults, on x86 (MXCSR): whether denormal results are flushed to zero (FTZ, bit 15) and
// denormal inputs treated as zero (DAZ, bit 6), which torch.set_flush_denormal(True) and the
// start-up code of -ffast-math programs set, and the rounding direction (RC, bits 13-14: what
// std::fesetround sets for SSE arithmetic). Internal: the agents fold a reduction's steps across
// nodes in the mode of the ranks that posted them (node_bridge.hpp, folded_step.cpp), as the
// ranks themselves would on one node. (Of a non-blocking call, the mode of the thread that
// progresses it, as on one node.)
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace nodal::detail {

/// MXCSR's FTZ | RC | DAZ bits.
inline constexpr std::uint32_t kFloatModeBits = 0xE040;

/// This thread's FTZ, RC and DAZ bits of MXCSR. 0 on CPUs other than x86: their modes (e.g.
/// AArch64's FPCR) are not carried, and a folded step is computed in the agent's default mode.
inline std::uint32_t float_mode() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  return _mm_getcsr() & kFloatModeBits;
#else
  return 0;
#endif
}

/// Sets this thread's FTZ, RC and DAZ bits to those of `mode` (a float_mode() value) while it
/// lives; restores the thread's own after.
class FloatModeScope {
 public:
  explicit FloatModeScope(std::uint32_t mode) noexcept {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr();
    _mm_setcsr((saved_ & ~kFloatModeBits) | (mode & kFloatModeBits));
#else
    (void)mode;
#endif
  }
  ~FloatModeScope() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(saved_);
#endif
  }
  FloatModeScope(const FloatModeScope&) = delete;
  FloatModeScope& operator=(const FloatModeScope&) = delete;

 private:
  std::uint32_t saved_ = 0;
};

}  // namespace nodal::detail
