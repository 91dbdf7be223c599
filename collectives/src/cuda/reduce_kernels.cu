// The CUDA IPC collectives' kernels (reduce_kernels.hpp). Results must be bitwise those of the CPU
// path (src/reduce_kernels.cpp, GCC on x86-64 with SSE arithmetic), so:
// - the same fold: acc = load(src 0), then acc = op(acc, load(src j)) for j = 1..n-1, per element;
// - every float operation is an explicitly rounded intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn and
//   the double ones), which nvcc never contracts into an FMA; the file is also built with
//   -fmad=false -ftz=false -prec-div=true (collectives/CMakeLists.txt) so that nothing else can be;
// - the conversions are the CPU's own bit manipulations (bf16 both ways, f16 -> f32 and f16 NaNs),
//   or ones IEEE defines exactly (f32 -> f16 round to nearest even: __float2half_rn);
// - NaNs: a GPU's arithmetic returns the canonical NaN 0x7fffffff, x86 SSE returns the first NaN
//   operand, quieted, or the "real indefinite" 0xffc00000 when it makes a NaN from numbers
//   (inf - inf, 0 * inf). The float ops below apply x86's rule with acc as the first operand (a
//   NaN result never costs more than a select). GCC may commute `acc + x`, so the CPU path can pass
//   on the other operand's payload: the H100 run (2026-11-27) saw both; results are equal NaN
//   payloads aside, as communicator.hpp says;
// - min and max are the CPU's selections (b < a ? b : a, a < b ? b : a): a NaN survives only as the
//   first operand, -0 and +0 keep the first;
// - integers: sum, prod and avg in 64-bit wrap-around unsigned arithmetic, avg = the sum read as
//   signed / n toward zero, then truncated to the type; min and max in the type's signedness;
// - bool: bytewise | (sum, max) and & (prod, min) of the stored bytes, as the CPU does.
// No kernel reads a flag: everything a kernel reads was ordered before it by the host (stream
// waits on interprocess events), so kernels of processes time-slicing one GPU cannot deadlock.
#include "cuda/reduce_kernels.hpp"
#include "element_convert.hpp"

#include <nodal/errors.hpp>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

namespace nodal::detail::cuda_ipc {
namespace {

[[noreturn]] void throw_cuda(const char* what, cudaError_t error) {
  throw CudaError(std::string("CUDA IPC collectives: ") + what + ": " + cudaGetErrorName(error) + " (" +
                  cudaGetErrorString(error) + ")");
}

// ---- Conversions, as src/reduce_kernels.cpp does them. ----

__device__ __forceinline__ float bits_to_float(std::uint32_t bits) { return __uint_as_float(bits); }
__device__ __forceinline__ std::uint32_t float_bits(float value) { return __float_as_uint(value); }

struct Bf16 {
  using Storage = std::uint16_t;
  using Acc = float;
  __device__ static float load(std::uint16_t x) { return convert::bf16_to_f32(x); }
  __device__ static std::uint16_t store(float value) { return convert::f32_to_bf16(value); }
};

struct F16 {
  using Storage = std::uint16_t;
  using Acc = float;
  /// Exact (every f16 is a float); NaNs keep their payload and become quiet, as x86 converts them.
  __device__ static float load(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1fu;
    const std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) {
      if (mantissa == 0) return bits_to_float(sign | 0x7f800000u);
      return bits_to_float(sign | 0x7fc00000u | (mantissa << 13));
    }
    return __half2float(__ushort_as_half(h));  // numbers, subnormals included: exact
  }
  /// Round to nearest even (overflow to infinity, subnormals kept); NaNs keep the top of their
  /// payload and become quiet, as x86 (F16C or libgcc) converts them.
  __device__ static std::uint16_t store(float value) {
    const std::uint32_t bits = float_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      return static_cast<std::uint16_t>(((bits >> 16) & 0x8000u) | 0x7e00u | ((bits >> 13) & 0x3ffu));
    }
    return __half_as_ushort(__float2half_rn(value));
  }
};

template <class T, class A>
struct Plain {
  using Storage = T;
  using Acc = A;
  __device__ static A load(T x) { return static_cast<A>(x); }
  __device__ static T store(A x) { return static_cast<T>(x); }
};

// ---- x86 SSE's NaN results. ----

__device__ __forceinline__ float x86_nan(float result, float a, float b) {
  if (!(result != result)) return result;
  if (a != a) return bits_to_float(float_bits(a) | 0x00400000u);
  if (b != b) return bits_to_float(float_bits(b) | 0x00400000u);
  return bits_to_float(0xffc00000u);  // the real indefinite
}
__device__ __forceinline__ double x86_nan(double result, double a, double b) {
  if (!(result != result)) return result;
  constexpr unsigned long long kQuiet = 0x0008000000000000ull;
  if (a != a) return __longlong_as_double(static_cast<long long>(static_cast<unsigned long long>(__double_as_longlong(a)) | kQuiet));
  if (b != b) return __longlong_as_double(static_cast<long long>(static_cast<unsigned long long>(__double_as_longlong(b)) | kQuiet));
  return __longlong_as_double(static_cast<long long>(0xfff8000000000000ull));
}

// ---- Operators on the accumulation type. ----

struct Sum {
  template <class A>
  __device__ static A apply(A a, A b) {
    if constexpr (std::is_same_v<A, float>) return x86_nan(__fadd_rn(a, b), a, b);
    else if constexpr (std::is_same_v<A, double>) return x86_nan(__dadd_rn(a, b), a, b);
    else return static_cast<A>(a + b);
  }
};
struct Prod {
  template <class A>
  __device__ static A apply(A a, A b) {
    if constexpr (std::is_same_v<A, float>) return x86_nan(__fmul_rn(a, b), a, b);
    else if constexpr (std::is_same_v<A, double>) return x86_nan(__dmul_rn(a, b), a, b);
    else return static_cast<A>(a * b);
  }
};
struct Min {
  template <class A>
  __device__ static A apply(A a, A b) { return b < a ? b : a; }
};
struct Max {
  template <class A>
  __device__ static A apply(A a, A b) { return a < b ? b : a; }
};
struct Or {
  template <class A>
  __device__ static A apply(A a, A b) { return static_cast<A>(a | b); }
};
struct And {
  template <class A>
  __device__ static A apply(A a, A b) { return static_cast<A>(a & b); }
};

template <class A>
__device__ __forceinline__ A average(A sum, int n) {
  if constexpr (std::is_same_v<A, float>) return x86_nan(__fdiv_rn(sum, static_cast<float>(n)), sum, static_cast<float>(n));
  else if constexpr (std::is_same_v<A, double>) return x86_nan(__ddiv_rn(sum, static_cast<double>(n)), sum, static_cast<double>(n));
  else return static_cast<A>(static_cast<std::int64_t>(sum) / n);  // the wrapped sum read as signed, toward zero
}

// ---- The fold. ----

struct ReduceParams {
  const void* srcs[kMaxRanks];
  void* out;
  void* out2;
  unsigned long long count;
  int n;
  int vector;  ///< 1: every pointer is 16-byte aligned
};

constexpr int kThreads = 256;

template <class Conv, class Op, bool kAverage>
__device__ __forceinline__ void fold_scalar(const ReduceParams& p, unsigned long long i) {
  using T = typename Conv::Storage;
  using A = typename Conv::Acc;
  A acc = Conv::load(static_cast<const T*>(p.srcs[0])[i]);
  for (int j = 1; j < p.n; ++j) acc = Op::apply(acc, Conv::load(static_cast<const T*>(p.srcs[j])[i]));
  if constexpr (kAverage) acc = average(acc, p.n);
  const T value = Conv::store(acc);
  static_cast<T*>(p.out)[i] = value;
  if (p.out2 != nullptr) static_cast<T*>(p.out2)[i] = value;
}

template <class Conv, class Op, bool kAverage>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const ReduceParams p) {
  using T = typename Conv::Storage;
  using A = typename Conv::Acc;
  constexpr int V = static_cast<int>(16 / sizeof(T));
  union Vec {
    uint4 raw;
    T e[V];
  };
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  const unsigned long long first = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long scalar_from = 0;
  if (p.vector) {
    const unsigned long long vectors = p.count / V;
    for (unsigned long long v = first; v < vectors; v += stride) {
      Vec x;
      x.raw = static_cast<const uint4*>(p.srcs[0])[v];
      A acc[V];
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = Conv::load(x.e[k]);
      for (int j = 1; j < p.n; ++j) {
        x.raw = static_cast<const uint4*>(p.srcs[j])[v];
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = Op::apply(acc[k], Conv::load(x.e[k]));
      }
      Vec o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if constexpr (kAverage) acc[k] = average(acc[k], p.n);
        o.e[k] = Conv::store(acc[k]);
      }
      static_cast<uint4*>(p.out)[v] = o.raw;
      if (p.out2 != nullptr) static_cast<uint4*>(p.out2)[v] = o.raw;
    }
    scalar_from = vectors * V;
  }
  for (unsigned long long i = scalar_from + first; i < p.count; i += stride) fold_scalar<Conv, Op, kAverage>(p, i);
}

int sm_count(int device) {
  static std::atomic<int> cached[64] = {};
  if (device < 0 || device >= 64) return 32;
  int count = cached[device].load(std::memory_order_relaxed);
  if (count == 0) {
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0) count = 32;
    cached[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

unsigned blocks_for(unsigned long long work_items, unsigned max_blocks) {
  const unsigned long long wanted = (work_items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<unsigned long long>(1, std::min<unsigned long long>(wanted, max_blocks)));
}

using Launch = void (*)(const ReduceParams&, unsigned max_blocks, cudaStream_t);

template <class Conv, class Op, bool kAverage>
void launch_fold(const ReduceParams& p, unsigned max_blocks, cudaStream_t stream) {
  constexpr unsigned long long V = 16 / sizeof(typename Conv::Storage);
  const unsigned long long items = p.vector ? p.count / V + p.count % V : p.count;
  reduce_kernel<Conv, Op, kAverage><<<blocks_for(items, max_blocks), kThreads, 0, stream>>>(p);
}

template <class T>
Launch integer_launch(ReduceOp op) {
  using Wide = Plain<T, std::uint64_t>;
  using Same = Plain<T, T>;
  switch (op) {
    case ReduceOp::sum: return launch_fold<Wide, Sum, false>;
    case ReduceOp::prod: return launch_fold<Wide, Prod, false>;
    case ReduceOp::min: return launch_fold<Same, Min, false>;
    case ReduceOp::max: return launch_fold<Same, Max, false>;
    case ReduceOp::avg: return launch_fold<Wide, Sum, true>;
  }
  return nullptr;
}

template <class Conv>
Launch float_launch(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return launch_fold<Conv, Sum, false>;
    case ReduceOp::prod: return launch_fold<Conv, Prod, false>;
    case ReduceOp::min: return launch_fold<Conv, Min, false>;
    case ReduceOp::max: return launch_fold<Conv, Max, false>;
    case ReduceOp::avg: return launch_fold<Conv, Sum, true>;
  }
  return nullptr;
}

Launch bool_launch(ReduceOp op) {
  using Conv = Plain<std::uint8_t, std::uint8_t>;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::max: return launch_fold<Conv, Or, false>;
    case ReduceOp::prod:
    case ReduceOp::min: return launch_fold<Conv, And, false>;
    case ReduceOp::avg: break;
  }
  return nullptr;
}

Launch launch_for(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::bool_: return bool_launch(op);
    case DType::u8: return integer_launch<std::uint8_t>(op);
    case DType::i8: return integer_launch<std::int8_t>(op);
    case DType::i32: return integer_launch<std::int32_t>(op);
    case DType::i64: return integer_launch<std::int64_t>(op);
    case DType::f16: return float_launch<F16>(op);
    case DType::bf16: return float_launch<Bf16>(op);
    case DType::f32: return float_launch<Plain<float, float>>(op);
    case DType::f64: return float_launch<Plain<double, double>>(op);
  }
  return nullptr;
}

// ---- Batched copies. ----

struct CopyParams {
  CopySegment segments[kMaxRanks];
};
static_assert(sizeof(CopyParams) + 16 <= 4096, "kernel parameters are limited to 4 KiB");

/// blockIdx.y picks the segment; 16 bytes per thread per step, 4 steps in flight.
__global__ void __launch_bounds__(kThreads) copy_kernel(const CopyParams p) {
  const CopySegment segment = p.segments[blockIdx.y];
  const auto* src = static_cast<const uint4*>(segment.src);
  auto* dst = static_cast<uint4*>(segment.dst);
  const unsigned long long units = segment.bytes / 16;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < units; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < units; i += stride) dst[i] = src[i];
}

}  // namespace

void launch_reduce(DType dtype, ReduceOp op, const void* const* srcs, int n, void* out, void* out2, std::size_t count,
                   cuda::Stream stream) {
  if (count == 0) return;
  if (n < 1 || n > kMaxRanks) throw CudaError("CUDA IPC collectives: launch_reduce with " + std::to_string(n) + " sources");
  const Launch launch = launch_for(dtype, op);
  if (launch == nullptr) throw UsageError(std::string("CUDA IPC collectives: ") + reduce_op_name(op) + " is not defined for this dtype");
  ReduceParams p{};
  bool vector = (reinterpret_cast<std::uintptr_t>(out) & 15u) == 0 && (reinterpret_cast<std::uintptr_t>(out2) & 15u) == 0;
  for (int j = 0; j < n; ++j) {
    p.srcs[j] = srcs[j];
    vector = vector && (reinterpret_cast<std::uintptr_t>(srcs[j]) & 15u) == 0;
  }
  p.out = out;
  p.out2 = out2;
  p.count = count;
  p.n = n;
  p.vector = vector ? 1 : 0;
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) throw_cuda("cudaGetDevice", error);
  // Enough blocks to fill every SM several times over; the kernel strides over the rest.
  launch(p, static_cast<unsigned>(sm_count(device) * 8), stream);
  error = cudaGetLastError();
  if (error != cudaSuccess) throw_cuda("reduction kernel launch", error);
}

void launch_copies(const CopySegment* segments, int n, cuda::Stream stream) {
  if (n < 0 || n > kMaxRanks) throw CudaError("CUDA IPC collectives: launch_copies with " + std::to_string(n) + " segments");
  CopyParams p{};
  int used = 0;
  bool vector = true;
  std::size_t largest = 0;
  for (int j = 0; j < n; ++j) {
    if (segments[j].bytes == 0 || segments[j].src == segments[j].dst) continue;
    p.segments[used++] = segments[j];
    vector = vector && aligned16(segments[j].src, segments[j].dst, segments[j].bytes);
    largest = std::max(largest, segments[j].bytes);
  }
  if (used == 0) return;
  cudaError_t error = cudaSuccess;
  if (!vector) {
    for (int j = 0; j < used; ++j) {
      error = cudaMemcpyAsync(p.segments[j].dst, p.segments[j].src, p.segments[j].bytes, cudaMemcpyDefault, stream);
      if (error != cudaSuccess) throw_cuda("cudaMemcpyAsync", error);
    }
    return;
  }
  int device = 0;
  error = cudaGetDevice(&device);
  if (error != cudaSuccess) throw_cuda("cudaGetDevice", error);
  // About 16 blocks per SM in all, shared among the segments, each block moving 4 units per step.
  const unsigned per_segment = static_cast<unsigned>(std::max(1, sm_count(device) * 16 / used));
  const dim3 grid(blocks_for((largest / 16 + 3) / 4, per_segment), static_cast<unsigned>(used));
  copy_kernel<<<grid, kThreads, 0, stream>>>(p);
  error = cudaGetLastError();
  if (error != cudaSuccess) throw_cuda("copy kernel launch", error);
}

}  // namespace nodal::detail::cuda_ipc
