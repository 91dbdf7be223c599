// What the Fashion-MNIST example's tests share: the program, its data, a scratch directory.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>

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

/// A fresh directory, removed with everything in it when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string name = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(name.data()) == nullptr) throw std::system_error(errno, std::generic_category(), "mkdtemp");
    path_ = name;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace nodal::testing
