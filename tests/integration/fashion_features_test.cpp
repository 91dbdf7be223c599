// examples/fashion_features: a nodal::Pool extracting HOG features of Fashion-MNIST images into
// one shared tensor, by fork and by forkserver workers: every row is what the parent computes
// itself, and the features carry the classes (a linear classifier on them scores well above the
// 10% of chance). A missing data directory is one clear error.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "../support/child_process.hpp"
#include "../support/fashion_mnist.hpp"

namespace nodal::testing {
namespace {

using namespace std::chrono_literals;

const std::string kFashionFeatures = NODAL_TEST_FASHION_FEATURES;

class FashionFeatures : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_fashion_mnist_data()) {
      GTEST_SKIP() << kFashionMnistData << " is missing: install dataset-fashion-mnist (scripts/setup-debian.sh)";
    }
  }
};

TEST_P(FashionFeatures, PoolWorkersWriteFeaturesThatClassify) {
  const ChildResult r = run({kFashionFeatures, "--start-method", GetParam(), "--workers", "2", "--chunk", "250",
                             "--train-subset", "6000", "--test-subset", "1000"},
                            120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("HOG features of 7000 images (324 per image) by 2 workers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("128 rows recomputed by the parent: identical"), std::string::npos) << r.out;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(r.out, match, std::regex("test accuracy ([0-9.]+) \\(6000 train, 1000 test\\)")))
      << r.out;
  EXPECT_GT(std::stod(match[1]), 0.78) << "HOG + a linear classifier scores ~0.83 on this subset";
}

INSTANTIATE_TEST_SUITE_P(StartMethods, FashionFeatures, ::testing::Values("fork", "forkserver"));

TEST(FashionFeaturesData, AMissingDirectoryIsOneClearError) {
  const ChildResult r = run({kFashionFeatures, "--data-dir", "/nonexistent-fashion-mnist"}, 60s);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("/nonexistent-fashion-mnist/train-images-idx3-ubyte.gz: cannot open it"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("dataset-fashion-mnist"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace nodal::testing
