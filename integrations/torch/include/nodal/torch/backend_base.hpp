// The one place that knows which torch it is built against (torch-ccl's way, v2.0.0+cpu): torch
// 1.x process groups derive from c10d::ProcessGroup, torch >= 2 backends from c10d::Backend, with
// the same virtual signatures; c10::Allocator::allocate is const before torch 2.3 (pytorch#120969).
// Internal.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 1
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define NODAL_TORCH_ALLOCATE_CONST
#else
#define NODAL_TORCH_ALLOCATE_CONST const
#endif

namespace nodal::torch_backend {

#if TORCH_VERSION_MAJOR > 1
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

}  // namespace nodal::torch_backend
