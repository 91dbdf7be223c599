// The one place that knows which torch it is built against (torch-ccl's way, v2.0.0+cpu): torch
// 1.x process groups derive from c10d::ProcessGroup, torch >= 2 backends from c10d::Backend, with
// the same virtual signatures. Internal.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 1
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace nodal::torch_backend {

#if TORCH_VERSION_MAJOR > 1
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

}  // namespace nodal::torch_backend
