// CUDA tensors through TensorQueue under nodalrun (gpu_queue_program): bit-exact hand-off from
// the GPU pool and from cudaMalloc between 2 to 8 ranks, a consumer reading after its producer
// exited, and a dead consumer's references released. Without a usable GPU each test skips with
// the reason (cuda::unavailable_reason()); one test checks what a job sees then.
#include <gtest/gtest.h>

#include <nodal/cuda.hpp>

#include <string>
#include <utility>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/gpu.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

const std::string kGpuProgram = NODAL_TEST_GPU_PROGRAM;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// nodalrun ARGS... (ARGS name kGpuProgram and its mode).
ChildResult run_gpu(std::vector<std::string> args, std::chrono::milliseconds timeout = 180s) {
  return run(nodalrun_command(std::move(args)), timeout);
}

void expect_all_verified(const ChildResult& r, int ranks, int count) {
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 1; rank < ranks; ++rank) {
    std::string line = "[" + std::to_string(rank) + "] verified " + std::to_string(count) + " of " + std::to_string(count);
    EXPECT_TRUE(contains(r.out, line)) << line << "\n" << r.out;
  }
}

TEST(GpuQueue, PoolTensorsArriveBitExactBetweenTwoRanks) {
  NODAL_REQUIRE_GPUS(1);
  expect_all_verified(run_gpu({"-n", "2", kGpuProgram, "handoff", "100", "4099", "pool"}), 2, 100);
}

TEST(GpuQueue, PoolTensorsArriveBitExactAtSevenConsumers) {
  NODAL_REQUIRE_GPUS(1);
  expect_all_verified(run_gpu({"-n", "8", kGpuProgram, "handoff", "20", "65536", "pool"}), 8, 20);
}

TEST(GpuQueue, LargePoolTensorsOutgrowTheChunkSize) {
  NODAL_REQUIRE_GPUS(1);
  // 300 MiB > the default 256 MiB chunk: a chunk of its own.
  expect_all_verified(run_gpu({"-n", "2", kGpuProgram, "handoff", "2", "314572800", "pool"}), 2, 2);
}

TEST(GpuQueue, CudaMallocTensorsArriveBitExactThroughIpcHandles) {
  NODAL_REQUIRE_GPUS(1);
  expect_all_verified(run_gpu({"-n", "2", kGpuProgram, "handoff", "50", "1024", "external"}), 2, 50);
  expect_all_verified(run_gpu({"-n", "4", kGpuProgram, "handoff", "10", "1048577", "external"}), 4, 10);
}

TEST(GpuQueue, ConsumerReadsPoolTensorsAfterTheProducerExited) {
  NODAL_REQUIRE_GPUS(1);
  ChildResult r = run_gpu({"-n", "2", kGpuProgram, "producer_exits", "1048576"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[1] after the producer exited: verified 4 of 4")) << r.out;
}

TEST(GpuQueue, ADeadConsumersReferenceIsReleased) {
  NODAL_REQUIRE_GPUS(1);
  ChildResult r = run_gpu({"-n", "2", kGpuProgram, "consumer_dies", "1048576"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "[0] block reused after the consumer died")) << r.out;
}

TEST(GpuQueueWithoutGpu, AJobThatNeedsAGpuFailsWithTheReason) {
  if (nodal::cuda::available()) GTEST_SKIP() << "a GPU is available here";
  ChildResult r = run_gpu({"-n", "2", kGpuProgram, "handoff", "1", "1024", "pool"}, 60s);
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out + r.err, nodal::cuda::unavailable_reason())) << r.out << r.err;
}

}  // namespace
}  // namespace nodal::testing
