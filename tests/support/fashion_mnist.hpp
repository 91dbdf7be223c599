// What the Fashion-MNIST example's tests share: the program, its data (and temp_dir.hpp).
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <utility>

#include "temp_dir.hpp"

namespace nodal::testing {

inline const std::string kFashionMnist = NODAL_TEST_FASHION_MNIST;
/// Where Debian's dataset-fashion-mnist puts the files (the example's default --data-dir).
inline const std::string kFashionMnistData = "/usr/share/datasets/fashion-mnist";

/// Whether the four data files are there (scripts/setup-debian.sh installs them).
inline bool have_fashion_mnist_data() {
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                           "t10k-labels-idx1-ubyte.gz"}) {
    if (!std::filesystem::exists(kFashionMnistData + "/" + name)) return false;
  }
  return true;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// "equal", or where two weight files (--dump-weights: f32 values) first differ.
inline std::string first_difference(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (std::size_t i = 0; i + sizeof(float) <= a.size(); i += sizeof(float)) {
    if (std::memcmp(a.data() + i, b.data() + i, sizeof(float)) == 0) continue;
    float x = 0, y = 0;
    std::memcpy(&x, a.data() + i, sizeof x);
    std::memcpy(&y, b.data() + i, sizeof y);
    return "weight " + std::to_string(i / sizeof(float)) + ": " + std::to_string(x) + " vs " + std::to_string(y);
  }
  return "equal";
}

/// Writes a synthetic Fashion-MNIST into `dir` (the four files under their usual names, as
/// uncompressed IDX: zlib's gzread reads a file without a gzip header as it is), for tests that
/// must run where Debian's dataset is not (the GPU machine has no package archive). Sample i has
/// label i % 10 and a bright bar whose rows depend on the label, over deterministic noise: a model
/// learns it within a few steps. Throws std::system_error when a file cannot be written.
inline void write_synthetic_fashion_mnist(const std::string& dir) {
  auto big_endian = [](std::uint32_t value) {
    return std::string{static_cast<char>(value >> 24), static_cast<char>(value >> 16), static_cast<char>(value >> 8),
                       static_cast<char>(value)};
  };
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out << bytes;
    if (!out.flush()) throw std::system_error(errno, std::generic_category(), "writing " + dir + "/" + name);
  };
  std::uint32_t noise = 12345;
  for (auto [prefix, count] : {std::pair<const char*, std::uint32_t>{"train", 60000}, {"t10k", 10000}}) {
    std::string images = big_endian(2051) + big_endian(count) + big_endian(28) + big_endian(28);
    std::string labels = big_endian(2049) + big_endian(count);
    images.reserve(images.size() + std::size_t{count} * 784);
    for (std::uint32_t i = 0; i < count; ++i) {
      const int label = static_cast<int>(i % 10);
      labels.push_back(static_cast<char>(label));
      for (int row = 0; row < 28; ++row) {
        for (int column = 0; column < 28; ++column) {
          noise = noise * 1664525u + 1013904223u;  // Numerical Recipes' LCG
          const bool bar = row >= 2 * label + 2 && row < 2 * label + 6;
          images.push_back(static_cast<char>((bar ? 160 : 0) + (noise >> 26)));
        }
      }
    }
    write(std::string(prefix) + "-images-idx3-ubyte.gz", images);
    write(std::string(prefix) + "-labels-idx1-ubyte.gz", labels);
  }
}

}  // namespace nodal::testing
