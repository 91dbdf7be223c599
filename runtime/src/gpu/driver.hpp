// The CUDA driver API calls the GPU layer makes (VMM: cuMemCreate and friends), reached through
// cudaGetDriverEntryPointByVersion rather than by linking libcuda.so: the library then loads on a
// machine without a driver (a build or CPU-only machine has only libcuda's link stub), and
// nothing changes on a GPU machine. Plus check(), which turns a failed CUDA call into CudaError.
// Internal.
#pragma once

#include <nodal/detail/gpu.hpp>

#include "compatibility.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace nodal::detail::gpu {

/// The driver entry points, resolved once per process at entry_point_version(CUDA_VERSION, the
/// driver's version) (compatibility.hpp): the cuda.h ABI these types declare, also on a driver
/// older than the toolkit. Throws CudaError when CUDA is unavailable or a symbol is missing.
struct Driver {
  decltype(&::cuGetErrorName) get_error_name;
  decltype(&::cuGetErrorString) get_error_string;
  decltype(&::cuDeviceGet) device_get;
  decltype(&::cuDeviceGetAttribute) device_get_attribute;
  decltype(&::cuMemGetAllocationGranularity) mem_get_allocation_granularity;
  decltype(&::cuMemCreate) mem_create;
  decltype(&::cuMemRelease) mem_release;
  decltype(&::cuMemExportToShareableHandle) mem_export_to_shareable_handle;
  decltype(&::cuMemImportFromShareableHandle) mem_import_from_shareable_handle;
  decltype(&::cuMemAddressReserve) mem_address_reserve;
  decltype(&::cuMemAddressFree) mem_address_free;
  decltype(&::cuMemMap) mem_map;
  decltype(&::cuMemUnmap) mem_unmap;
  decltype(&::cuMemSetAccess) mem_set_access;
  decltype(&::cuMemGetAddressRange) mem_get_address_range;  // cuMemGetAddressRange_v2
  decltype(&::cuCtxGetCurrent) ctx_get_current;
  decltype(&::cuCtxSetCurrent) ctx_set_current;
};
const Driver& driver();

/// Throws CudaError("<call>: <error name> (<error string>)") unless `result` is success.
void check(cudaError_t result, const char* call);
void check(CUresult result, const char* call);

/// What the driver says of `device` (compatibility.hpp). Needs no context. Throws CudaError.
DeviceCapabilities device_capabilities(int device);
/// Throws CudaError(missing_capability(...)) unless `device` allows `use` by `processes`
/// processes; checked once per (device, use, processes) per process.
void require_capabilities(int device, GpuUse use, int processes = 1);

/// Records that this process called into the CUDA runtime or driver (device.cpp; gpu.hpp
/// cuda_initialized): set before the first such call, never cleared. Thread-safe.
void note_cuda_initialized() noexcept;

/// The device of the calling thread's current context, or `fallback` when it has none (then
/// cudaGetDevice would say 0 without any device having been chosen). Throws CudaError.
int current_device_or(int fallback);

// DeviceGuard: declared in <nodal/detail/gpu.hpp> (the collectives use it too).

}  // namespace nodal::detail::gpu
