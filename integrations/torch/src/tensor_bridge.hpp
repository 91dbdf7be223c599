// What crosses from torch to nodal: a tensor's bytes as (pointer, count, nodal dtype), torch's
// ReduceOp as nodal's, and contiguous stand-ins for non-contiguous tensors. Internal.
#pragma once

#include <nodal/communicator.hpp>
#include <nodal/tensor.hpp>

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace nodal::torch_backend {

/// A tensor's memory as nodal's raw-buffer calls take it.
struct Buffer {
  void* data;
  std::size_t count;  ///< elements of dtype
  DType dtype;
};

/// Throws c10::Error(message): RuntimeError(message) in Python.
[[noreturn]] void raise(const std::string& message);

/// nodal's dtype for a torch scalar type, if nodal has it (bool, uint8, int8, int32, int64,
/// float16, bfloat16, float32, float64).
std::optional<DType> nodal_dtype(at::ScalarType type) noexcept;
/// The torch scalar type of a nodal dtype.
at::ScalarType torch_dtype(DType dtype) noexcept;

/// Throws c10::Error unless `t` is a defined, dense (strided) CPU tensor. `call`, `which`: for the
/// message ("allreduce", "input").
void check_cpu_dense(const at::Tensor& t, const char* call, const char* which);

/// The buffer of contiguous `t`. `reduction`: the call combines values, so the dtype must be one
/// of nodal's; otherwise a dtype nodal lacks moves as its bytes (u8). Throws c10::Error.
Buffer buffer_of(const at::Tensor& t, bool reduction, const char* call);

/// Elements of buffer_of's dtype per element of `type`: 1, or its size when it moves as bytes.
std::size_t count_scale(at::ScalarType type) noexcept;

/// nodal's op for torch's SUM, AVG, PRODUCT, MIN, MAX; c10::Error for the bitwise ops and PREMUL_SUM.
ReduceOp reduce_op_of(const c10d::ReduceOp& op, const char* call);

/// A contiguous tensor standing for `original` during a call: `original` itself when it is
/// contiguous, else a contiguous copy (of its values when `read`), written back by commit().
class Staged {
 public:
  Staged(const at::Tensor& original, bool read);
  at::Tensor& tensor() noexcept { return work_; }
  /// Copies the result into `original` when it was staged.
  void commit();

 private:
  at::Tensor original_, work_;
};

/// One contiguous tensor holding `tensors` back to back (flattened), for calls on lists; every
/// tensor must have `dtype`. Throws c10::Error naming `call` otherwise.
at::Tensor flatten(const std::vector<at::Tensor>& tensors, at::ScalarType dtype, const char* call);
/// Copies consecutive slices of `flat` into `tensors` (the inverse of flatten).
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors);

}  // namespace nodal::torch_backend
