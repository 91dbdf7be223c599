#include "nccl/nccl_plan.hpp"

#include <nodal/errors.hpp>

#include <cmath>
#include <string>

#include <fmt/format.h>

namespace nodal::detail::nccl {
namespace {

ReducePlan direct(ncclDataType_t wire, ncclRedOp_t op, bool divide = false) {
  return ReducePlan{true, Stage::direct, wire, op, divide};
}

ncclRedOp_t native_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::avg: break;  // never native: see nccl_plan.hpp
  }
  return ncclSum;
}

/// Integers: min and max in the dtype's own signedness; sum and prod as the unsigned type of the
/// same width; avg staged through 64 bits (i64 needs no widening: summed as u64 in place).
ReducePlan integer_plan(ncclDataType_t signed_type, ncclDataType_t unsigned_type, bool is_64, ReduceOp op) {
  switch (op) {
    case ReduceOp::min:
    case ReduceOp::max: return direct(signed_type, native_op(op));
    case ReduceOp::sum:
    case ReduceOp::prod: return direct(unsigned_type, native_op(op));
    case ReduceOp::avg:
      if (is_64) return direct(ncclUint64, ncclSum, true);
      return ReducePlan{true, Stage::widen_u64, ncclUint64, ncclSum, true};
  }
  return {};
}

ReducePlan half_plan(ncclDataType_t type, ReduceOp op) {
  switch (op) {
    case ReduceOp::min:
    case ReduceOp::max: return direct(type, native_op(op));  // comparisons: exact in any width
    case ReduceOp::sum:
    case ReduceOp::prod: return ReducePlan{true, Stage::widen_f32, ncclFloat32, native_op(op), false};
    case ReduceOp::avg: return ReducePlan{true, Stage::widen_f32, ncclFloat32, ncclSum, true};
  }
  return {};
}

ReducePlan float_plan(ncclDataType_t type, ReduceOp op) {
  if (op == ReduceOp::avg) return direct(type, ncclSum, true);
  return direct(type, native_op(op));
}

}  // namespace

ReducePlan plan_reduce(DType dtype, ReduceOp op) noexcept {
  switch (dtype) {
    case DType::bool_:
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::max: return direct(ncclUint8, ncclMax);
        case ReduceOp::prod:
        case ReduceOp::min: return direct(ncclUint8, ncclMin);
        case ReduceOp::avg: return {};
      }
      return {};
    // u8: the "signed" type of min/max is u8 itself.
    case DType::u8: return integer_plan(ncclUint8, ncclUint8, false, op);
    case DType::i8: return integer_plan(ncclInt8, ncclUint8, false, op);
    case DType::i32: return integer_plan(ncclInt32, ncclUint32, false, op);
    case DType::i64: return integer_plan(ncclInt64, ncclUint64, true, op);
    case DType::f16: return half_plan(ncclFloat16, op);
    case DType::bf16: return half_plan(ncclBfloat16, op);
    case DType::f32: return float_plan(ncclFloat32, op);
    case DType::f64: return float_plan(ncclFloat64, op);
  }
  return {};
}

std::size_t wire_size(ncclDataType_t type) noexcept {
  switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

const char* wire_name(ncclDataType_t type) noexcept {
  switch (type) {
    case ncclInt8: return "ncclInt8";
    case ncclUint8: return "ncclUint8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    default: return "?";
  }
}

std::chrono::nanoseconds init_timeout_from(std::string_view text) {
  if (text.empty()) return std::chrono::seconds(120);
  const std::string copy(text);
  double seconds = 0;
  std::size_t used = 0;
  if ((copy.front() >= '0' && copy.front() <= '9') || copy.front() == '.') {  // no sign, no blanks
    try {
      seconds = std::stod(copy, &used);
    } catch (const std::exception&) {
      used = 0;
    }
  }
  if (used != copy.size() || !std::isfinite(seconds) || seconds <= 0 || seconds > 1e7) {
    throw UsageError(fmt::format("NODAL_NCCL_INIT_TIMEOUT='{}': expected a positive number of seconds (default 120)",
                                 copy));
  }
  return std::chrono::nanoseconds(static_cast<std::int64_t>(seconds * 1e9));
}

std::string id_object_name(std::string_view comm_name, std::uint64_t generation) {
  return fmt::format("nodal.comm-nccl:{}#{}", comm_name, generation);
}

}  // namespace nodal::detail::nccl
