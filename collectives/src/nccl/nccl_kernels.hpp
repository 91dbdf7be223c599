// The NCCL backend's element kernels around a staged reduction (nccl_plan.hpp): widen the dtype
// into the type NCCL reduces, narrow the result back (dividing for avg), or divide in place after a
// direct avg. Each is queued on `stream` on the current device and returns at once; count 0 queues
// nothing. Throws CudaError when the launch fails. Internal.
#pragma once

#include <nodal/cuda.hpp>
#include <nodal/tensor.hpp>

#include <cstddef>

namespace nodal::detail::nccl {

/// dst[i] = src[i] as u64 (u8, i8, i32: zero- or sign-extended) or as f32 (f16, bf16: exact).
void widen(DType dtype, const void* src, void* dst, std::size_t count, cuda::Stream stream);
/// dst[i] = src[i] (u64 for integers, f32 for f16/bf16) divided by `divisor` (1: not divided),
/// converted to dtype as reduce_kernels.cpp does (integers: i64 division toward zero then
/// truncation; f16/bf16: f32 division, then rounded once to nearest even).
void narrow(DType dtype, const void* src, void* dst, std::size_t count, int divisor, cuda::Stream stream);
/// data[i] /= divisor in the dtype (i64: read as signed, toward zero; f32, f64: IEEE division).
void divide_in_place(DType dtype, void* data, std::size_t count, int divisor, cuda::Stream stream);

}  // namespace nodal::detail::nccl
