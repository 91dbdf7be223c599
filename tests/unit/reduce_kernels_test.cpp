// The reduce kernels of every instruction set give the same bits: collectives/src/reduce_kernels.cpp
// built for the baseline and (x86-64) for AVX2, each fold called directly, for every (dtype, op)
// nodal defines, 1, 2, 3 and 5 sources (2: the one-pass branch), lengths around the small path's
// element-by-element limit (8) and the tile (1024), with special values (NaN, infinities, signed
// zeros, subnormals, integer extremes), out of place, in place (out is a source) and with
// streaming stores. Every element is compared bit for bit, but for NaNs: a fold of NaNs with
// different signs or payloads may keep either (the compiler may commute an operation's operands),
// so there both results need only be NaN. The collectives tests check both against a scalar reference through the
// library (Collectives.ReduceKernelsOfEveryInstructionSetGiveTheReferenceBits); this one reaches
// the branches a given world size does not.
#include "reduce_kernels.hpp"

#include <nodal/errors.hpp>

#include <gtest/gtest.h>

#include <cstdlib>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using nodal::DType;
using nodal::ReduceOp;
namespace detail = nodal::detail;

constexpr std::array<DType, 9> kDtypes = {DType::bool_, DType::u8,   DType::i8,  DType::i32, DType::i64,
                                          DType::f16,   DType::bf16, DType::f32, DType::f64};
constexpr std::array<ReduceOp, 5> kOps = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

/// Random bytes with special values sprinkled in (every 7th element), valid for `dtype`.
std::vector<std::byte> make_input(DType dtype, std::size_t count, std::mt19937_64& rng) {
  const std::size_t esize = nodal::element_size(dtype);
  std::vector<std::byte> data(count * esize);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  for (std::size_t k = 0; k < count; k += 7) {
    std::byte* at = data.data() + k * esize;
    const unsigned pick = static_cast<unsigned>(rng() % 6);
    switch (dtype) {
      case DType::f32: {
        const float v[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -0.0f, 0.0f, std::numeric_limits<float>::denorm_min(), -1.5f};
        std::memcpy(at, &v[pick], sizeof(float));
        break;
      }
      case DType::f64: {
        const double v[] = {std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::infinity(),
                            -0.0, 0.0, std::numeric_limits<double>::denorm_min(), 3.25};
        std::memcpy(at, &v[pick], sizeof(double));
        break;
      }
      case DType::f16:
      case DType::bf16: {
        // NaN, +inf, -0, +0, the smallest subnormal, 1.0 (bf16: 0x3f80, f16: 0x3c00).
        const std::uint16_t f16[] = {0x7e00, 0x7c00, 0x8000, 0x0000, 0x0001, 0x3c00};
        const std::uint16_t bf16[] = {0x7fc0, 0x7f80, 0x8000, 0x0000, 0x0001, 0x3f80};
        std::memcpy(at, dtype == DType::f16 ? &f16[pick] : &bf16[pick], 2);
        break;
      }
      case DType::bool_: *at = static_cast<std::byte>(pick % 2); break;
      default: {
        // The type's extremes (all ones, the sign bit alone) and small values.
        std::memset(at, pick < 2 ? 0xff : 0, esize);
        if (pick == 1) at[esize - 1] = std::byte{0x80};
        if (pick >= 4) at[0] = static_cast<std::byte>(pick);
        break;
      }
    }
  }
  if (dtype == DType::bool_) {
    for (auto& b : data) b = static_cast<std::byte>(static_cast<unsigned>(b) & 1u);
  }
  return data;
}

/// Whether element k of `a` and `b` (dtype) is the same: the same bits, or both NaN. Which NaN a
/// fold of two NaN inputs keeps (its sign and payload) is the hardware's choice of operand
/// order, which the compiler may commute: IEEE 754 leaves it open, and so does nodal.
bool same_element(DType dtype, const std::byte* a, const std::byte* b) {
  const std::size_t esize = nodal::element_size(dtype);
  if (std::memcmp(a, b, esize) == 0) return true;
  auto is_nan = [&](const std::byte* p) {
    switch (dtype) {
      case DType::f32: { float v; std::memcpy(&v, p, 4); return v != v; }
      case DType::f64: { double v; std::memcpy(&v, p, 8); return v != v; }
      case DType::f16: { std::uint16_t v; std::memcpy(&v, p, 2); return (v & 0x7c00u) == 0x7c00u && (v & 0x03ffu) != 0; }
      case DType::bf16: { std::uint16_t v; std::memcpy(&v, p, 2); return (v & 0x7f80u) == 0x7f80u && (v & 0x007fu) != 0; }
      default: return false;
    }
  };
  return is_nan(a) && is_nan(b);
}

/// The first element where `a` and `b` differ (same_element), or -1.
long first_difference(DType dtype, const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  const std::size_t esize = nodal::element_size(dtype);
  for (std::size_t k = 0; k * esize < a.size(); ++k) {
    if (!same_element(dtype, a.data() + k * esize, b.data() + k * esize)) return static_cast<long>(k);
  }
  return -1;
}

bool cpu_has_avx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

TEST(ReduceKernels, Avx2GivesTheBaselinesBitsForEveryPairAndShape) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the AVX2 build exists on x86-64 only";
#else
  if (!cpu_has_avx2()) GTEST_SKIP() << "this CPU has no AVX2: reduce_n takes the baseline, the only set it can run";
  EXPECT_STREQ(detail::reduce_isa(), "avx2");  // what reduce_n picks here (NODAL_REDUCE_ISA unset)
  std::mt19937_64 rng(42);
  int compared = 0;
  for (DType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      detail::ReduceKernel base = detail::baseline::kernel_for(dtype, op);
      detail::ReduceKernel avx2 = detail::avx2::kernel_for(dtype, op);
      ASSERT_EQ(base == nullptr, avx2 == nullptr);
      ASSERT_EQ(base != nullptr, detail::reduce_op_defined(op, dtype));
      if (base == nullptr) continue;
      for (int n : {1, 2, 3, 5}) {
        for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{31},
                                  std::size_t{1023}, std::size_t{1024}, std::size_t{1025}, std::size_t{4099}}) {
          const std::string what = std::string(nodal::reduce_op_name(op)) + " of " +
                                   std::string(nodal::dtype_name(dtype)) + ", " + std::to_string(n) +
                                   " sources, " + std::to_string(count) + " elements";
          std::vector<std::vector<std::byte>> inputs;
          std::vector<const void*> srcs;
          for (int j = 0; j < n; ++j) inputs.push_back(make_input(dtype, count, rng));
          for (const auto& in : inputs) srcs.push_back(in.data());
          const std::size_t bytes = inputs[0].size();
          for (bool stream : {false, true}) {
            std::vector<std::byte> a(bytes), b(bytes);
            base(a.data(), srcs.data(), n, count, stream);
            avx2(b.data(), srcs.data(), n, count, stream);
            ASSERT_EQ(-1, first_difference(dtype, a, b)) << what << (stream ? ", streaming" : "");
            ++compared;
          }
          // In place: the output is the last source (the peer's part read into the output, as
          // cma's 2-rank fold does), then the first (the root's in-place input).
          for (int alias : {n - 1, 0}) {
            std::vector<std::byte> a = inputs[static_cast<std::size_t>(alias)];
            std::vector<std::byte> b = a;
            std::vector<const void*> sa = srcs, sb = srcs;
            sa[static_cast<std::size_t>(alias)] = a.data();
            sb[static_cast<std::size_t>(alias)] = b.data();
            std::vector<std::byte> expect(bytes);
            base(expect.data(), srcs.data(), n, count, false);
            base(a.data(), sa.data(), n, count, false);
            avx2(b.data(), sb.data(), n, count, false);
            ASSERT_EQ(-1, first_difference(dtype, expect, a)) << what << ", baseline in place on " << alias;
            ASSERT_EQ(-1, first_difference(dtype, expect, b)) << what << ", avx2 in place on " << alias;
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 44 * 4 * 9 * 4);  // 44 defined pairs (avg of bool is not), 4 source counts, 9 lengths, 4 cases
#endif
}

TEST(ReduceKernels, ABadSettingIsRefusedByName) {
  ::setenv("NODAL_REDUCE_ISA", "sse9", 1);
  try {
    detail::check_reduce_isa_setting();
    ADD_FAILURE() << "NODAL_REDUCE_ISA=sse9 was accepted";
  } catch (const nodal::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("NODAL_REDUCE_ISA='sse9': use auto, avx2 or baseline"), std::string::npos)
        << e.what();
  }
  for (const char* good : {"auto", "avx2", "baseline", ""}) {
    ::setenv("NODAL_REDUCE_ISA", good, 1);
    EXPECT_NO_THROW(detail::check_reduce_isa_setting()) << good;
  }
  ::unsetenv("NODAL_REDUCE_ISA");
}

}  // namespace
