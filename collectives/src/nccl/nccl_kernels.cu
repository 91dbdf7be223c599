// Grid-stride elementwise kernels; the arithmetic is nccl_convert.hpp's, shared with the host.
#include "nccl/nccl_convert.hpp"
#include "nccl/nccl_kernels.hpp"

#include <nodal/errors.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace nodal::detail::nccl {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void widen_integer_kernel(const T* src, std::uint64_t* dst, std::size_t count) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = widen_integer<T>(src[i]);
  }
}

template <bool kBf16>
__global__ void widen_half_kernel(const std::uint16_t* src, float* dst, std::size_t count) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = kBf16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
  }
}

template <class T>
__global__ void narrow_integer_kernel(const std::uint64_t* src, T* dst, std::size_t count, std::int64_t divisor) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = narrow_integer<T>(src[i], divisor);
  }
}

template <bool kBf16>
__global__ void narrow_half_kernel(const float* src, std::uint16_t* dst, std::size_t count, float divisor) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float value = divisor == 1.0f ? src[i] : src[i] / divisor;  // IEEE division (no fast math)
    dst[i] = kBf16 ? f32_to_bf16(value) : f32_to_f16(value);
  }
}

template <class T>
__global__ void divide_float_kernel(T* data, std::size_t count, T divisor) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    data[i] = data[i] / divisor;
  }
}

__global__ void divide_i64_kernel(std::uint64_t* data, std::size_t count, std::int64_t divisor) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    data[i] = narrow_integer<std::uint64_t>(data[i], divisor);
  }
}

unsigned blocks_for(std::size_t count) {
  // Enough blocks to fill any current GPU; the grid-stride loop covers the rest.
  return static_cast<unsigned>(std::min<std::size_t>((count + kThreads - 1) / kThreads, 4096));
}

void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw CudaError(std::string("NCCL backend: launching the ") + what + " kernel failed: " +
                    cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
  }
}

[[noreturn]] void bad_dtype(const char* what, DType dtype) {
  throw CudaError(std::string("NCCL backend: no ") + what + " kernel for dtype " + std::string(dtype_name(dtype)));
}

}  // namespace

void widen(DType dtype, const void* src, void* dst, std::size_t count, cuda::Stream stream) {
  if (count == 0) return;
  const unsigned blocks = blocks_for(count);
  auto* wide = static_cast<std::uint64_t*>(dst);
  switch (dtype) {
    case DType::u8:
      widen_integer_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::uint8_t*>(src), wide, count);
      break;
    case DType::i8:
      widen_integer_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::int8_t*>(src), wide, count);
      break;
    case DType::i32:
      widen_integer_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::int32_t*>(src), wide, count);
      break;
    case DType::i64:
      widen_integer_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::int64_t*>(src), wide, count);
      break;
    case DType::f16:
      widen_half_kernel<false><<<blocks, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(src),
                                                                static_cast<float*>(dst), count);
      break;
    case DType::bf16:
      widen_half_kernel<true><<<blocks, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(src),
                                                               static_cast<float*>(dst), count);
      break;
    default: bad_dtype("widening", dtype);
  }
  check_launch("widening");
}

void narrow(DType dtype, const void* src, void* dst, std::size_t count, int divisor, cuda::Stream stream) {
  if (count == 0) return;
  const unsigned blocks = blocks_for(count);
  const auto* wide = static_cast<const std::uint64_t*>(src);
  switch (dtype) {
    case DType::u8:
      narrow_integer_kernel<<<blocks, kThreads, 0, stream>>>(wide, static_cast<std::uint8_t*>(dst), count, divisor);
      break;
    case DType::i8:
      narrow_integer_kernel<<<blocks, kThreads, 0, stream>>>(wide, static_cast<std::int8_t*>(dst), count, divisor);
      break;
    case DType::i32:
      narrow_integer_kernel<<<blocks, kThreads, 0, stream>>>(wide, static_cast<std::int32_t*>(dst), count, divisor);
      break;
    case DType::i64:
      narrow_integer_kernel<<<blocks, kThreads, 0, stream>>>(wide, static_cast<std::int64_t*>(dst), count, divisor);
      break;
    case DType::f16:
      narrow_half_kernel<false><<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(src),
                                                                 static_cast<std::uint16_t*>(dst), count,
                                                                 static_cast<float>(divisor));
      break;
    case DType::bf16:
      narrow_half_kernel<true><<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(src),
                                                                static_cast<std::uint16_t*>(dst), count,
                                                                static_cast<float>(divisor));
      break;
    default: bad_dtype("narrowing", dtype);
  }
  check_launch("narrowing");
}

void divide_in_place(DType dtype, void* data, std::size_t count, int divisor, cuda::Stream stream) {
  if (count == 0 || divisor == 1) return;
  const unsigned blocks = blocks_for(count);
  switch (dtype) {
    case DType::i64:
      divide_i64_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<std::uint64_t*>(data), count, divisor);
      break;
    case DType::f32:
      divide_float_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(data), count,
                                                            static_cast<float>(divisor));
      break;
    case DType::f64:
      divide_float_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<double*>(data), count,
                                                            static_cast<double>(divisor));
      break;
    default: bad_dtype("dividing", dtype);
  }
  check_launch("dividing");
}

}  // namespace nodal::detail::nccl
