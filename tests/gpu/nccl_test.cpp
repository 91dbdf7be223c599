// The NCCL backend on real GPUs (label gpu). Every test skips, saying why, where no GPU can be
// used (nodal::cuda::unavailable_reason()) or where it needs more GPUs than there are. NCCL 2.28
// refuses two ranks on one GPU ("Duplicate GPU detected"), so one GPU allows one rank only.
#include <nodal/cuda.hpp>

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/gpu.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

const std::string kNcclProgram = NODAL_TEST_NCCL_PROGRAM;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

#define NODAL_REQUIRE_NCCL_GPUS(n) \
  NODAL_REQUIRE_GPUS(n, nodal::cuda::built_with_nccl() ? "" : "nodal was built without NCCL")

std::string describe(const ChildResult& r) { return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err; }

TEST(NcclGpu, OneRankEveryOpAndDtypeMatchesTheCpuPath) {
  NODAL_REQUIRE_NCCL_GPUS(1);
  // A singleton (no nodalrun): rank 0 of 1 on cuda:0, forced onto NCCL.
  const ChildResult r = run({kNcclProgram, "ops"}, 300s, {"NODAL_GPU_BACKEND=nccl"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "nccl ops ok")) << describe(r);
}

TEST(NcclGpu, OneRankUnderNodalrun) {
  NODAL_REQUIRE_NCCL_GPUS(1);
  const ChildResult r =
      run({kNodalrun, "--gpus", "0", "-n", "1", kNcclProgram, "ops"}, 300s, {"NODAL_GPU_BACKEND=nccl"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "nccl ops ok: ")) << describe(r);
}

TEST(NcclGpu, OneRankPerGpuOnEveryGpu) {
  NODAL_REQUIRE_NCCL_GPUS(2);
  const int n = nodal::cuda::device_count();
  // The automatic choice must be NCCL here (one rank per GPU); the program checks last_algorithm().
  const ChildResult r = run({kNodalrun, "--gpus", "all", "-n", std::to_string(n), kNcclProgram, "ops"}, 600s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "on " + std::to_string(n) + " rank(s)")) << describe(r);
}

TEST(NcclGpu, KilledRankMidAllreduceIsPeerFailureNotAHang) {
  NODAL_REQUIRE_NCCL_GPUS(2);
  const auto start = std::chrono::steady_clock::now();
  const ChildResult r = run({kNodalrun, "--gpus", "all", "-n", "2", kNcclProgram, "fault"}, 120s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.timed_out) << "the surviving rank hung: " << describe(r);
  // nodalrun exits with the first failing rank's code: rank 1's SIGKILL.
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << describe(r);
  EXPECT_TRUE(contains(r.out, "rank 1: dying now")) << describe(r);
  // Rank 0 got PeerFailure from the pending allreduce (within ~100 ms of the abort word; the
  // launcher's grace may then SIGTERM it, so it is checked only when it printed).
  const std::regex failure(R"(rank 0: PeerFailure after ([0-9.]+) ms)");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(r.out, match, failure)) << describe(r);
  EXPECT_LT(std::stod(match[1]), 5000.0) << describe(r);
  EXPECT_LT(seconds, 60.0) << describe(r);
}

}  // namespace
}  // namespace nodal::testing
