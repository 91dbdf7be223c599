// Elementwise reductions of n inputs in rank order: the arithmetic of every reducing collective.
// Internal.
#pragma once

#include <nodal/communicator.hpp>
#include <nodal/tensor.hpp>

#include <cstddef>

namespace nodal::detail {

/// False for an (op, dtype) pair nodal does not define (avg of bool).
bool reduce_op_defined(ReduceOp op, DType dtype) noexcept;

/// out[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], folded left to right in the
/// accumulation type (f32 for f16 and bf16; 64-bit wrap-around integers for integer sum, prod and
/// avg), then for avg divided by n, then rounded once to dtype. Every element depends only on the
/// inputs at its index, never on where a tile starts, so any split of the work gives the same bits.
/// `out` may be exactly one of the sources (the same address; each element is written after its
/// reads); it must not overlap any source otherwise.
/// `stream`: write `out` with non-temporal stores (large outputs nobody reads soon; copy.hpp).
void reduce_n(DType dtype, ReduceOp op, void* out, const void* const* srcs, int n, std::size_t count,
              bool stream = false);

/// One (dtype, op)'s fold, reduce_n's arguments after the first two.
using ReduceKernel = void (*)(void* out, const void* const* srcs, int n, std::size_t count, bool stream);

/// The folds of reduce_kernels.cpp for one instruction set: the baseline everywhere, AVX2 where
/// the build targets x86-64 (NODAL_REDUCE_AVX2; reduce_kernels_avx2.cpp). reduce_n takes AVX2's
/// where the CPU has it, unless NODAL_REDUCE_ISA=baseline (reduce_dispatch.cpp). Null for an
/// undefined (op, dtype). Calling avx2::kernel_for's folds needs a CPU with AVX2.
namespace baseline {
ReduceKernel kernel_for(DType dtype, ReduceOp op) noexcept;
}
namespace avx2 {
ReduceKernel kernel_for(DType dtype, ReduceOp op) noexcept;
}

/// "avx2" or "baseline": the set reduce_n uses in this process. Both give the same bits, but for
/// an element folded from NaNs of different sign or payload: a NaN either way, not always the
/// same one (every rank of a node takes the same set, so one job's results agree).
const char* reduce_isa() noexcept;

/// Throws UsageError when NODAL_REDUCE_ISA is set to something else than auto, avx2 or baseline
/// (comm_config() calls it on every rank; reduce_n itself never throws and takes auto then).
void check_reduce_isa_setting();

}  // namespace nodal::detail
