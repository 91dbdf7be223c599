// nodal::Tensor: a strided n-dimensional array whose storage can live in the job's shared arena,
// so that handing it to another rank passes an offset, not bytes (the idea of
// torch.multiprocessing: tensors in shared memory, passed by handle).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct DLManagedTensor;  // dlpack.h

namespace nodal {

/// Element types. f16 and bf16 are storage types here (2 bytes each); collectives accumulate them
/// in f32.
enum class DType : std::uint8_t { bool_, u8, i8, i32, i64, f16, bf16, f32, f64 };

/// Bytes per element: 1 for bool_, u8, i8; 2 for f16, bf16; 4 for i32, f32; 8 for i64, f64; 0 for
/// a value outside the enum. Inline: every collective call asks it several times.
constexpr std::size_t element_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::bool_:
    case DType::u8:
    case DType::i8: return 1;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::i32:
    case DType::f32: return 4;
    case DType::i64:
    case DType::f64: return 8;
  }
  return 0;
}
/// "f32", "bf16", ...
std::string_view dtype_name(DType dtype) noexcept;

/// Where a tensor's bytes are: host memory, or CUDA device `index` (an index into this process's
/// CUDA_VISIBLE_DEVICES, as cudaSetDevice takes it).
struct Device {
  enum class Kind : std::uint8_t { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  static Device cuda(int index) noexcept { return Device{Kind::cuda, index}; }
};
/// "cpu", "cuda:0", ...
std::string device_name(Device device);

/// How Tensor::from_file maps its file (np.memmap's modes r, r+, w+).
enum class FileMode { read_only, read_write, create };

namespace detail {
class Storage;
}

class Tensor {
 public:
  /// An undefined tensor: no storage, defined() is false.
  Tensor() = default;

  /// Uninitialised contiguous tensor in private (process-local) memory, or on a GPU: a cuda
  /// device's tensors come from this rank's block of the job's GPU pool (gpu.hpp), which every
  /// rank can map, so queues pass them by handle.
  /// shape: sizes per dimension, each >= 0, at most kMaxDims dimensions. Throws UsageError for a
  /// negative size or too many dimensions; CudaError when the device cannot be used (no GPU, a
  /// build without CUDA: the message says which) or is out of memory.
  static Tensor empty(std::vector<std::int64_t> shape, DType dtype, Device device = {});
  /// Zero-filled contiguous tensor in private memory.
  static Tensor zeros(std::vector<std::int64_t> shape, DType dtype, Device device = {});
  /// Uninitialised contiguous tensor allocated directly in the job's shared arena (no copy ever).
  /// Throws ShmError when the arena has no room.
  static Tensor empty_shared(std::vector<std::int64_t> shape, DType dtype);
  /// A tensor over the bytes of a file, like np.memmap: writes go to the file (MAP_SHARED) and are
  /// seen by every process mapping it. read_only and read_write need a file of at least the
  /// tensor's size; create makes (or truncates) it to that size. Throws std::system_error naming
  /// the file when it cannot be opened or mapped, UsageError when it is too small.
  static Tensor from_file(const std::string& path, DType dtype, std::vector<std::int64_t> shape,
                          FileMode mode = FileMode::read_write);

  /// A cuda tensor over memory another allocator owns (cudaMalloc, a caching allocator): nodal
  /// shares it with the CUDA IPC API (the allocation's base handle + offset) and runs `release`
  /// once no process of the job holds it any more: the producer keeps it alive while consumers
  /// use it (torch.multiprocessing's rule). `data`: a device address on `device`, holding the
  /// contiguous [shape] dtype tensor. Sharing uses CUDA's legacy IPC, which shares the whole
  /// underlying block of an allocation: meant for cudaMalloc allocations of at least 2 MiB (a
  /// multiple of 2 MiB; "recommended to only share allocations with a 2MiB aligned size", CUDA
  /// C++ Programming Guide, Interprocess Communication). A consumer checks that the range it
  /// opened is the producer's allocation and throws CudaError, naming this rule, where CUDA
  /// handed it a larger block (small allocations packed together). Tensor::empty on a cuda
  /// device has no such limit. Throws UsageError, CudaError.
  static Tensor from_cuda(void* data, std::vector<std::int64_t> shape, DType dtype, int device,
                          std::function<void()> release = {});
  /// This tensor on `device`: itself when it is there already (unless `copy`), else a contiguous
  /// copy (host <-> GPU, GPU <-> GPU; cudaMemcpy on cuda::current_stream(), finished on return).
  /// Throws CudaError; UsageError for a non-contiguous cuda tensor.
  Tensor to(Device device, bool copy = false) const;

  /// Moves the storage into the job's shared arena (one copy) unless it is there already, like
  /// torch's share_memory_(). Every tensor sharing this storage (views, copies of this object)
  /// moves with it. File-backed tensors are shared already and stay in their file.
  /// Returns *this. Throws ShmError when the arena has no room.
  Tensor& share_memory();
  /// True when other processes can map the storage: in the arena, in a file, or on a GPU.
  bool is_shared() const noexcept;
  /// True when the storage is in the job's arena (a queue then passes it by offset).
  bool in_arena() const noexcept;

  bool defined() const noexcept { return storage_ != nullptr; }
  DType dtype() const noexcept { return dtype_; }
  Device device() const noexcept { return device_; }
  int dim() const noexcept { return static_cast<int>(shape_.size()); }
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// Strides in elements (not bytes), as torch.
  const std::vector<std::int64_t>& strides() const noexcept { return strides_; }
  std::int64_t numel() const noexcept;
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel()) * element_size(dtype_); }
  bool is_contiguous() const noexcept;

  /// First element: a host address, or a device address for a cuda tensor.
  void* data() const noexcept;
  /// First element as T*. Throws UsageError for a T whose size is not element_size(dtype()).
  template <class T>
  T* data_ptr() const {
    check_element_type(sizeof(T));
    return static_cast<T*>(data());
  }

  /// A contiguous tensor with the same data (this one if already contiguous; else a private copy).
  Tensor contiguous() const;
  /// A private contiguous copy.
  Tensor clone() const;
  /// The same storage seen with another shape; needs a contiguous tensor and the same numel.
  Tensor reshape(std::vector<std::int64_t> shape) const;
  /// Rows [begin, end) of dimension 0, sharing storage.
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  /// Same dtype, shape and bytes (bit-exact; NaNs equal when their bits are).
  bool equal(const Tensor& other) const;

  /// DLPack export (dlpack.h, DLManagedTensor): the tensor stays alive until the consumer calls
  /// the deleter. Throws UsageError when nodal was built without dlpack.h.
  DLManagedTensor* to_dlpack() const;
  /// DLPack import: takes ownership of `managed` (its deleter runs when the last nodal reference
  /// goes). Throws UsageError for a dtype nodal does not have or a non-cpu device.
  static Tensor from_dlpack(DLManagedTensor* managed);

  static constexpr int kMaxDims = 8;

  /// Internal: what queues need to pass a tensor by handle.
  const std::shared_ptr<detail::Storage>& storage() const noexcept { return storage_; }
  std::int64_t storage_offset() const noexcept { return offset_; }  ///< bytes
  /// Internal: assembles a tensor over a storage.
  Tensor(std::shared_ptr<detail::Storage> storage, std::int64_t offset_bytes, std::vector<std::int64_t> shape,
         std::vector<std::int64_t> strides, DType dtype, Device device = {});

 private:
  void check_element_type(std::size_t size) const;

  std::shared_ptr<detail::Storage> storage_;
  std::int64_t offset_ = 0;
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  DType dtype_ = DType::f32;
  Device device_{};
};

}  // namespace nodal
