// Parallel feature extraction with nodal::Pool, the torch.multiprocessing.Pool way but without a
// copy: the Fashion-MNIST images go into one shared tensor, each task gets a slice of it and a
// slice of one shared feature tensor and writes its images' HOG features there in place; the
// parent then fits a linear classifier on the train features and scores it on the test images.
//
//   build/release/examples/fashion_features/fashion_features [--workers 2] [--start-method forkserver]
//
// A worker that dies or throws fails its task with an error naming the task (the program exits 1
// with it); the parent checks a sample of rows against its own extraction, bit for bit.
#include "../fashion_mnist/idx.hpp"
#include "classifier.hpp"
#include "hog.hpp"

#include <nodal/errors.hpp>
#include <nodal/pool.hpp>
#include <nodal/tensor.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace {

using Clock = std::chrono::steady_clock;
namespace fm = fashion_mnist;
namespace ff = fashion_features;

struct Options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::size_t workers = 2;
  nodal::StartMethod start_method = nodal::StartMethod::fork;
  std::int64_t chunk = 500;
  std::int64_t train_subset = 0;
  std::int64_t test_subset = 0;
  double lambda = 1.0;
};

/// The first `subset` samples of a split (0: all) in a shared tensor u8 [n, 784], and their labels.
std::pair<nodal::Tensor, std::vector<std::uint8_t>> load(const Options& o, fm::SplitKind kind, std::int64_t subset) {
  fm::Split split = fm::load_split(o.data_dir, kind);
  const std::int64_t n = subset > 0 ? std::min(subset, split.count) : split.count;
  nodal::Tensor images = nodal::Tensor::empty_shared({n, fm::kImageSize}, nodal::DType::u8);
  std::memcpy(images.data(), split.pixels.data(), static_cast<std::size_t>(n) * fm::kImageSize);
  split.labels.resize(static_cast<std::size_t>(n));
  return {images, std::move(split.labels)};
}

/// The HOG features of `images`, made by the pool's workers, `chunk` rows per task.
nodal::Tensor extract(nodal::Pool& pool, const nodal::Tensor& images, std::int64_t chunk) {
  const std::int64_t n = images.shape()[0];
  nodal::Tensor features = nodal::Tensor::empty_shared({n, ff::kFeatures}, nodal::DType::f32);
  std::vector<std::tuple<nodal::Tensor, nodal::Tensor>> tasks;
  for (std::int64_t begin = 0; begin < n; begin += chunk) {
    const std::int64_t end = std::min(n, begin + chunk);
    tasks.emplace_back(images.slice(begin, end), features.slice(begin, end));
  }
  const std::vector<std::int64_t> rows = pool.starmap(&ff::hog_rows, tasks);
  if (std::accumulate(rows.begin(), rows.end(), std::int64_t{0}) != n) {
    throw std::runtime_error("the workers did not cover every image");
  }
  return features;
}

/// Recomputes `samples` rows spread over the tensor here and compares them bit for bit.
void check_sample(const nodal::Tensor& images, const nodal::Tensor& features, std::int64_t samples) {
  const std::int64_t n = images.shape()[0];
  std::vector<float> mine(ff::kFeatures);
  for (std::int64_t k = 0; k < std::min(samples, n); ++k) {
    const std::int64_t row = k * n / std::min(samples, n);
    ff::hog(images.data_ptr<std::uint8_t>() + row * fm::kImageSize, mine.data());
    if (std::memcmp(mine.data(), features.data_ptr<float>() + row * ff::kFeatures, sizeof(float) * ff::kFeatures) != 0) {
      throw std::runtime_error(fmt::format("row {}: the workers' features differ from the parent's", row));
    }
  }
}

int run(const Options& o) {
  auto [train_images, train_labels] = load(o, fm::SplitKind::train, o.train_subset);
  auto [test_images, test_labels] = load(o, fm::SplitKind::test, o.test_subset);
  nodal::Pool pool(o.workers, {.start_method = o.start_method});
  const auto start = Clock::now();
  const nodal::Tensor train_features = extract(pool, train_images, o.chunk);
  const nodal::Tensor test_features = extract(pool, test_images, o.chunk);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  pool.close();
  pool.join();
  const std::int64_t images = train_images.shape()[0] + test_images.shape()[0];
  fmt::print("HOG features of {} images ({} per image) by {} worker{} in {:.2f} s: {:.0f} images/s\n", images,
             ff::kFeatures, o.workers, o.workers == 1 ? "" : "s", seconds, static_cast<double>(images) / seconds);
  check_sample(train_images, train_features, 64);
  check_sample(test_images, test_features, 64);
  fmt::print("128 rows recomputed by the parent: identical\n");
  const ff::LinearClassifier model = ff::fit(train_features, train_labels.data(), fm::kClasses, o.lambda);
  fmt::print("linear classifier on HOG features: train accuracy {:.4f}, test accuracy {:.4f} ({} train, {} test)\n",
             ff::accuracy(model, train_features, train_labels.data()),
             ff::accuracy(model, test_features, test_labels.data()), train_images.shape()[0],
             test_images.shape()[0]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("HOG features of the Fashion-MNIST images by a nodal::Pool, then a linear classifier");
  app.add_option("--data-dir", o.data_dir, "directory with the four *-ubyte.gz IDX files");
  app.add_option("--workers", o.workers, "worker processes")->check(CLI::Range(1, 256));
  const std::map<std::string, nodal::StartMethod> methods{{"fork", nodal::StartMethod::fork},
                                                          {"forkserver", nodal::StartMethod::forkserver}};
  app.add_option("--start-method", o.start_method, "how workers are made: fork or forkserver")
      ->transform(CLI::CheckedTransformer(methods));
  app.add_option("--chunk", o.chunk, "images per task")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--train-subset", o.train_subset, "use the first N training images (0: all 60000)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--test-subset", o.test_subset, "use the first N test images (0: all 10000)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lambda", o.lambda, "ridge penalty of the classifier")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const fm::DataError& e) {
    fmt::print(stderr, "fashion_features: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fashion_features: {}\n", e.what());
    return 1;
  }
}
