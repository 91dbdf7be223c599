// f16 and bf16 <-> f32 conversions in integer arithmetic, for host and device code alike: the
// CPU reductions (reduce_kernels.cpp, bf16), the CUDA IPC kernels (cuda/reduce_kernels.cu, bf16)
// and the NCCL backend's staging kernels and their unit test (nccl/, both types) share them, so
// every path rounds and carries NaNs the same way: to nearest even, NaNs quiet with the top of
// their payload, as x86 converts them. Internal.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define NODAL_HD __host__ __device__ inline
#else
#define NODAL_HD inline
#endif

namespace nodal::detail::convert {

NODAL_HD float bits_to_f32(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

NODAL_HD std::uint32_t f32_to_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

NODAL_HD float bf16_to_f32(std::uint16_t bits) { return bits_to_f32(static_cast<std::uint32_t>(bits) << 16); }

/// Round to nearest even; a NaN stays a quiet NaN with its top payload bits (reduce_kernels.cpp's rule).
NODAL_HD std::uint16_t f32_to_bf16(float value) {
  std::uint32_t bits = f32_to_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

/// IEEE binary16 -> binary32, exact, in integer arithmetic (no half type needed on either side).
NODAL_HD float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) {  // inf; a NaN keeps its payload and becomes quiet, as x86 converts it
    return bits_to_f32(sign | 0x7f800000u | (mantissa != 0 ? 0x400000u : 0u) | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_f32(sign);  // +-0
    // Subnormal: normalise.
    exponent = 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
  }
  return bits_to_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// IEEE binary32 -> binary16, round to nearest even (what GCC's _Float16 conversion does);
/// a NaN stays a quiet NaN with its top payload bits.
NODAL_HD std::uint16_t f32_to_f16(float value) {
  const std::uint32_t bits = f32_to_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t exponent = (bits >> 23) & 0xffu;
  std::uint32_t mantissa = bits & 0x7fffffu;
  if (exponent == 0xffu) {
    if (mantissa == 0) return static_cast<std::uint16_t>(sign | 0x7c00u);
    return static_cast<std::uint16_t>(sign | 0x7e00u | (mantissa >> 13));
  }
  const int e = static_cast<int>(exponent) - 127 + 15;  // binary16 biased exponent
  if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {
    // Subnormal or zero in binary16: shift the full significand (implicit bit included) right.
    if (e < -10) return sign;  // below half the smallest subnormal: +-0
    mantissa |= 0x800000u;
    const unsigned shift = static_cast<unsigned>(14 - e);
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (static_cast<std::uint32_t>(e) << 10) | (mantissa >> 13);
  const std::uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into inf: correct
  return static_cast<std::uint16_t>(sign | half);
}

}  // namespace nodal::detail::convert
