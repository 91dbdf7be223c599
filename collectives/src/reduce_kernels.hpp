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
/// `out` may be one of the sources (it is written tile by tile after the tile's reads).
/// `stream`: write `out` with non-temporal stores (large outputs nobody reads soon; copy.hpp).
void reduce_n(DType dtype, ReduceOp op, void* out, const void* const* srcs, int n, std::size_t count,
              bool stream = false);

/// One (dtype, op)'s fold, reduce_n's arguments after the first two.
using ReduceKernel = void (*)(void* out, const void* const* srcs, int n, std::size_t count, bool stream);

/// The folds of reduce_kernels.cpp for one instruction set: the baseline everywhere, AVX2 where
/// the build targets x86-64 (NODAL_REDUCE_AVX2; reduce_kernels_avx2.cpp). reduce_n takes AVX2's
/// where the CPU has it, unless NODAL_REDUCE_ISA=baseline (reduce_dispatch.cpp). Null for an
/// undefined (op, dtype).
namespace baseline {
ReduceKernel kernel_for(DType dtype, ReduceOp op) noexcept;
}
namespace avx2 {
ReduceKernel kernel_for(DType dtype, ReduceOp op) noexcept;
}

}  // namespace nodal::detail
