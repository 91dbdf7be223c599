// How the NCCL backend carries each reduction so that its results follow the CPU path's
// semantics (communicator.hpp), and the other host-side decisions of the backend that can be
// checked without a GPU (the unit test tests/unit/nccl_mapping_test.cpp does). Internal.
//
// NCCL's own arithmetic differs from nodal's in three places, so those (dtype, op) pairs are
// staged through a wider type in device scratch (nccl_kernels.cu) instead of handed to NCCL as is:
//   - integer avg: ncclAvg sums in the element type (overflowing i8/u8/i32) and divides unsigned
//     types unsigned; nodal sums in 64 bits and divides the signed sum by n toward zero;
//   - f16/bf16 sum, prod, avg: NCCL combines halves in half precision (one rounding per step);
//     nodal accumulates in f32 and rounds once;
//   - float avg: ncclAvg pre-multiplies every input by the rounded 1/n (ncclDevPreMulSum), which
//     is not sum / n when n is not a power of two; nodal divides the sum by n.
// Integer sum and prod go to NCCL as the unsigned type of the same width: two's-complement
// wrap-around gives the same bits, and unsigned overflow is defined in device code.
//
// What stays different from the CPU path: NCCL's reduction order (ring or tree, chunked per
// channel) is not the rank-order fold, so float sums can differ in the last bit from the CPU
// path's result for three or more ranks. NCCL's result is still bitwise identical on every rank
// (each element is reduced once and then copied) and from run to run for the same size, world
// size and NCCL configuration (NCCL_ALGO, NCCL_PROTO, channel counts). Float min/max go to NCCL
// as they are, and NCCL's fmin/fmax (and __hmin/__hmax) drop NaNs and may return either signed
// zero where the CPU path keeps its first operand; bool goes as max/min of bytes, which is or/and
// for 0/1 bytes (what nodal's tensors hold) but not for other stored bytes.
#pragma once

#include <nodal/communicator.hpp>
#include <nodal/tensor.hpp>

#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace nodal::detail::nccl {

/// How one reduction is done.
enum class Stage : std::uint8_t {
  /// NCCL reduces the caller's buffers with `op` on `wire` (same element size as the dtype).
  direct,
  /// Integer avg: inputs sign- or zero-extended to 64 bits in scratch, NCCL sums them as u64
  /// (wrapping), then the sum read as i64 is divided by n toward zero and truncated to the dtype.
  widen_u64,
  /// f16/bf16 sum, prod, avg: inputs widened to f32 in scratch, NCCL reduces in f32, then (avg)
  /// divided by n and rounded once to the dtype, to nearest even.
  widen_f32,
};

struct ReducePlan {
  bool defined = false;  ///< false: nodal defines no such reduction (avg of bool)
  Stage stage = Stage::direct;
  ncclDataType_t wire = ncclUint8;  ///< the element type NCCL reduces
  ncclRedOp_t op = ncclSum;
  /// Divide the reduced value by the world size afterwards (avg): in the dtype itself after a
  /// direct reduction (i64, f32, f64), or while narrowing after a staged one.
  bool divide = false;
};

/// The plan for (dtype, op). bool: sum and max are NCCL's max on u8 (logical or, for 0/1
/// values), prod and min its min (logical and); avg of bool is not defined.
ReducePlan plan_reduce(DType dtype, ReduceOp op) noexcept;

/// Bytes per element of an NCCL type (0 for one this backend never uses).
std::size_t wire_size(ncclDataType_t type) noexcept;

/// "ncclUint64", ... (for messages and tests).
const char* wire_name(ncclDataType_t type) noexcept;

/// NODAL_NCCL_INIT_TIMEOUT: seconds (a positive number, fractions allowed) that creating the NCCL
/// communicator may take, ncclUniqueId exchange included; `text` empty: 120 s. Throws UsageError.
std::chrono::nanoseconds init_timeout_from(std::string_view text);

/// The arena object through which rank 0 hands the ncclUniqueId of communicator `comm_name`'s
/// `generation`-th NCCL communicator to the other ranks.
std::string id_object_name(std::string_view comm_name, std::uint64_t generation);

}  // namespace nodal::detail::nccl
