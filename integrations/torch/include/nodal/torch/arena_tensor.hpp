// Torch tensors over nodal's job arena: what nodal's collectives read and write in place (the
// in_place path, one copy per byte fewer than for a torch tensor in the process's own memory).
#pragma once

#include <ATen/core/Tensor.h>

namespace nodal::torch_backend {

/// An uninitialised, contiguous CPU tensor of `sizes` and `dtype` (bool, uint8, int8, int32,
/// int64, float16, bfloat16, float32, float64) whose storage is nodal::Tensor::empty_shared's:
/// in the job's shared arena, freed when the last torch tensor on it goes. Throws c10::Error for
/// another dtype, or with nodal's ShmError text when the arena has no room (nodalrun --shm-size).
at::Tensor empty_shared(at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace nodal::torch_backend
