#include "tensor_bridge.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace nodal::torch_backend {

void raise(const std::string& message) { throw c10::Error(message, ""); }

std::optional<DType> nodal_dtype(at::ScalarType type) noexcept {
  switch (type) {
    case at::kBool: return DType::bool_;
    case at::kByte: return DType::u8;
    case at::kChar: return DType::i8;
    case at::kInt: return DType::i32;
    case at::kLong: return DType::i64;
    case at::kHalf: return DType::f16;
    case at::kBFloat16: return DType::bf16;
    case at::kFloat: return DType::f32;
    case at::kDouble: return DType::f64;
    default: return std::nullopt;
  }
}

at::ScalarType torch_dtype(DType dtype) noexcept {
  switch (dtype) {
    case DType::bool_: return at::kBool;
    case DType::u8: return at::kByte;
    case DType::i8: return at::kChar;
    case DType::i32: return at::kInt;
    case DType::i64: return at::kLong;
    case DType::f16: return at::kHalf;
    case DType::bf16: return at::kBFloat16;
    case DType::f32: return at::kFloat;
    case DType::f64: return at::kDouble;
  }
  return at::kByte;
}

void check_cpu_dense(const at::Tensor& t, const char* call, const char* which) {
  TORCH_CHECK(t.defined(), "nodal: ", call, ": the ", which, " tensor is undefined");
  TORCH_CHECK(t.device().is_cpu(), "nodal: ", call, ": the ", which, " tensor is on ", t.device(),
              "; the nodal backend reduces CPU tensors (use nccl or gloo for cuda ones)");
  TORCH_CHECK(t.layout() == at::kStrided, "nodal: ", call, ": the ", which, " tensor is ", t.layout(),
              "; the nodal backend takes dense (strided) tensors only");
}

Buffer buffer_of(const at::Tensor& t, bool reduction, const char* call) {
  if (auto dtype = nodal_dtype(t.scalar_type())) {
    return Buffer{t.data_ptr(), static_cast<std::size_t>(t.numel()), *dtype};
  }
  TORCH_CHECK(!reduction, "nodal: ", call, ": dtype ", t.scalar_type(),
              " cannot be reduced by the nodal backend (bool, uint8, int8, int32, int64, float16, bfloat16, "
              "float32, float64 can)");
  return Buffer{t.data_ptr(), static_cast<std::size_t>(t.nbytes()), DType::u8};
}

std::size_t count_scale(at::ScalarType type) noexcept {
  return nodal_dtype(type) ? 1 : static_cast<std::size_t>(c10::elementSize(type));
}

ReduceOp reduce_op_of(const c10d::ReduceOp& op, const char* call) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: return ReduceOp::sum;
    case c10d::ReduceOp::AVG: return ReduceOp::avg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::prod;
    case c10d::ReduceOp::MIN: return ReduceOp::min;
    case c10d::ReduceOp::MAX: return ReduceOp::max;
    default: break;
  }
  raise(c10::str("nodal: ", call, ": ReduceOp ", static_cast<int>(static_cast<c10d::ReduceOp::RedOpType>(op)),
                 " (BAND, BOR, BXOR or PREMUL_SUM) is not supported by the nodal backend; SUM, AVG, PRODUCT, MIN "
                 "and MAX are"));
}

Staged::Staged(const at::Tensor& original, bool read) : original_(original) {
  if (original.is_contiguous()) {
    work_ = original;
  } else {
    work_ = read ? original.contiguous() : at::empty_like(original, at::MemoryFormat::Contiguous);
  }
}

void Staged::commit() {
  if (!work_.is_same(original_)) original_.copy_(work_);
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors, at::ScalarType dtype, const char* call) {
  std::int64_t total = 0;
  for (const auto& t : tensors) {
    check_cpu_dense(t, call, "list's");
    TORCH_CHECK(t.scalar_type() == dtype, "nodal: ", call, ": the tensors' dtypes differ (", t.scalar_type(), " and ",
                dtype, ")");
    total += t.numel();
  }
  at::Tensor flat = at::empty({total}, at::TensorOptions().dtype(dtype));
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    flat.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
    offset += t.numel();
  }
  return flat;
}

void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  std::int64_t offset = 0;
  for (auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace nodal::torch_backend
