// The element arithmetic of the NCCL backend's staged reductions (nccl_plan.hpp): widening a
// dtype to the type NCCL reduces, and narrowing the reduced value back, exactly as the CPU path's
// reduce_kernels.cpp does (64-bit wrap-around integers, integer avg divided toward zero, f16/bf16
// accumulated in f32 and rounded once to nearest even). Host and device code both include it: the
// kernels (nccl_kernels.cu) run these functions, and the unit test runs the very same ones on the
// host against the CPU reference. Internal.
#pragma once

#include "element_convert.hpp"

#include <cstdint>

namespace nodal::detail::nccl {

using convert::bf16_to_f32;
using convert::bits_to_f32;
using convert::f16_to_f32;
using convert::f32_to_bf16;
using convert::f32_to_bits;
using convert::f32_to_f16;

/// Integer avg's last step: the wrapped 64-bit sum read as signed, divided by n toward zero,
/// truncated to T (T's own wrap-around). Plain sums and products pass divisor 1.
template <class T>
NODAL_HD T narrow_integer(std::uint64_t wide, std::int64_t divisor) {
  const std::int64_t value = divisor == 1 ? static_cast<std::int64_t>(wide) : static_cast<std::int64_t>(wide) / divisor;
  return static_cast<T>(static_cast<std::uint64_t>(value));
}

/// Sign- or zero-extension to 64 bits, as the CPU path's accumulator loads (static_cast).
template <class T>
NODAL_HD std::uint64_t widen_integer(T value) {
  return static_cast<std::uint64_t>(value);
}

}  // namespace nodal::detail::nccl
