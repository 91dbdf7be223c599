// The part of the floating-point mode a reduction's bits depend on beyond IEEE 754's defaults:
// whether the CPU flushes denormal results to zero and treats denormal inputs as zero (x86's
// MXCSR FTZ, bit 15, and DAZ, bit 6: what torch.set_flush_denormal(True) and the start-up code of
// -ffast-math programs set). The mode is per thread. Internal: the agents fold a reduction's steps
// across nodes in the mode of the ranks that posted them (node_bridge.hpp, folded_step.cpp), as
// the ranks themselves would on one node.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace nodal::detail {

/// MXCSR's FTZ | DAZ bits.
inline constexpr std::uint32_t kDenormalBits = 0x8040;

/// This thread's FTZ and DAZ bits of MXCSR. 0 on CPUs other than x86 (their modes are not
/// carried: there, a folded step is computed in the agent's default mode).
inline std::uint32_t denormal_mode() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  return _mm_getcsr() & kDenormalBits;
#else
  return 0;
#endif
}

/// Sets this thread's FTZ and DAZ bits to those of `mode` (a denormal_mode() value) while it
/// lives; restores the thread's own after.
class DenormalModeScope {
 public:
  explicit DenormalModeScope(std::uint32_t mode) noexcept {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr();
    _mm_setcsr((saved_ & ~kDenormalBits) | (mode & kDenormalBits));
#else
    (void)mode;
#endif
  }
  ~DenormalModeScope() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(saved_);
#endif
  }
  DenormalModeScope(const DenormalModeScope&) = delete;
  DenormalModeScope& operator=(const DenormalModeScope&) = delete;

 private:
  std::uint32_t saved_ = 0;
};

}  // namespace nodal::detail
