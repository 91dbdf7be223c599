// DLPack import and export (dlpack.h, https://github.com/dmlc/dlpack), as torch.utils.dlpack.
#include <nodal/tensor.hpp>

#include <nodal/errors.hpp>
#include <nodal/detail/storage.hpp>

#ifdef NODAL_HAVE_DLPACK
#include <dlpack/dlpack.h>

#include <algorithm>
#include <memory>
#include <vector>

#include <fmt/format.h>
#endif

namespace nodal {

#ifdef NODAL_HAVE_DLPACK
namespace {

/// DLPack's type code for a dtype; its bits are element_size() * 8.
std::uint8_t dl_code(DType dtype) noexcept {
  switch (dtype) {
#if DLPACK_VERSION >= 80
    case DType::bool_:
      return kDLBool;
#else
    case DType::bool_:  // dlpack.h before 0.8 has no bool type; torch exported bool as u8 then too
#endif
    case DType::u8:
      return kDLUInt;
    case DType::i8:
    case DType::i32:
    case DType::i64:
      return kDLInt;
    case DType::f16:
    case DType::f32:
    case DType::f64:
      return kDLFloat;
    case DType::bf16:
      return kDLBfloat;
  }
  return kDLOpaqueHandle;  // a value cast from outside the enum
}

DLDataType dl_type(DType dtype) noexcept {
  return {dl_code(dtype), static_cast<std::uint8_t>(element_size(dtype) * 8), 1};
}

/// The dtype from_dlpack gives a DLPack type. u8 comes before bool_: without kDLBool, an 8-bit
/// kDLUInt is a u8.
DType nodal_dtype(DLDataType type) {
  constexpr DType kSearchOrder[] = {DType::u8,   DType::i8,  DType::i32, DType::i64,  DType::f16,
                                    DType::bf16, DType::f32, DType::f64, DType::bool_};
  for (DType dtype : kSearchOrder) {
    DLDataType candidate = dl_type(dtype);
    if (type.lanes == 1 && type.code == candidate.code && type.bits == candidate.bits) return dtype;
  }
  throw UsageError(fmt::format("Tensor::from_dlpack: DLPack type (code {}, {} bits, {} lanes) has no nodal dtype",
                               type.code, type.bits, type.lanes));
}

/// What an exported DLManagedTensor's manager_ctx points to: the tensor, which keeps the storage
/// alive, and the arrays dl_tensor points into.
struct Exported {
  Tensor tensor;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLManagedTensor managed{};
};

}  // namespace

DLManagedTensor* Tensor::to_dlpack() const {
  if (!defined()) throw UsageError("Tensor::to_dlpack: the tensor is undefined");
  auto exported = std::make_unique<Exported>(Exported{*this, shape_, strides_, {}});
  DLTensor& dl = exported->managed.dl_tensor;
  dl.data = data();
  dl.device = {kDLCPU, 0};
  dl.ndim = dim();
  dl.dtype = dl_type(dtype_);
  dl.shape = exported->shape.data();
  dl.strides = exported->strides.data();
  dl.byte_offset = 0;
  exported->managed.manager_ctx = exported.get();
  exported->managed.deleter = [](DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); };
  return &exported.release()->managed;
}

Tensor Tensor::from_dlpack(DLManagedTensor* managed) {
  if (!managed) throw UsageError("Tensor::from_dlpack: null DLManagedTensor");
  const DLTensor& dl = managed->dl_tensor;
  if (dl.device.device_type != kDLCPU) {
    throw UsageError(fmt::format(
        "Tensor::from_dlpack: device type {} is not the cpu (kDLCPU = {}); copy the tensor to the cpu first",
        static_cast<int>(dl.device.device_type), static_cast<int>(kDLCPU)));
  }
  DType dtype = nodal_dtype(dl.dtype);
  if (dl.ndim < 0 || dl.ndim > kMaxDims) {
    throw UsageError(fmt::format("Tensor::from_dlpack: {} dimensions; at most {} are supported", dl.ndim, kMaxDims));
  }
  std::vector<std::int64_t> shape(dl.shape, dl.shape + dl.ndim);
  // NULL strides: compact row-major (dlpack.h).
  std::vector<std::int64_t> strides =
      dl.strides ? std::vector<std::int64_t>(dl.strides, dl.strides + dl.ndim) : detail::contiguous_strides(shape);

  // The storage covers exactly the bytes the view reaches, which with negative strides begin
  // before the first element.
  auto* first = static_cast<std::byte*>(dl.data) + dl.byte_offset;
  bool has_elements = std::ranges::all_of(shape, [](std::int64_t size) { return size > 0; });
  auto [low, high] = has_elements ? detail::byte_span(shape, strides, dtype) : std::pair<std::int64_t, std::int64_t>{};

  // The deleter runs only once the import has succeeded: on a throw the producer still owns
  // `managed`, as with torch.from_dlpack, so a caller can free it without a double free.
  auto owned = std::make_shared<bool>(false);
  auto storage = detail::Storage::external(first + low, static_cast<std::size_t>(high - low), [managed, owned] {
    if (*owned && managed->deleter) managed->deleter(managed);
  });
  Tensor tensor(std::move(storage), -low, std::move(shape), std::move(strides), dtype);
  *owned = true;
  return tensor;
}

#else

DLManagedTensor* Tensor::to_dlpack() const { throw UsageError("nodal was built without dlpack.h"); }
Tensor Tensor::from_dlpack(DLManagedTensor*) { throw UsageError("nodal was built without dlpack.h"); }

#endif

}  // namespace nodal
