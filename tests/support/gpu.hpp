// When a GPU test may run, skip, or must fail. One rule for every test labelled gpu:
// - no usable GPU (or a GPU program that was not built): the test skips, saying why, so that the
//   suite passes on a machine without a GPU (CI) — unless NODAL_REQUIRE_GPU=1, which
//   scripts/gpu-check.sh sets on the GPU machine: there a skip would hide the failure (CTest
//   counts skips as passes), so the test fails with the same reason;
// - fewer GPUs than the test needs (NCCL's one rank per GPU on a one-GPU machine): a skip either
//   way, since no setting can add a GPU; gpu-check.sh lists such skips by name in its summary.
#pragma once

#include <gtest/gtest.h>
#include <nodal/cuda.hpp>

#include <cstdlib>
#include <string>

namespace nodal::testing {

/// Whether NODAL_REQUIRE_GPU=1: a GPU test that cannot run fails instead of skipping.
inline bool gpu_required() {
  const char* value = std::getenv("NODAL_REQUIRE_GPU");
  return value != nullptr && std::string(value) == "1";
}

struct GpuCheck {
  std::string why;    ///< empty: the test can run
  bool fail = false;  ///< true: report `why` as a failure, not a skip
};

/// Whether a test that needs `gpus` GPUs can run here. `not_built`, when not empty, names a
/// program or feature this build lacks (treated like a missing GPU).
inline GpuCheck check_gpus(int gpus, const std::string& not_built = {}) {
  GpuCheck check;
  if (!nodal::cuda::available()) {
    check.why = "no usable GPU: " + nodal::cuda::unavailable_reason();
  } else if (!not_built.empty()) {
    check.why = not_built;
  } else if (nodal::cuda::device_count() < gpus) {
    check.why = "needs " + std::to_string(gpus) + " GPUs, this machine shows " +
                std::to_string(nodal::cuda::device_count());
    return check;  // a skip even with NODAL_REQUIRE_GPU=1
  } else {
    return check;
  }
  check.fail = gpu_required();
  if (check.fail) check.why += " (NODAL_REQUIRE_GPU=1: a GPU test must run here)";
  return check;
}

}  // namespace nodal::testing

/// At the top of a GPU test: skips (or fails, under NODAL_REQUIRE_GPU=1) unless `gpus` GPUs can be
/// used; the optional second argument names what this build lacks ("" when nothing).
#define NODAL_REQUIRE_GPUS(...)                                                   \
  do {                                                                            \
    const ::nodal::testing::GpuCheck gpu_check_ = ::nodal::testing::check_gpus(__VA_ARGS__); \
    if (gpu_check_.fail) FAIL() << gpu_check_.why;                                \
    if (!gpu_check_.why.empty()) GTEST_SKIP() << gpu_check_.why;                  \
  } while (0)
