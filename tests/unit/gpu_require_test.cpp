// The rule every GPU test follows (tests/support/gpu.hpp): skip without a usable GPU, except under
// NODAL_REQUIRE_GPU=1 (scripts/gpu-check.sh), where that is a failure; too few GPUs stays a skip.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <nodal/cuda.hpp>

#include "../support/gpu.hpp"

namespace nodal::testing {
namespace {

class RequireGpu : public ::testing::Test {
 protected:
  void TearDown() override { ::unsetenv("NODAL_REQUIRE_GPU"); }
};

TEST_F(RequireGpu, WithoutAGpuASkipBecomesAFailureWhenRequired) {
  ::unsetenv("NODAL_REQUIRE_GPU");
  const GpuCheck lenient = check_gpus(1);
  ::setenv("NODAL_REQUIRE_GPU", "1", 1);
  const GpuCheck strict = check_gpus(1);
  if (nodal::cuda::available()) {
    EXPECT_EQ(lenient.why, "");
    EXPECT_EQ(strict.why, "");
    EXPECT_FALSE(strict.fail);
    return;
  }
  EXPECT_FALSE(lenient.fail);
  EXPECT_EQ(lenient.why, "no usable GPU: " + nodal::cuda::unavailable_reason());
  EXPECT_TRUE(strict.fail);
  EXPECT_NE(strict.why.find("NODAL_REQUIRE_GPU=1"), std::string::npos) << strict.why;
}

TEST_F(RequireGpu, AMissingProgramFailsWhenRequired) {
  ::setenv("NODAL_REQUIRE_GPU", "1", 1);
  const GpuCheck check = check_gpus(1, "ipc_program was not built");
  EXPECT_TRUE(check.fail);
  EXPECT_FALSE(check.why.empty());
}

TEST_F(RequireGpu, TooFewGpusStaysASkip) {
  if (!nodal::cuda::available()) GTEST_SKIP() << "the GPU count is only compared where a GPU is usable";
  ::setenv("NODAL_REQUIRE_GPU", "1", 1);
  const GpuCheck check = check_gpus(nodal::cuda::device_count() + 1);
  EXPECT_FALSE(check.fail);
  EXPECT_NE(check.why.find("needs"), std::string::npos) << check.why;
}

}  // namespace
}  // namespace nodal::testing
