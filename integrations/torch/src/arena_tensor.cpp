#include <nodal/torch/arena_tensor.hpp>

#include "tensor_bridge.hpp"

#include <nodal/errors.hpp>
#include <nodal/tensor.hpp>

#include <ATen/ATen.h>

#include <memory>

namespace nodal::torch_backend {

at::Tensor empty_shared(at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto nodal_type = nodal_dtype(dtype);
  if (!nodal_type) raise(c10::str("nodal: empty_shared: dtype ", dtype, " has no nodal equivalent"));
  std::shared_ptr<Tensor> storage;
  try {
    storage = std::make_shared<Tensor>(Tensor::empty_shared(std::vector<std::int64_t>(sizes.begin(), sizes.end()), *nodal_type));
  } catch (const Error& e) {
    raise(c10::str("nodal: empty_shared: ", e.what()));
  }
  void* data = storage->data();
  return at::from_blob(data, sizes, [storage](void*) mutable { storage.reset(); },
                       at::TensorOptions().dtype(dtype).device(at::kCPU));
}

}  // namespace nodal::torch_backend
