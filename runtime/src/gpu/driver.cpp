#include "driver.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/gpu.hpp>

#include <bitset>
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

namespace {
/// Devices the calling thread has made current once (so their primary context is initialised
/// and bound to the thread).
thread_local std::bitset<1024> t_bound;
}  // namespace

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ == device && device >= 0 && device < 1024 && t_bound[device]) {
    previous_ = -1;  // nothing to restore
    return;
  }
  // Since CUDA 12.0 cudaSetDevice also initialises the device's primary context.
  check(cudaSetDevice(device), "cudaSetDevice");
  if (device >= 0 && device < 1024) t_bound[device] = true;
  if (previous_ == device) previous_ = -1;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

}  // namespace nodal::detail::gpu
