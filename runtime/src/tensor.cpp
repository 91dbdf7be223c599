#include <nodal/tensor.hpp>

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/units.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace nodal {
namespace {

void check_device(Device device) {
  if (device.kind == Device::Kind::cuda && device.index < 0) {
    throw UsageError(fmt::format("nodal::Tensor: device cuda:{} has a negative index", device.index));
  }
}

bool on_cuda(const Tensor& t) { return t.device().kind == Device::Kind::cuda; }

/// A private contiguous cuda tensor on `device` (from this rank's GPU pool).
Tensor cuda_empty(std::vector<std::int64_t> shape, DType dtype, Device device);

/// Bytes of a contiguous tensor of this shape; UsageError for a shape no tensor can have.
std::size_t checked_nbytes(const std::vector<std::int64_t>& shape, DType dtype) {
  if (shape.size() > static_cast<std::size_t>(Tensor::kMaxDims)) {
    throw UsageError(fmt::format("nodal::Tensor: shape [{}] has {} dimensions; at most {} are supported",
                                 fmt::join(shape, ", "), shape.size(), Tensor::kMaxDims));
  }
  std::int64_t bytes = static_cast<std::int64_t>(element_size(dtype));
  for (std::int64_t size : shape) {
    if (size < 0)
      throw UsageError(fmt::format("nodal::Tensor: shape [{}] has a negative size", fmt::join(shape, ", ")));
    if (__builtin_mul_overflow(bytes, size, &bytes)) {
      throw UsageError(fmt::format("nodal::Tensor: shape [{}] of {} does not fit in memory", fmt::join(shape, ", "),
                                   dtype_name(dtype)));
    }
  }
  return static_cast<std::size_t>(bytes);
}

std::int64_t product(const std::vector<std::int64_t>& shape) noexcept {
  std::int64_t n = 1;
  for (std::int64_t size : shape) n *= size;
  return n;
}

/// A contiguous tensor of `shape` over all of `storage`.
Tensor contiguous_over(std::shared_ptr<detail::Storage> storage, std::vector<std::int64_t> shape, DType dtype,
                       Device device = {}) {
  auto strides = detail::contiguous_strides(shape);
  return Tensor(std::move(storage), 0, std::move(shape), std::move(strides), dtype, device);
}

/// Copies the elements of `src`, any strides, into `dst` in row-major order.
void copy_to_contiguous(const Tensor& src, std::byte* dst) {
  const std::size_t element = element_size(src.dtype());
  const std::int64_t n = src.numel();
  if (n == 0) return;
  const auto* base = static_cast<const std::byte*>(src.data());
  if (src.is_contiguous()) {
    std::memcpy(dst, base, static_cast<std::size_t>(n) * element);
    return;
  }
  // Walk the outer dimensions like an odometer; each step copies one row of the last dimension.
  const auto& shape = src.shape();
  const auto& strides = src.strides();
  const int last = src.dim() - 1;  // >= 0: a 0-d tensor is contiguous
  const std::int64_t row = shape[last];
  const std::int64_t step = strides[last];
  std::vector<std::int64_t> index(shape.size(), 0);
  std::int64_t offset = 0;  // in elements, from base
  for (std::int64_t done = 0; done < n; done += row) {
    if (step == 1) {
      std::memcpy(dst, base + offset * static_cast<std::int64_t>(element), static_cast<std::size_t>(row) * element);
      dst += static_cast<std::size_t>(row) * element;
    } else {
      for (std::int64_t i = 0; i < row; ++i, dst += element) {
        std::memcpy(dst, base + (offset + i * step) * static_cast<std::int64_t>(element), element);
      }
    }
    for (int d = last - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= strides[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}

/// Closes a descriptor when the scope ends; the mapping outlives it.
struct FileDescriptor {
  int fd;
  ~FileDescriptor() { ::close(fd); }
};

}  // namespace

namespace detail {

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size());
  std::int64_t stride = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<std::int64_t>(shape[d], 1);
  }
  return strides;
}

std::pair<std::int64_t, std::int64_t> byte_span(const std::vector<std::int64_t>& shape,
                                                const std::vector<std::int64_t>& strides, DType dtype) {
  const auto element = static_cast<std::int64_t>(element_size(dtype));
  std::int64_t low = 0;
  std::int64_t high = element;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::int64_t reach = 0;
    bool overflow =
        __builtin_mul_overflow(shape[d] - 1, strides[d], &reach) || __builtin_mul_overflow(reach, element, &reach);
    std::int64_t& bound = reach < 0 ? low : high;
    if (overflow || __builtin_add_overflow(bound, reach, &bound)) {
      throw UsageError(fmt::format("nodal::Tensor: shape [{}] with strides [{}] spans more than 2^63 bytes",
                                   fmt::join(shape, ", "), fmt::join(strides, ", ")));
    }
  }
  return {low, high};
}

}  // namespace detail

Tensor::Tensor(std::shared_ptr<detail::Storage> storage, std::int64_t offset_bytes, std::vector<std::int64_t> shape,
               std::vector<std::int64_t> strides, DType dtype, Device device)
    : storage_(std::move(storage)),
      offset_(offset_bytes),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      dtype_(dtype),
      device_(device) {
  check_device(device_);
  bool empty = checked_nbytes(shape_, dtype_) == 0;
  if (!storage_) throw UsageError("nodal::Tensor: no storage given");
  if ((storage_->kind() == detail::Storage::Kind::cuda) != (device_.kind == Device::Kind::cuda) ||
      (device_.kind == Device::Kind::cuda && storage_->device() != device_.index)) {
    throw UsageError(fmt::format("nodal::Tensor: a {} tensor over {} memory", device_name(device_),
                                 storage_->kind() == detail::Storage::Kind::cuda
                                     ? fmt::format("cuda:{}", storage_->device())
                                     : std::string("host")));
  }
  if (strides_.size() != shape_.size()) {
    throw UsageError(fmt::format("nodal::Tensor: {} strides for {} dimensions", strides_.size(), shape_.size()));
  }
  if (offset_ < 0 || static_cast<std::size_t>(offset_) > storage_->bytes()) {
    throw UsageError(
        fmt::format("nodal::Tensor: offset {} is outside a storage of {} bytes", offset_, storage_->bytes()));
  }
  if (empty) return;
  // Every element the strides reach must lie inside the storage.
  auto [low, high] = detail::byte_span(shape_, strides_, dtype_);
  if (low < -offset_ || high > static_cast<std::int64_t>(storage_->bytes()) - offset_) {
    throw UsageError(
        fmt::format("nodal::Tensor: shape [{}] with strides [{}] at offset {} reaches outside a storage of {} bytes",
                    fmt::join(shape_, ", "), fmt::join(strides_, ", "), offset_, storage_->bytes()));
  }
}

Tensor Tensor::empty(std::vector<std::int64_t> shape, DType dtype, Device device) {
  check_device(device);
  if (device.kind == Device::Kind::cuda) return cuda_empty(std::move(shape), dtype, device);
  auto storage = detail::Storage::heap(checked_nbytes(shape, dtype));
  return contiguous_over(std::move(storage), std::move(shape), dtype, device);
}

Tensor Tensor::zeros(std::vector<std::int64_t> shape, DType dtype, Device device) {
  check_device(device);
  if (device.kind == Device::Kind::cuda) {
    Tensor t = cuda_empty(std::move(shape), dtype, device);
    detail::gpu::zero(t.data(), t.nbytes());
    return t;
  }
  auto storage = detail::Storage::heap(checked_nbytes(shape, dtype), /*zero=*/true);
  return contiguous_over(std::move(storage), std::move(shape), dtype, device);
}

Tensor Tensor::empty_shared(std::vector<std::int64_t> shape, DType dtype) {
  auto storage = detail::Storage::arena(detail::job_arena(), checked_nbytes(shape, dtype));
  return contiguous_over(std::move(storage), std::move(shape), dtype);
}

Tensor Tensor::from_file(const std::string& path, DType dtype, std::vector<std::int64_t> shape, FileMode mode) {
  const std::size_t bytes = checked_nbytes(shape, dtype);
  int flags = O_CLOEXEC;
  switch (mode) {
    case FileMode::read_only:
      flags |= O_RDONLY;
      break;
    case FileMode::read_write:
      flags |= O_RDWR;
      break;
    case FileMode::create:
      flags |= O_RDWR | O_CREAT | O_TRUNC;
      break;
  }
  FileDescriptor file{::open(path.c_str(), flags, 0666)};
  if (file.fd < 0) detail::throw_errno(fmt::format("open {}", path));
  if (mode == FileMode::create) {
    if (::ftruncate(file.fd, static_cast<off_t>(bytes)) < 0) detail::throw_errno(fmt::format("ftruncate {}", path));
  } else {
    struct stat st {};
    if (::fstat(file.fd, &st) < 0) detail::throw_errno(fmt::format("fstat {}", path));
    if (static_cast<std::size_t>(st.st_size) < bytes) {
      throw UsageError(fmt::format("Tensor::from_file: {} holds {} but a [{}] {} tensor needs {}", path,
                                   detail::format_bytes(static_cast<std::size_t>(st.st_size)), fmt::join(shape, ", "),
                                   dtype_name(dtype), detail::format_bytes(bytes)));
    }
  }
  std::shared_ptr<detail::Storage> storage;
  try {
    storage = detail::Storage::file(file.fd, bytes, mode != FileMode::read_only);
  } catch (const std::system_error& e) {
    throw std::system_error(e.code(), fmt::format("mmap {}", path));
  }
  return contiguous_over(std::move(storage), std::move(shape), dtype);
}

Tensor& Tensor::share_memory() {
  if (storage_ && !is_shared()) storage_->move_to_arena(detail::job_arena());
  return *this;
}

bool Tensor::is_shared() const noexcept {
  return storage_ && (storage_->kind() == detail::Storage::Kind::arena || storage_->kind() == detail::Storage::Kind::file ||
                      storage_->kind() == detail::Storage::Kind::cuda);
}

bool Tensor::in_arena() const noexcept { return storage_ && storage_->kind() == detail::Storage::Kind::arena; }

std::int64_t Tensor::numel() const noexcept { return defined() ? product(shape_) : 0; }

bool Tensor::is_contiguous() const noexcept {
  // As torch: dimensions of size 1 may have any stride, and a tensor with no elements is contiguous.
  if (numel() == 0) return true;
  std::int64_t expected = 1;
  for (std::size_t d = shape_.size(); d-- > 0;) {
    if (shape_[d] == 1) continue;
    if (strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

void* Tensor::data() const noexcept { return storage_ ? storage_->data() + offset_ : nullptr; }

void Tensor::check_element_type(std::size_t size) const {
  if (size != element_size(dtype_)) {
    throw UsageError(fmt::format("Tensor::data_ptr<T>: T has {} bytes but the tensor's dtype {} has {}", size,
                                 dtype_name(dtype_), element_size(dtype_)));
  }
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  if (!defined()) return {};
  if (on_cuda(*this)) return to(device_, /*copy=*/true);
  Tensor copy = empty(shape_, dtype_, device_);
  copy_to_contiguous(*this, static_cast<std::byte*>(copy.data()));
  return copy;
}

Tensor Tensor::reshape(std::vector<std::int64_t> shape) const {
  if (!defined()) throw UsageError("Tensor::reshape: the tensor is undefined");
  checked_nbytes(shape, dtype_);
  const std::int64_t n = product(shape);
  if (n != numel()) {
    throw UsageError(fmt::format("Tensor::reshape: cannot view [{}] ({} elements) as [{}] ({} elements)",
                                 fmt::join(shape_, ", "), numel(), fmt::join(shape, ", "), n));
  }
  if (!is_contiguous()) {
    throw UsageError(
        fmt::format("Tensor::reshape: the [{}] tensor with strides [{}] is not contiguous; call contiguous() first",
                    fmt::join(shape_, ", "), fmt::join(strides_, ", ")));
  }
  auto strides = detail::contiguous_strides(shape);
  return Tensor(storage_, offset_, std::move(shape), std::move(strides), dtype_, device_);
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  if (dim() == 0) throw UsageError("Tensor::slice: the tensor has no dimension 0 (undefined or a scalar)");
  if (begin < 0 || begin > end || end > shape_[0]) {
    throw UsageError(
        fmt::format("Tensor::slice: rows [{}, {}) are not within the {} rows of dimension 0", begin, end, shape_[0]));
  }
  auto shape = shape_;
  shape[0] = end - begin;
  // An empty slice keeps the original offset: begin may then point one past the last row.
  std::int64_t offset =
      end > begin ? offset_ + begin * strides_[0] * static_cast<std::int64_t>(element_size(dtype_)) : offset_;
  return Tensor(storage_, offset, std::move(shape), strides_, dtype_, device_);
}

bool Tensor::equal(const Tensor& other) const {
  if (defined() != other.defined()) return false;
  if (!defined()) return true;
  if (dtype_ != other.dtype_ || shape_ != other.shape_) return false;
  if (numel() == 0) return true;
  Tensor a = on_cuda(*this) ? to(Device{}) : contiguous();
  Tensor b = on_cuda(other) ? other.to(Device{}) : other.contiguous();
  return std::memcmp(a.data(), b.data(), nbytes()) == 0;
}

Tensor Tensor::from_cuda(void* data, std::vector<std::int64_t> shape, DType dtype, int device,
                         std::function<void()> release) {
  Device where{Device::Kind::cuda, device};
  check_device(where);
  const std::size_t bytes = checked_nbytes(shape, dtype);
  if (data == nullptr && bytes != 0) throw UsageError("Tensor::from_cuda: data is null");
  auto storage = detail::gpu::external_storage(data, bytes, device, std::move(release));
  return contiguous_over(std::move(storage), std::move(shape), dtype, where);
}

Tensor Tensor::to(Device device, bool copy) const {
  check_device(device);
  if (!defined()) return {};
  if (device == device_ && !copy) return *this;
  if (device_.kind == Device::Kind::cpu && device.kind == Device::Kind::cpu) return clone();
  // A strided tensor is made contiguous on the host first; on a GPU only contiguous ones copy.
  if (on_cuda(*this) && !is_contiguous()) {
    throw UsageError(fmt::format("Tensor::to: the {} tensor is not contiguous; GPU tensors copy only when contiguous",
                                 device_name(device_)));
  }
  Tensor source = on_cuda(*this) ? *this : contiguous();
  Tensor result = empty(shape_, dtype_, device);
  detail::gpu::copy(result.data(), source.data(), nbytes());
  return result;
}

std::string device_name(Device device) {
  return device.kind == Device::Kind::cpu ? std::string("cpu") : fmt::format("cuda:{}", device.index);
}

namespace {
Tensor cuda_empty(std::vector<std::int64_t> shape, DType dtype, Device device) {
  auto storage = detail::gpu::pool_allocate(device.index, checked_nbytes(shape, dtype));
  return contiguous_over(std::move(storage), std::move(shape), dtype, device);
}
}  // namespace

}  // namespace nodal
