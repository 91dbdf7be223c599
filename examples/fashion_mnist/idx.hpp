// Fashion-MNIST's files: gzip-compressed IDX (Yann LeCun's MNIST format, which Fashion-MNIST
// keeps): a big-endian header (magic 0x00000803 for 3-d u8 images, 0x00000801 for 1-d u8 labels,
// then one u32 per dimension), then the bytes.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace fashion_mnist {

/// A missing, unreadable or malformed data file. what() names the file, what is wrong with it and
/// where the files come from (Debian's dataset-fashion-mnist package).
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kImageRows = 28;
inline constexpr int kImageCols = 28;
inline constexpr int kImageSize = kImageRows * kImageCols;
inline constexpr int kClasses = 10;

/// One split of the data set, as stored: pixels u8 [count, 784] row-major, labels u8 [count] in 0..9.
struct Split {
  std::int64_t count = 0;
  std::vector<std::uint8_t> pixels;
  std::vector<std::uint8_t> labels;
};

enum class SplitKind { train, test };

/// Reads `dir`/train-*-ubyte.gz (60000 samples) or `dir`/t10k-*-ubyte.gz (10000), checking the
/// magic numbers, the counts, the 28x28 dimensions, the sizes (no short read, no trailing bytes)
/// and the labels' range. Throws DataError.
Split load_split(const std::string& dir, SplitKind kind);

/// The expected sample count of a split: 60000 or 10000.
std::int64_t split_size(SplitKind kind);

}  // namespace fashion_mnist
