// reduce_n: the fold of reduce_kernels.cpp for this CPU, chosen once per process (AVX2 where the
// build has it and the CPU supports it, else the baseline; NODAL_REDUCE_ISA=baseline forces the
// baseline). tests/unit/reduce_kernels_test.cpp compares the two sets directly.
#include "reduce_kernels.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>

#include <atomic>
#include <string>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

using KernelFor = ReduceKernel (*)(DType, ReduceOp) noexcept;

constexpr std::size_t kDTypes = static_cast<std::size_t>(DType::f64) + 1;
constexpr std::size_t kOps = static_cast<std::size_t>(ReduceOp::avg) + 1;

/// Every (dtype, op)'s fold of one instruction set, looked up once: a call costs two loads.
struct KernelTable {
  ReduceKernel at[kDTypes][kOps] = {};
};

bool avx2_usable() noexcept {
#ifdef NODAL_REDUCE_AVX2
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

/// AVX2's folds where the build has them and the CPU runs them, unless NODAL_REDUCE_ISA=baseline
/// ("avx2" where the CPU or the build lacks it gives the baseline: the same bits). A value that
/// check_reduce_isa_setting refuses counts as auto here. Decided once per process.
bool chosen_avx2() noexcept {
  static const bool avx2 = getenv_or_empty("NODAL_REDUCE_ISA") != "baseline" && avx2_usable();
  return avx2;
}

/// Out of line, so that reduce_n pays only for the guard of the static below.
[[gnu::noinline]] KernelTable make_table(KernelFor kernel_for) {
  KernelTable t;
  for (std::size_t d = 0; d < kDTypes; ++d) {
    for (std::size_t o = 0; o < kOps; ++o) t.at[d][o] = kernel_for(static_cast<DType>(d), static_cast<ReduceOp>(o));
  }
  return t;
}

/// reduce_n's table, made at the first call (out of line and cold: the calls after it pay one
/// load and a test, not the static's set-up).
std::atomic<const KernelTable*> made{nullptr};

[[gnu::noinline, gnu::cold]] const KernelTable* make_kernels() {
  static const KernelTable kernels = make_table(chosen_avx2() ? avx2::kernel_for : baseline::kernel_for);
  made.store(&kernels, std::memory_order_release);
  return &kernels;
}

}  // namespace

const char* reduce_isa() noexcept { return chosen_avx2() ? "avx2" : "baseline"; }

void check_reduce_isa_setting() {
  const std::string wanted = getenv_or_empty("NODAL_REDUCE_ISA");
  if (!wanted.empty() && wanted != "auto" && wanted != "avx2" && wanted != "baseline") {
    throw UsageError(fmt::format("NODAL_REDUCE_ISA='{}': use auto, avx2 or baseline", wanted));
  }
}

bool reduce_op_defined(ReduceOp op, DType dtype) noexcept {
  // Every pair but avg of bool has a fold (reduce_kernels.cpp's bool_kernel): asked at every
  // reducing call, so the rule itself rather than a lookup.
  return static_cast<std::size_t>(dtype) < kDTypes && static_cast<std::size_t>(op) < kOps &&
         !(dtype == DType::bool_ && op == ReduceOp::avg);
}

void reduce_n(DType dtype, ReduceOp op, void* out, const void* const* srcs, int n, std::size_t count, bool stream) {
  const KernelTable* kernels = made.load(std::memory_order_acquire);
  if (kernels == nullptr) [[unlikely]] kernels = make_kernels();
  kernels->at[static_cast<std::size_t>(dtype)][static_cast<std::size_t>(op)](out, srcs, n, count, stream);
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
