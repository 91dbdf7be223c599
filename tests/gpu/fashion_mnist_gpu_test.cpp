// The README's main job with its gradient allreduce on the GPU (`fashion_mnist --device cuda`): two
// trainers sharing GPU 0 (the CUDA IPC collectives) train a few steps on a generated data set and
// must reach the weights of the same job on the CPU, bit for bit: each step's allreduce adds two
// rows per element (one order on every path), and the CUDA IPC path's sums are the CPU path's.
// Label gpu: skips (fails under NODAL_REQUIRE_GPU=1) without a usable GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/fashion_mnist.hpp"
#include "../support/gpu.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

TEST(FashionMnistGpu, CudaAllreduceReachesTheCpuWeightsBitwise) {
  NODAL_REQUIRE_GPUS(1);
  TempDir dir("nodal-fashion-mnist-gpu");
  write_synthetic_fashion_mnist(dir.path());
  auto train = [&](std::vector<std::string> launch, const std::string& device) {
    const std::string weights = dir / ("weights-" + device);
    for (const std::string& arg : {kFashionMnist, std::string("--data-dir"), dir.path(), std::string("--device"), device,
                                   std::string("--train-subset"), std::string("2048"), std::string("--epochs"),
                                   std::string("1"), std::string("--test-subset"), std::string("1000"),
                                   std::string("--dump-weights"), weights}) {
      launch.push_back(arg);
    }
    ChildResult r = run(nodalrun_command(launch), 240s);
    EXPECT_EQ(r.exit_code, 0) << device << ":\n" << r.out << r.err;
    EXPECT_NE(r.out.find("the same on every trainer"), std::string::npos) << r.out;
    return read_file(weights);
  };
  const std::string cpu = train({"-n", "2"}, "cpu");
  const std::string cuda = train({"-n", "2", "--gpus", "0", "--ranks-per-gpu", "2"}, "cuda");
  ASSERT_EQ(cpu.size(), 235146 * sizeof(float));
  EXPECT_EQ(first_difference(cpu, cuda), "equal");
}

}  // namespace
}  // namespace nodal::testing
