// The NCCL backend's host-side decisions, checked without a GPU: how each (dtype, op) reaches
// NCCL (collectives/src/nccl/nccl_plan.hpp), and that the plan, with the element arithmetic the
// device kernels run (nccl_convert.hpp, compiled here for the host), gives bitwise the CPU path's
// result (reduce_n) when NCCL combines the wire values in rank order. What the GPU adds (NCCL's
// reduction order, the kernels' launch) is tests/gpu/nccl_test.cpp's.
#include "nccl/nccl_convert.hpp"
#include "nccl/nccl_plan.hpp"
#include "reduce_kernels.hpp"

#include <nodal/errors.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using nodal::DType;
using nodal::ReduceOp;
namespace nccl = nodal::detail::nccl;

constexpr std::array<DType, 9> kDtypes = {DType::bool_, DType::u8,   DType::i8,  DType::i32, DType::i64,
                                          DType::f16,   DType::bf16, DType::f32, DType::f64};
constexpr std::array<ReduceOp, 5> kOps = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

std::string label(DType dtype, ReduceOp op) {
  return std::string(nodal::reduce_op_name(op)) + " of " + std::string(nodal::dtype_name(dtype));
}

TEST(NcclPlan, EveryPairNodalDefinesHasAPlanAndOnlyThose) {
  for (DType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      const nccl::ReducePlan plan = nccl::plan_reduce(dtype, op);
      EXPECT_EQ(plan.defined, nodal::detail::reduce_op_defined(op, dtype)) << label(dtype, op);
      if (!plan.defined) continue;
      // ncclAvg is never used: its integer and float semantics are not nodal's.
      EXPECT_NE(plan.op, ncclAvg) << label(dtype, op);
      EXPECT_EQ(plan.divide, op == ReduceOp::avg) << label(dtype, op);
      if (plan.stage == nccl::Stage::direct) {
        EXPECT_EQ(nccl::wire_size(plan.wire), nodal::element_size(dtype)) << label(dtype, op);
      } else {
        EXPECT_EQ(nccl::wire_size(plan.wire), plan.stage == nccl::Stage::widen_u64 ? 8u : 4u) << label(dtype, op);
      }
    }
  }
}

TEST(NcclPlan, TheMappingTheBackendDocuments) {
  struct Row {
    DType dtype;
    ReduceOp op;
    nccl::Stage stage;
    ncclDataType_t wire;
    ncclRedOp_t nccl_op;
  };
  const Row rows[] = {
      // bool: or / and on 0/1 bytes.
      {DType::bool_, ReduceOp::sum, nccl::Stage::direct, ncclUint8, ncclMax},
      {DType::bool_, ReduceOp::max, nccl::Stage::direct, ncclUint8, ncclMax},
      {DType::bool_, ReduceOp::prod, nccl::Stage::direct, ncclUint8, ncclMin},
      {DType::bool_, ReduceOp::min, nccl::Stage::direct, ncclUint8, ncclMin},
      // Integer sum/prod: unsigned of the same width (the same bits, defined wrap-around).
      {DType::i8, ReduceOp::sum, nccl::Stage::direct, ncclUint8, ncclSum},
      {DType::i32, ReduceOp::prod, nccl::Stage::direct, ncclUint32, ncclProd},
      {DType::i64, ReduceOp::sum, nccl::Stage::direct, ncclUint64, ncclSum},
      {DType::u8, ReduceOp::sum, nccl::Stage::direct, ncclUint8, ncclSum},
      // min/max: the dtype's own signedness.
      {DType::i8, ReduceOp::min, nccl::Stage::direct, ncclInt8, ncclMin},
      {DType::u8, ReduceOp::max, nccl::Stage::direct, ncclUint8, ncclMax},
      {DType::i32, ReduceOp::max, nccl::Stage::direct, ncclInt32, ncclMax},
      {DType::i64, ReduceOp::min, nccl::Stage::direct, ncclInt64, ncclMin},
      // Integer avg: 64-bit sum, divided toward zero.
      {DType::u8, ReduceOp::avg, nccl::Stage::widen_u64, ncclUint64, ncclSum},
      {DType::i8, ReduceOp::avg, nccl::Stage::widen_u64, ncclUint64, ncclSum},
      {DType::i32, ReduceOp::avg, nccl::Stage::widen_u64, ncclUint64, ncclSum},
      {DType::i64, ReduceOp::avg, nccl::Stage::direct, ncclUint64, ncclSum},
      // f16/bf16: accumulate in f32 except the exact comparisons.
      {DType::f16, ReduceOp::sum, nccl::Stage::widen_f32, ncclFloat32, ncclSum},
      {DType::bf16, ReduceOp::prod, nccl::Stage::widen_f32, ncclFloat32, ncclProd},
      {DType::f16, ReduceOp::avg, nccl::Stage::widen_f32, ncclFloat32, ncclSum},
      {DType::bf16, ReduceOp::max, nccl::Stage::direct, ncclBfloat16, ncclMax},
      {DType::f16, ReduceOp::min, nccl::Stage::direct, ncclFloat16, ncclMin},
      // f32/f64: native; avg is a sum divided afterwards.
      {DType::f32, ReduceOp::sum, nccl::Stage::direct, ncclFloat32, ncclSum},
      {DType::f64, ReduceOp::prod, nccl::Stage::direct, ncclFloat64, ncclProd},
      {DType::f32, ReduceOp::avg, nccl::Stage::direct, ncclFloat32, ncclSum},
      {DType::f64, ReduceOp::avg, nccl::Stage::direct, ncclFloat64, ncclSum},
  };
  for (const Row& row : rows) {
    const nccl::ReducePlan plan = nccl::plan_reduce(row.dtype, row.op);
    EXPECT_TRUE(plan.defined) << label(row.dtype, row.op);
    EXPECT_EQ(plan.stage, row.stage) << label(row.dtype, row.op);
    EXPECT_EQ(plan.wire, row.wire) << label(row.dtype, row.op) << ": " << nccl::wire_name(plan.wire);
    EXPECT_EQ(plan.op, row.nccl_op) << label(row.dtype, row.op);
  }
  EXPECT_FALSE(nccl::plan_reduce(DType::bool_, ReduceOp::avg).defined);
}

// ---- The plan run on the host: NCCL emulated as a rank-order fold on the wire type. ----

template <class W>
W apply(ncclRedOp_t op, W a, W b) {
  switch (op) {
    case ncclSum: return static_cast<W>(a + b);
    case ncclProd: return static_cast<W>(a * b);
    case ncclMin: return b < a ? b : a;
    case ncclMax: return a < b ? b : a;
    default: ADD_FAILURE() << "op " << op; return a;
  }
}

template <class W>
std::vector<W> fold_wire(const std::vector<std::vector<W>>& inputs, ncclRedOp_t op) {
  std::vector<W> out = inputs[0];
  for (std::size_t r = 1; r < inputs.size(); ++r) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = apply(op, out[i], inputs[r][i]);
  }
  return out;
}

template <class W>
std::vector<W> as_wire(const std::vector<std::byte>& bytes) {
  std::vector<W> out(bytes.size() / sizeof(W));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(W));
  return out;
}

template <class W>
std::vector<std::byte> to_bytes(const std::vector<W>& values) {
  std::vector<std::byte> out(values.size() * sizeof(W));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// Direct plan: the NCCL reduction on the wire type, then the in-place division of divide_in_place.
std::vector<std::byte> run_direct(const nccl::ReducePlan& plan, DType dtype, const std::vector<std::vector<std::byte>>& in) {
  const int n = static_cast<int>(in.size());
  auto go = [&]<class W>(W) {
    std::vector<std::vector<W>> wire;
    for (const auto& b : in) wire.push_back(as_wire<W>(b));
    std::vector<W> out = fold_wire(wire, plan.op);
    if (plan.divide) {
      for (W& x : out) {
        if constexpr (std::is_floating_point_v<W>) {
          x = x / static_cast<W>(n);
        } else {
          EXPECT_EQ(dtype, DType::i64);
          x = nccl::narrow_integer<W>(static_cast<std::uint64_t>(x), n);
        }
      }
    }
    return to_bytes(out);
  };
  switch (plan.wire) {
    case ncclInt8: return go(std::int8_t{});
    case ncclUint8: return go(std::uint8_t{});
    case ncclInt32: return go(std::int32_t{});
    case ncclUint32: return go(std::uint32_t{});
    case ncclInt64: return go(std::int64_t{});
    case ncclUint64: return go(std::uint64_t{});
    case ncclFloat32: return go(float{});
    case ncclFloat64: return go(double{});
    case ncclFloat16:
    case ncclBfloat16: {
      // Comparisons only (min/max): compare as f32, keep the original bits.
      std::vector<std::vector<std::uint16_t>> wire;
      for (const auto& b : in) wire.push_back(as_wire<std::uint16_t>(b));
      auto to_f32 = [&](std::uint16_t h) {
        return plan.wire == ncclBfloat16 ? nccl::bf16_to_f32(h) : nccl::f16_to_f32(h);
      };
      std::vector<std::uint16_t> out = wire[0];
      for (std::size_t r = 1; r < wire.size(); ++r) {
        for (std::size_t i = 0; i < out.size(); ++i) {
          const float a = to_f32(out[i]), b = to_f32(wire[r][i]);
          const bool take_b = plan.op == ncclMin ? b < a : a < b;
          if (take_b) out[i] = wire[r][i];
        }
      }
      return to_bytes(out);
    }
    default: ADD_FAILURE() << "wire " << nccl::wire_name(plan.wire); return {};
  }
}

/// Staged plan: widen (nccl::widen's arithmetic), reduce on the wire type, narrow.
std::vector<std::byte> run_staged(const nccl::ReducePlan& plan, DType dtype, const std::vector<std::vector<std::byte>>& in) {
  const int n = static_cast<int>(in.size());
  const int divisor = plan.divide ? n : 1;
  if (plan.stage == nccl::Stage::widen_u64) {
    auto go = [&]<class T>(T) {
      std::vector<std::vector<std::uint64_t>> wide;
      for (const auto& b : in) {
        std::vector<std::uint64_t> w;
        for (T x : as_wire<T>(b)) w.push_back(nccl::widen_integer<T>(x));
        wide.push_back(std::move(w));
      }
      std::vector<std::uint64_t> sum = fold_wire(wide, plan.op);
      std::vector<T> out;
      for (std::uint64_t x : sum) out.push_back(nccl::narrow_integer<T>(x, divisor));
      return to_bytes(out);
    };
    switch (dtype) {
      case DType::u8: return go(std::uint8_t{});
      case DType::i8: return go(std::int8_t{});
      case DType::i32: return go(std::int32_t{});
      case DType::i64: return go(std::int64_t{});
      default: ADD_FAILURE() << "widen_u64 of " << nodal::dtype_name(dtype); return {};
    }
  }
  const bool bf16 = dtype == DType::bf16;
  std::vector<std::vector<float>> wide;
  for (const auto& b : in) {
    std::vector<float> w;
    for (std::uint16_t h : as_wire<std::uint16_t>(b)) w.push_back(bf16 ? nccl::bf16_to_f32(h) : nccl::f16_to_f32(h));
    wide.push_back(std::move(w));
  }
  std::vector<float> reduced = fold_wire(wide, plan.op);
  std::vector<std::uint16_t> out;
  for (float x : reduced) {
    const float value = divisor == 1 ? x : x / static_cast<float>(divisor);
    out.push_back(bf16 ? nccl::f32_to_bf16(value) : nccl::f32_to_f16(value));
  }
  return to_bytes(out);
}

/// Random inputs: any bits for integers (bool: 0/1), finite values of mixed magnitude for floats.
std::vector<std::byte> random_input(DType dtype, std::size_t count, std::mt19937_64& rng) {
  std::vector<std::byte> out(count * nodal::element_size(dtype));
  std::uniform_real_distribution<double> real(-300.0, 300.0);
  std::uniform_int_distribution<int> scale(-12, 12);
  for (std::size_t i = 0; i < count; ++i) {
    std::byte* p = out.data() + i * nodal::element_size(dtype);
    const double value = std::ldexp(real(rng), scale(rng));
    switch (dtype) {
      case DType::bool_: *p = static_cast<std::byte>(rng() & 1); break;
      case DType::u8:
      case DType::i8: *p = static_cast<std::byte>(rng()); break;
      case DType::i32: {
        // Mostly small (so prod is not always 0 mod 2^32), sometimes any bits.
        std::int32_t v = (rng() % 4 == 0) ? static_cast<std::int32_t>(rng()) : static_cast<std::int32_t>(rng() % 200) - 100;
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::i64: {
        std::int64_t v = (rng() % 4 == 0) ? static_cast<std::int64_t>(rng()) : static_cast<std::int64_t>(rng() % 200) - 100;
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::f16: {
        const std::uint16_t h = nccl::f32_to_f16(static_cast<float>(value));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::bf16: {
        const std::uint16_t h = nccl::f32_to_bf16(static_cast<float>(value));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::f32: {
        const float f = static_cast<float>(value);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::f64: std::memcpy(p, &value, 8); break;
    }
  }
  return out;
}

TEST(NcclPlan, StagedArithmeticMatchesTheCpuPathBitwise) {
  std::mt19937_64 rng(20240611);
  constexpr std::size_t kCount = 4096;
  for (int n : {1, 2, 3, 4, 7}) {
    for (DType dtype : kDtypes) {
      for (ReduceOp op : kOps) {
        const nccl::ReducePlan plan = nccl::plan_reduce(dtype, op);
        if (!plan.defined) continue;
        std::vector<std::vector<std::byte>> inputs;
        std::vector<const void*> sources;
        for (int r = 0; r < n; ++r) inputs.push_back(random_input(dtype, kCount, rng));
        for (const auto& b : inputs) sources.push_back(b.data());
        std::vector<std::byte> want(kCount * nodal::element_size(dtype));
        nodal::detail::reduce_n(dtype, op, want.data(), sources.data(), n, kCount);
        const std::vector<std::byte> got =
            plan.stage == nccl::Stage::direct ? run_direct(plan, dtype, inputs) : run_staged(plan, dtype, inputs);
        ASSERT_EQ(got.size(), want.size());
        const std::size_t esize = nodal::element_size(dtype);
        for (std::size_t i = 0; i < kCount; ++i) {
          if (std::memcmp(got.data() + i * esize, want.data() + i * esize, esize) != 0) {
            ADD_FAILURE() << label(dtype, op) << " over " << n << " ranks differs at element " << i;
            break;
          }
        }
      }
    }
  }
}

// ---- The device kernels' conversions, against the compiler's. ----

TEST(NcclConvert, HalfToFloatIsExactForEveryHalf) {
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    _Float16 half;
    const auto h = static_cast<std::uint16_t>(bits);
    std::memcpy(&half, &h, 2);
    const float want = static_cast<float>(half);
    const float got = nccl::f16_to_f32(h);
    if (want != want) {
      ASSERT_TRUE(got != got) << std::hex << bits;
    } else {
      ASSERT_EQ(nccl::f32_to_bits(got), nccl::f32_to_bits(want)) << std::hex << bits;
    }
  }
}

TEST(NcclConvert, FloatToHalfRoundsToNearestEvenLikeTheCompiler) {
  std::mt19937 rng(7);
  auto check = [](std::uint32_t bits) {
    const float value = nccl::bits_to_f32(bits);
    if (value != value) return;  // NaN payloads: the quiet bit and top payload bits, not compared
    const _Float16 half = static_cast<_Float16>(value);
    std::uint16_t want;
    std::memcpy(&want, &half, 2);
    ASSERT_EQ(nccl::f32_to_f16(value), want) << std::hex << bits;
  };
  // Every half and the points halfway between neighbours (ties), and their neighbours.
  for (std::uint32_t h = 0; h < 0x7c00u; ++h) {
    const std::uint32_t low = nccl::f32_to_bits(nccl::f16_to_f32(static_cast<std::uint16_t>(h)));
    const std::uint32_t high = nccl::f32_to_bits(nccl::f16_to_f32(static_cast<std::uint16_t>(h + 1)));
    const std::uint32_t mid = nccl::f32_to_bits((nccl::bits_to_f32(low) + nccl::bits_to_f32(high)) / 2);
    for (std::uint32_t b : {low, mid - 1, mid, mid + 1}) {
      check(b);
      check(b | 0x80000000u);
    }
  }
  for (int i = 0; i < 2'000'000; ++i) check(static_cast<std::uint32_t>(rng()));
  check(0x7f800000u);  // inf
  check(0x477ff000u);  // 65520: rounds to inf
  check(0x477fefffu);  // just below: 65504
}

TEST(NcclPlan, InitTimeoutFromEnvironment) {
  using namespace std::chrono;
  EXPECT_EQ(nccl::init_timeout_from(""), seconds(120));
  EXPECT_EQ(nccl::init_timeout_from("30"), seconds(30));
  EXPECT_EQ(nccl::init_timeout_from("0.5"), milliseconds(500));
  for (const char* bad : {"0", "-3", "abc", "10s", "inf", "nan", " 5"}) {
    EXPECT_THROW(nccl::init_timeout_from(bad), nodal::UsageError) << bad;
  }
}

TEST(NcclPlan, IdObjectNamedAfterTheCommunicatorAndGeneration) {
  EXPECT_EQ(nccl::id_object_name("world", 0), "nodal.comm-nccl:world#0");
  EXPECT_NE(nccl::id_object_name("world", 3), nccl::id_object_name("world", 4));
  EXPECT_NE(nccl::id_object_name("world.1", 3), nccl::id_object_name("world", 3));
}

}  // namespace
