// The README's main job, small: data parallelism that is exact (1, 2 and 4 trainers reach the same
// weights, bit for bit) and data files that are checked (a missing or corrupt file is one clear
// error naming the file and the package, never a crash).
#include <nodal/cuda.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/fashion_mnist.hpp"
#include "../support/paths.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class FashionMnist : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_fashion_mnist_data()) {
      GTEST_SKIP() << kFashionMnistData << " is missing: install dataset-fashion-mnist (scripts/setup-debian.sh)";
    }
  }
};

// 2 epochs of 8 steps of 256 samples: 4 shards of 64, shared 4, 2 or 1 at a time. The 2-trainer run
// has 2 DataLoader workers each, the others 1: neither may matter.
TEST_F(FashionMnist, OneTwoAndFourTrainersReachBitwiseIdenticalWeights) {
  TempDir dir("nodal-fashion-mnist");
  auto train = [&](std::vector<std::string> launch, std::vector<std::string> job, const std::string& name) {
    const std::string weights = dir / name;
    launch.push_back(kFashionMnist);
    launch.insert(launch.end(), job.begin(), job.end());
    for (const char* arg : {"--train-subset", "2048", "--epochs", "2", "--test-subset", "500", "--dump-weights"}) {
      launch.emplace_back(arg);
    }
    launch.push_back(weights);
    ChildResult r = run(nodalrun_command(launch), 240s);
    EXPECT_EQ(r.exit_code, 0) << name << ":\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.out, "the same on every trainer")) << r.out;
    return read_file(weights);
  };
  const std::string one = train({"-n", "1"}, {}, "one");
  const std::string two = train({"-n", "2"}, {"--num-workers", "2"}, "two");
  const std::string four = train({"-n", "4"}, {}, "four");
  const std::string other_seed = train({"-n", "1"}, {"--seed", "2"}, "other-seed");
  ASSERT_EQ(one.size(), 235146 * sizeof(float));  // 784*256+256 + 256*128+128 + 128*10+10
  EXPECT_EQ(first_difference(one, two), "equal");
  EXPECT_EQ(first_difference(one, four), "equal");
  EXPECT_NE(first_difference(one, other_seed), "equal") << "another seed must give other weights";
}

/// A data directory with the real files except those a test replaces.
class FashionMnistData : public FashionMnist {
 protected:
  void SetUp() override {
    FashionMnist::SetUp();
    for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                             "t10k-labels-idx1-ubyte.gz"}) {
      fs::create_symlink(kFashionMnistData + "/" + name, dir_ / name);
    }
  }

  /// Replaces a file with `bytes` (uncompressed: zlib reads such a file as it is).
  void replace(const std::string& name, const std::string& bytes) {
    fs::remove(dir_ / name);
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }

  /// The job run alone (rank 0 of 1) on the directory: it must fail cleanly, with `expected` in
  /// its one line of error.
  void expect_error(const std::string& expected) {
    ChildResult r = run({kFashionMnist, "--data-dir", dir_.path(), "--epochs", "1"}, 120s);
    EXPECT_EQ(r.exit_code, 1) << r.err;  // not 134 (abort) or 139 (SIGSEGV)
    EXPECT_TRUE(contains(r.err, "fashion_mnist: error: " + expected)) << r.err;
    EXPECT_TRUE(contains(r.err, "dataset-fashion-mnist")) << "the package is not named: " << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
  }

  static std::string big_endian(std::uint32_t value) {
    return {static_cast<char>(value >> 24), static_cast<char>(value >> 16), static_cast<char>(value >> 8),
            static_cast<char>(value)};
  }

  TempDir dir_{"nodal-fashion-mnist-data"};
};

TEST_F(FashionMnistData, AMissingFileIsNamed) {
  fs::remove(dir_ / "t10k-labels-idx1-ubyte.gz");
  expect_error(dir_ / "t10k-labels-idx1-ubyte.gz" + ": cannot open it: No such file or directory");
}

TEST_F(FashionMnistData, ABadMagicNumberIsNamed) {
  replace("train-images-idx3-ubyte.gz", big_endian(2049) + big_endian(60000) + big_endian(28) + big_endian(28));
  expect_error(dir_ / "train-images-idx3-ubyte.gz" + ": bad magic number 0x00000801 (expected 0x00000803 = 2051");
}

TEST_F(FashionMnistData, ATruncatedGzipFileIsAShortRead) {
  const std::string whole = read_file(kFashionMnistData + "/train-images-idx3-ubyte.gz");
  replace("train-images-idx3-ubyte.gz", whole.substr(0, whole.size() / 2));
  expect_error(dir_ / "train-images-idx3-ubyte.gz" + ": short read");
}

TEST_F(FashionMnistData, AWrongCountIsNamed) {
  replace("train-labels-idx1-ubyte.gz", big_endian(2049) + big_endian(59999) + std::string(59999, '\0'));
  expect_error(dir_ / "train-labels-idx1-ubyte.gz" + ": wrong label count: 59999 (expected 60000)");
}

TEST_F(FashionMnistData, NodalrunReportsTheRankAndTheFile) {
  fs::remove(dir_ / "train-images-idx3-ubyte.gz");
  ChildResult r = run(nodalrun_command({"-n", "2", kFashionMnist, "--data-dir", dir_.path()}), 120s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "failed first")) << r.err;
  EXPECT_TRUE(contains(r.err, dir_ / "train-images-idx3-ubyte.gz" + ": cannot open it")) << r.err;
}

// The synthetic data set the GPU test trains on (tests/gpu/fashion_mnist_gpu_test.cpp) is valid
// IDX that the job learns from: checked here, on every machine.
TEST(FashionMnistSynthetic, TwoTrainersLearnTheGeneratedData) {
  TempDir dir("nodal-fashion-mnist-synthetic");
  write_synthetic_fashion_mnist(dir.path());
  ChildResult r = run(nodalrun_command({"-n", "2", kFashionMnist, "--data-dir", dir.path(), "--train-subset", "2048",
                                        "--epochs", "1", "--test-subset", "1000"}),
                      240s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "the same on every trainer")) << r.out;
  const std::regex accuracy(R"(test accuracy ([0-9.]+) after)");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(r.out, match, accuracy)) << r.out;
  EXPECT_GT(std::stod(match[1]), 0.5) << "ten classes guessed give 0.1:\n" << r.out;
}

TEST(FashionMnistOptions, CudaWithoutAGpuSaysWhy) {
  if (nodal::cuda::available()) GTEST_SKIP() << "a GPU is available here: tests/gpu run --device cuda";
  ChildResult r = run({kFashionMnist, "--device", "cuda"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--device cuda: " + nodal::cuda::unavailable_reason())) << r.err;
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
}

}  // namespace
}  // namespace nodal::testing
