// The CUDA IPC collectives (ranks sharing one GPU) under nodalrun: every collective x op x dtype x
// size, in place and out of place, pool and cudaMalloc tensors, bitwise against the CPU path, for
// 2, 4 and 8 ranks on GPU 0; and a rank SIGKILLed in a 64 MiB allreduce: the others get
// PeerFailure within a second and nodalrun exits 137. Skips without a GPU (saying why).
//
// Two sizes of matrix, so that a hang costs minutes: by default a short one (4 dtypes that cover
// the integer, 16-bit float and wide float kernels, 3 sizes that cover one-pass, pipelined and
// odd-sized calls; ~220 cases, nodalrun --timeout 240); NODAL_IPC_MATRIX=full runs every dtype at
// 5 sizes (~800 cases, --timeout 600), as scripts/gpu-check.sh's tests-more step does.
#include <gtest/gtest.h>
#include <nodal/cuda.hpp>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/gpu.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

#ifdef NODAL_TEST_IPC_PROGRAM
const std::string kIpcProgram = NODAL_TEST_IPC_PROGRAM;
#else
const std::string kIpcProgram;
#endif

#define SKIP_WITHOUT_GPU() \
  NODAL_REQUIRE_GPUS(1, kIpcProgram.empty() ? "ipc_program was not built (no CUDA at build)" : "")

bool full_matrix() {
  const char* value = std::getenv("NODAL_IPC_MATRIX");
  return value != nullptr && std::string(value) == "full";
}

/// nodalrun's --timeout for one matrix run.
int matrix_timeout_s() { return full_matrix() ? 600 : 240; }

/// The matrix's selection (ipc_program matrix KEY=VALUE) in the short mode; nothing in the full one.
std::vector<std::string> matrix_selection() {
  if (full_matrix()) return {};
  return {"dtypes=f32,bf16,i32,f64", "sizes=1,1003,1048581"};
}

ChildResult run_ipc(int n, const std::vector<std::string>& args, int timeout_s) {
  std::vector<std::string> argv = {"-n",          std::to_string(n), "--gpus", "0", "--ranks-per-gpu", std::to_string(n),
                                   "--timeout",   std::to_string(timeout_s)};
  argv.push_back(kIpcProgram);
  argv.insert(argv.end(), args.begin(), args.end());
  return run(nodalrun_command(argv), std::chrono::seconds(timeout_s + 30));
}

int ok_ranks(const std::string& out) { return count_lines(out, R"(rank \d+ ok \d+ checks in \d+ ms \(cuda_ipc\))"); }

class IpcMatrix : public ::testing::TestWithParam<int> {};

TEST_P(IpcMatrix, EveryOpAndDtypeMatchesTheCpuPathBitwise) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  std::vector<std::string> args = {"matrix"};
  for (const std::string& a : matrix_selection()) args.push_back(a);
  ChildResult result = run_ipc(n, args, matrix_timeout_s());
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_EQ(ok_ranks(result.out), n) << result.out << result.err;
}

TEST_P(IpcMatrix, EveryVariantOfLargeFloatCalls) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  // Both algorithms (one pass up to 256 KiB, reduce-scatter + all-gather above) in all four variants.
  ChildResult result = run_ipc(n, {"matrix", "colls=allreduce,reduce,reduce_scatter", "dtypes=f16,bf16,f32,f64",
                                   "sizes=65536,4194305", "variants=all", "seed=7"},
                               matrix_timeout_s());
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_EQ(ok_ranks(result.out), n) << result.out << result.err;
}

TEST_P(IpcMatrix, SmallOnePassThresholdMovedBothWays) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  for (const char* threshold : {"0", "64MiB"}) {
    const int timeout_s = matrix_timeout_s();
    std::vector<std::string> argv = {"-n", std::to_string(n), "--gpus", "0", "--ranks-per-gpu", std::to_string(n),
                                     "--timeout", std::to_string(timeout_s), kIpcProgram, "matrix",
                                     "dtypes=i32,bf16,f64", "sizes=1,1003,1048581"};
    ChildResult result = run(nodalrun_command(argv), std::chrono::seconds(timeout_s + 30),
                             {std::string("NODAL_IPC_ONE_PASS_MAX_BYTES=") + threshold});
    EXPECT_EQ(result.exit_code, 0) << threshold << "\n" << result.out << result.err;
    EXPECT_EQ(ok_ranks(result.out), n) << threshold << "\n" << result.out << result.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, IpcMatrix, ::testing::Values(2, 4, 8));

TEST(IpcFaults, RankKilledMidAllreduceEndsTheOthersWithPeerFailure) {
  SKIP_WITHOUT_GPU();
  const int n = 4;
  ChildResult result = run_ipc(n, {"kill", "victim=3", "delay_ms=500"}, 120);
  EXPECT_EQ(result.exit_code, 137) << result.out << result.err;
  static const std::regex line(R"(rank (\d+) PeerFailure after ([0-9.]+) ms)");
  int survivors = 0;
  for (const std::string& l : lines_of(result.out)) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    ++survivors;
    EXPECT_LT(std::stod(m[2]), 1000.0) << l;
    EXPECT_GE(std::stod(m[2]), 0.0) << l;
  }
  EXPECT_EQ(survivors, n - 1) << result.out << result.err;
}

}  // namespace
}  // namespace nodal::testing
