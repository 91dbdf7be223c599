// The reductions: one fold per (dtype, op), the same C++ for every instruction set. Built with
// -O3 (collectives/CMakeLists.txt) so that GCC vectorises the inner loops over a tile, once for
// the baseline and, on x86-64, once more for AVX2 (reduce_kernels_avx2.cpp includes this file
// with NODAL_REDUCE_ISA=avx2 and NODAL_REDUCE_TARGET the target("avx2") attribute). Only the
// folds (internal to this file) carry the attribute, not the whole file: an inline function of a
// header compiled for AVX2 could be the copy the linker keeps for the baseline's callers too.
// reduce_dispatch.cpp picks one at run time. Every operation is elementwise IEEE arithmetic,
// never contracted (-ffp-contract=off), so both give the same bits; only where two inputs of one
// element are NaNs of different sign or payload may they keep different NaNs (the compiler may
// commute an operation's operands, and the hardware keeps the first operand's NaN).
// bench/nodal-bench measures them against memcpy.
#include "reduce_kernels.hpp"

#include "copy.hpp"
#include "element_convert.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifndef NODAL_REDUCE_ISA
#define NODAL_REDUCE_ISA baseline
#define NODAL_REDUCE_TARGET
#endif

namespace nodal::detail {
namespace {

/// Elements per tile: the accumulator stays in L1 while the n sources stream through.
constexpr std::size_t kTile = 1024;
/// Up to this many elements a fold goes element by element (fold_one).
constexpr std::size_t kScalarMax = 8;

// ---- Storage <-> accumulation conversions. ----

inline float f16_to_f32(std::uint16_t bits) {
  _Float16 half;
  std::memcpy(&half, &bits, sizeof half);
  return static_cast<float>(half);
}

inline std::uint16_t f32_to_f16(float value) {
  _Float16 half = static_cast<_Float16>(value);  // IEEE round to nearest even
  std::uint16_t bits;
  std::memcpy(&bits, &half, sizeof bits);
  return bits;
}

/// How a storage type T is read into and written from its accumulation type A.
template <class T, class A>
struct Plain {
  using Storage = T;
  using Acc = A;
  static A load(T x) { return static_cast<A>(x); }
  static T store(A x) { return static_cast<T>(x); }
};
struct Bf16 {
  using Storage = std::uint16_t;
  using Acc = float;
  static float load(std::uint16_t x) { return convert::bf16_to_f32(x); }
  static std::uint16_t store(float x) { return convert::f32_to_bf16(x); }
};
struct F16 {
  using Storage = std::uint16_t;
  using Acc = float;
  static float load(std::uint16_t x) { return f16_to_f32(x); }
  static std::uint16_t store(float x) { return f32_to_f16(x); }
};

// ---- Operators on the accumulation type. ----

struct Sum {
  template <class A>
  static A apply(A a, A b) { return a + b; }
};
struct Prod {
  template <class A>
  static A apply(A a, A b) { return a * b; }
};
struct Min {
  template <class A>
  static A apply(A a, A b) { return b < a ? b : a; }
};
struct Max {
  template <class A>
  static A apply(A a, A b) { return a < b ? b : a; }
};
struct Or {
  template <class A>
  static A apply(A a, A b) { return static_cast<A>(a | b); }
};
struct And {
  template <class A>
  static A apply(A a, A b) { return static_cast<A>(a & b); }
};

/// avg's last step on one accumulated sum of n values. Integers: the 64-bit sum divided by n,
/// toward zero.
template <class A>
A average(A sum, int n) {
  if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(static_cast<std::int64_t>(sum) / n);
  } else {
    return sum / static_cast<A>(n);
  }
}

/// One element of the result, the sources folded in order (what a tile does per element).
template <class Conv, class Op, bool kAverage>
NODAL_REDUCE_TARGET typename Conv::Storage fold_one(const void* const* srcs_raw, int n, std::size_t k) {
  using T = typename Conv::Storage;
  using A = typename Conv::Acc;
  A acc = Conv::load(static_cast<const T*>(srcs_raw[0])[k]);
  for (int j = 1; j < n; ++j) acc = Op::apply(acc, Conv::load(static_cast<const T*>(srcs_raw[j])[k]));
  if constexpr (kAverage) acc = average(acc, n);
  return Conv::store(acc);
}

/// The fold tile by tile (fold's work beyond a few elements): out of line, so that a small fold
/// does not pay for its stack frame and saved registers.
template <class Conv, class Op, bool kAverage>
NODAL_REDUCE_TARGET [[gnu::noinline]] void fold_tiles(typename Conv::Storage* out, const void* const* srcs_raw, int n, std::size_t count,
                                  bool stream) {
  using T = typename Conv::Storage;
  using A = typename Conv::Acc;
  for (std::size_t base = 0; base < count; base += kTile) {
    const std::size_t len = std::min(kTile, count - base);
    T* dst = out + base;
    auto src = [&](int j) { return static_cast<const T*>(srcs_raw[j]) + base; };
    if (n == 2 && !kAverage && !stream) {
      // Two sources (every reduction on 2 ranks, the last step of a chain): one pass, no tile.
      const T* a = src(0);
      const T* b = src(1);
      for (std::size_t k = 0; k < len; ++k) dst[k] = Conv::store(Op::apply(Conv::load(a[k]), Conv::load(b[k])));
      continue;
    }
    A acc[kTile];
    if (n >= 2) {
      // The first two sources in one pass, the same operations as loading the first and folding
      // in the second.
      const T* a = src(0);
      const T* b = src(1);
      for (std::size_t k = 0; k < len; ++k) acc[k] = Op::apply(Conv::load(a[k]), Conv::load(b[k]));
    } else {
      const T* a = src(0);
      for (std::size_t k = 0; k < len; ++k) acc[k] = Conv::load(a[k]);
    }
    for (int j = 2; j < n; ++j) {
      const T* s = src(j);
      for (std::size_t k = 0; k < len; ++k) acc[k] = Op::apply(acc[k], Conv::load(s[k]));
    }
    if constexpr (kAverage) {
      for (std::size_t k = 0; k < len; ++k) acc[k] = average(acc[k], n);
    }
    if (stream) {
      T tile[kTile];
      for (std::size_t k = 0; k < len; ++k) tile[k] = Conv::store(acc[k]);
      copy_bytes(dst, tile, len * sizeof(T), true);
    } else {
      for (std::size_t k = 0; k < len; ++k) dst[k] = Conv::store(acc[k]);
    }
  }
}

template <class Conv, class Op, bool kAverage>
NODAL_REDUCE_TARGET void fold(void* out_raw, const void* const* srcs_raw, int n, std::size_t count, bool stream) {
  auto* out = static_cast<typename Conv::Storage*>(out_raw);
  if (count <= kScalarMax && !stream) {
    // A few elements (the small path's messages): element by element, the same operations in the
    // same order as a tile, without a tile's set-up (most of a 4-byte call's reduction).
    for (std::size_t k = 0; k < count; ++k) out[k] = fold_one<Conv, Op, kAverage>(srcs_raw, n, k);
    return;
  }
  fold_tiles<Conv, Op, kAverage>(out, srcs_raw, n, count, stream);
}

/// Integers: sum, prod and avg accumulate in 64 bits, wrapping (unsigned arithmetic, so no
/// undefined behaviour); truncating to T afterwards gives exactly T's own wrap-around. min and
/// max compare in T's own signedness.
template <class T>
ReduceKernel integer_kernel(ReduceOp op) {
  using Wide = Plain<T, std::uint64_t>;
  using Same = Plain<T, T>;
  switch (op) {
    case ReduceOp::sum: return fold<Wide, Sum, false>;
    case ReduceOp::prod: return fold<Wide, Prod, false>;
    case ReduceOp::min: return fold<Same, Min, false>;
    case ReduceOp::max: return fold<Same, Max, false>;
    case ReduceOp::avg: return fold<Wide, Sum, true>;  // the wrapped sum read as signed, / n
  }
  return nullptr;
}

template <class Conv>
ReduceKernel float_kernel(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return fold<Conv, Sum, false>;
    case ReduceOp::prod: return fold<Conv, Prod, false>;
    case ReduceOp::min: return fold<Conv, Min, false>;
    case ReduceOp::max: return fold<Conv, Max, false>;
    case ReduceOp::avg: return fold<Conv, Sum, true>;
  }
  return nullptr;
}

ReduceKernel bool_kernel(ReduceOp op) {
  using Conv = Plain<std::uint8_t, std::uint8_t>;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::max: return fold<Conv, Or, false>;
    case ReduceOp::prod:
    case ReduceOp::min: return fold<Conv, And, false>;
    case ReduceOp::avg: break;
  }
  return nullptr;
}

}  // namespace

namespace NODAL_REDUCE_ISA {

ReduceKernel kernel_for(DType dtype, ReduceOp op) noexcept {
  switch (dtype) {
    case DType::bool_: return bool_kernel(op);
    case DType::u8: return integer_kernel<std::uint8_t>(op);
    case DType::i8: return integer_kernel<std::int8_t>(op);
    case DType::i32: return integer_kernel<std::int32_t>(op);
    case DType::i64: return integer_kernel<std::int64_t>(op);
    case DType::f16: return float_kernel<F16>(op);
    case DType::bf16: return float_kernel<Bf16>(op);
    case DType::f32: return float_kernel<Plain<float, float>>(op);
    case DType::f64: return float_kernel<Plain<double, double>>(op);
  }
  return nullptr;
}

}  // namespace NODAL_REDUCE_ISA

}  // namespace nodal::detail
