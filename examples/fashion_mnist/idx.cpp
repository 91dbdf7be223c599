#include "idx.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

namespace fashion_mnist {
namespace {

constexpr std::uint32_t kImagesMagic = 0x00000803;  // 2051: u8, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // 2049: u8, 1 dimension

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError(fmt::format(
      "{}: {}. The Fashion-MNIST files come from Debian's dataset-fashion-mnist package (sudo apt-get install "
      "dataset-fashion-mnist, or scripts/setup-debian.sh), or --data-dir names a directory with the four "
      "*-ubyte.gz files",
      path, what));
}

/// A gzip file read from the start. zlib also reads a file that is not compressed as it is, which
/// lets a test (or a user) hand in plain IDX files.
class GzipFile {
 public:
  explicit GzipFile(std::string path) : path_(std::move(path)), file_(open(path_)) {
    if (file_ == nullptr) {
      fail(path_, errno != 0 ? fmt::format("cannot open it: {}", std::strerror(errno)) : "cannot open it");
    }
  }
  GzipFile(const GzipFile&) = delete;
  GzipFile& operator=(const GzipFile&) = delete;
  ~GzipFile() { gzclose(file_); }

  /// Exactly `size` bytes, or DataError naming what was wanted (`what`) and what was found.
  void read(void* data, std::size_t size, const char* what) {
    std::size_t done = 0;
    while (done < size) {
      // gzread takes an unsigned int count: read in pieces of at most 1 GiB.
      const auto piece = static_cast<unsigned>(std::min<std::size_t>(size - done, std::size_t{1} << 30));
      const int n = gzread(file_, static_cast<char*>(data) + done, piece);
      if (n < 0) fail(path_, fmt::format("corrupt gzip data while reading {}: {}", what, error()));
      if (n == 0) {
        fail(path_, fmt::format("short read: the file ends after {} bytes of {} ({} expected){}", done, what, size,
                                error().empty() ? "" : fmt::format(" ({})", error())));
      }
      done += static_cast<std::size_t>(n);
    }
  }

  std::uint32_t read_u32_big_endian(const char* what) {
    unsigned char bytes[4];
    read(bytes, sizeof bytes, what);
    return std::uint32_t{bytes[0]} << 24 | std::uint32_t{bytes[1]} << 16 | std::uint32_t{bytes[2]} << 8 | bytes[3];
  }

  /// Whether the data ends here (a longer file is as suspect as a shorter one).
  void expect_end() {
    char extra = 0;
    const int n = gzread(file_, &extra, 1);
    if (n < 0) fail(path_, fmt::format("corrupt gzip data at the end: {}", error()));
    if (n > 0) fail(path_, "trailing bytes after the data: not the expected IDX file");
  }

  const std::string& path() const { return path_; }

 private:
  static gzFile open(const std::string& path) {
    errno = 0;  // gzopen sets it only when open() failed
    return gzopen(path.c_str(), "rb");
  }

  std::string error() {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code == Z_OK || message == nullptr) return {};
    // zlib writes "<path>: <what>"; the path is in our message already.
    std::string text(message);
    if (text.starts_with(path_ + ": ")) text.erase(0, path_.size() + 2);
    return text;
  }

  std::string path_;
  gzFile file_;
};

void expect_magic(GzipFile& file, std::uint32_t expected, const char* kind) {
  const std::uint32_t magic = file.read_u32_big_endian("the magic number");
  if (magic != expected) {
    fail(file.path(),
         fmt::format("bad magic number 0x{:08x} (expected 0x{:08x} = {} for IDX {})", magic, expected, expected, kind));
  }
}

void expect_dimension(GzipFile& file, const char* name, std::uint32_t expected) {
  const std::uint32_t value = file.read_u32_big_endian(name);
  if (value != expected) fail(file.path(), fmt::format("wrong {}: {} (expected {})", name, value, expected));
}

std::vector<std::uint8_t> read_images(const std::string& path, std::int64_t count) {
  GzipFile file(path);
  expect_magic(file, kImagesMagic, "images");
  expect_dimension(file, "image count", static_cast<std::uint32_t>(count));
  expect_dimension(file, "row count", kImageRows);
  expect_dimension(file, "column count", kImageCols);
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(count) * kImageSize);
  file.read(pixels.data(), pixels.size(), "the pixels");
  file.expect_end();
  return pixels;
}

std::vector<std::uint8_t> read_labels(const std::string& path, std::int64_t count) {
  GzipFile file(path);
  expect_magic(file, kLabelsMagic, "labels");
  expect_dimension(file, "label count", static_cast<std::uint32_t>(count));
  std::vector<std::uint8_t> labels(static_cast<std::size_t>(count));
  file.read(labels.data(), labels.size(), "the labels");
  file.expect_end();
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= kClasses) fail(path, fmt::format("label {} of sample {} is not a class (0..9)", labels[i], i));
  }
  return labels;
}

}  // namespace

std::int64_t split_size(SplitKind kind) { return kind == SplitKind::train ? 60000 : 10000; }

Split load_split(const std::string& dir, SplitKind kind) {
  const std::string prefix = dir + (kind == SplitKind::train ? "/train" : "/t10k");
  Split split;
  split.count = split_size(kind);
  split.pixels = read_images(prefix + "-images-idx3-ubyte.gz", split.count);
  split.labels = read_labels(prefix + "-labels-idx1-ubyte.gz", split.count);
  return split;
}

}  // namespace fashion_mnist
