// reduce_n: the fold of reduce_kernels.cpp for this CPU, chosen once per process (AVX2 where the
// build has it and the CPU supports it, else the baseline; NODAL_REDUCE_ISA=baseline forces the
// baseline, which is how the tests compare the two).
#include "reduce_kernels.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>

#include <string>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

using KernelTable = ReduceKernel (*)(DType, ReduceOp) noexcept;

KernelTable pick_kernels() {
  const std::string wanted = getenv_or_empty("NODAL_REDUCE_ISA");
  if (wanted == "baseline") return baseline::kernel_for;
  if (!wanted.empty() && wanted != "auto" && wanted != "avx2") {
    throw UsageError(fmt::format("NODAL_REDUCE_ISA='{}': use auto, avx2 or baseline", wanted));
  }
#ifdef NODAL_REDUCE_AVX2
  if (__builtin_cpu_supports("avx2")) return avx2::kernel_for;
#endif
  return baseline::kernel_for;  // "avx2" where the CPU or the build lacks it: the same bits
}

KernelTable kernels() {
  static const KernelTable table = pick_kernels();
  return table;
}

}  // namespace

bool reduce_op_defined(ReduceOp op, DType dtype) noexcept { return baseline::kernel_for(dtype, op) != nullptr; }

void reduce_n(DType dtype, ReduceOp op, void* out, const void* const* srcs, int n, std::size_t count, bool stream) {
  kernels()(dtype, op)(out, srcs, n, count, stream);
}

}  // namespace nodal::detail

namespace nodal {

const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
  }
  return "?";
}

}  // namespace nodal
