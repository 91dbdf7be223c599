#include "driver.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/gpu.hpp>

#include <mutex>

#include <fmt/format.h>

namespace nodal::detail::gpu {
namespace {

template <class F>
void resolve(F& function, const char* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  // CUDA_VERSION: the newest version of the symbol that is not newer than the cuda.h these
  // pointers' types come from, so the signature always matches the declaration.
  cudaError_t result = cudaGetDriverEntryPointByVersion(symbol, &address, CUDA_VERSION, cudaEnableDefault, &status);
  if (result != cudaSuccess || status != cudaDriverEntryPointSuccess || address == nullptr) {
    throw CudaError(fmt::format("the CUDA driver has no {} for CUDA {}.{} ({}, query status {}): update the driver",
                                symbol, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10, cudaGetErrorName(result),
                                static_cast<int>(status)));
  }
  function = reinterpret_cast<F>(address);
}

}  // namespace

const Driver& driver() {
  static Driver table;
  static std::once_flag once;
  std::call_once(once, [] {
    note_cuda_initialized();  // require_available does too; this says so where the driver loads
    require_available("the CUDA driver API");
    resolve(table.get_error_name, "cuGetErrorName");
    resolve(table.get_error_string, "cuGetErrorString");
    resolve(table.device_get, "cuDeviceGet");
    resolve(table.mem_get_allocation_granularity, "cuMemGetAllocationGranularity");
    resolve(table.mem_create, "cuMemCreate");
    resolve(table.mem_release, "cuMemRelease");
    resolve(table.mem_export_to_shareable_handle, "cuMemExportToShareableHandle");
    resolve(table.mem_import_from_shareable_handle, "cuMemImportFromShareableHandle");
    resolve(table.mem_address_reserve, "cuMemAddressReserve");
    resolve(table.mem_address_free, "cuMemAddressFree");
    resolve(table.mem_map, "cuMemMap");
    resolve(table.mem_unmap, "cuMemUnmap");
    resolve(table.mem_set_access, "cuMemSetAccess");
    resolve(table.mem_get_address_range, "cuMemGetAddressRange");
    resolve(table.ctx_get_current, "cuCtxGetCurrent");
    resolve(table.ctx_set_current, "cuCtxSetCurrent");
  });  // an exception leaves the flag unset: the next call tries again and throws the same
  return table;
}

void check(cudaError_t result, const char* call) {
  if (result == cudaSuccess) return;
  throw CudaError(fmt::format("{} failed: {} ({})", call, cudaGetErrorName(result), cudaGetErrorString(result)));
}

void check(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  // The table is complete when a call could be made at all (check follows a call through it).
  const Driver& d = driver();
  if (d.get_error_name(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (d.get_error_string(result, &text) != CUDA_SUCCESS) text = nullptr;
  throw CudaError(fmt::format("{} failed: {} ({})", call, name ? name : fmt::format("CUresult {}", static_cast<int>(result)),
                              text ? text : "no description"));
}

int current_device_or(int fallback) {
  CUcontext current = nullptr;
  check(driver().ctx_get_current(&current), "cuCtxGetCurrent");
  if (current == nullptr) return fallback;
  int device = fallback;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

DeviceGuard::DeviceGuard(int device) {
  const Driver& d = driver();
  CUcontext current = nullptr;
  check(d.ctx_get_current(&current), "cuCtxGetCurrent");
  if (current != nullptr) {
    // A context is current: cudaGetDevice names its device (no context is created).
    int active = -1;
    check(cudaGetDevice(&active), "cudaGetDevice");
    if (active == device) return;  // nothing to change, nothing to restore
  }
  // Since CUDA 12.0 cudaSetDevice also initialises the device's primary context and makes it
  // current.
  check(cudaSetDevice(device), "cudaSetDevice");
  previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ != nullptr) (void)driver().ctx_set_current(previous_);
}

}  // namespace nodal::detail::gpu
