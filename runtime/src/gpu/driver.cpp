#include "driver.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/gpu.hpp>

#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include <fmt/format.h>

namespace nodal::detail::gpu {
namespace {

/// The version to resolve symbols at (compatibility.hpp entry_point_version): never newer than
/// the cuda.h these pointers' types come from, so the signature matches the declaration, and
/// never newer than the driver, which would refuse it.
int resolve_version() {
  int driver_version = 0;
  if (cudaDriverGetVersion(&driver_version) != cudaSuccess) driver_version = 0;
  return entry_point_version(CUDA_VERSION, driver_version);
}

template <class F>
void resolve(F& function, const char* symbol, int version) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t result = cudaGetDriverEntryPointByVersion(symbol, &address, static_cast<unsigned>(version),
                                                        cudaEnableDefault, &status);
  if (result != cudaSuccess || status != cudaDriverEntryPointSuccess || address == nullptr) {
    throw CudaError(fmt::format("the CUDA driver has no {} for CUDA {}.{} ({}, query status {}): update the driver",
                                symbol, version / 1000, version % 1000 / 10, cudaGetErrorName(result),
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
    const int version = resolve_version();
    resolve(table.get_error_name, "cuGetErrorName", version);
    resolve(table.get_error_string, "cuGetErrorString", version);
    resolve(table.device_get, "cuDeviceGet", version);
    resolve(table.device_get_attribute, "cuDeviceGetAttribute", version);
    resolve(table.mem_get_allocation_granularity, "cuMemGetAllocationGranularity", version);
    resolve(table.mem_create, "cuMemCreate", version);
    resolve(table.mem_release, "cuMemRelease", version);
    resolve(table.mem_export_to_shareable_handle, "cuMemExportToShareableHandle", version);
    resolve(table.mem_import_from_shareable_handle, "cuMemImportFromShareableHandle", version);
    resolve(table.mem_address_reserve, "cuMemAddressReserve", version);
    resolve(table.mem_address_free, "cuMemAddressFree", version);
    resolve(table.mem_map, "cuMemMap", version);
    resolve(table.mem_unmap, "cuMemUnmap", version);
    resolve(table.mem_set_access, "cuMemSetAccess", version);
    resolve(table.mem_get_address_range, "cuMemGetAddressRange", version);
    resolve(table.ctx_get_current, "cuCtxGetCurrent", version);
    resolve(table.ctx_set_current, "cuCtxSetCurrent", version);
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

DeviceCapabilities device_capabilities(int device) {
  const Driver& d = driver();
  CUdevice handle = 0;
  check(d.device_get(&handle, device), "cuDeviceGet");
  auto attribute = [&](CUdevice_attribute which, const char* name) {
    int value = 0;
    check(d.device_get_attribute(&value, which, handle), name);
    return value;
  };
  DeviceCapabilities caps;
  caps.device = device;
  caps.virtual_memory = attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                  "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)") != 0;
  caps.posix_fd_handles = attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                    "cuDeviceGetAttribute(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)") != 0;
  caps.ipc_events = attribute(CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, "cuDeviceGetAttribute(IPC_EVENT_SUPPORTED)") != 0;
  caps.compute_mode =
      static_cast<ComputeMode>(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, "cuDeviceGetAttribute(COMPUTE_MODE)"));
  return caps;
}

void require_capabilities(int device, GpuUse use, int processes) {
  static std::mutex mutex;
  static std::set<std::tuple<int, GpuUse, int>> checked;
  std::lock_guard lock(mutex);
  if (checked.contains({device, use, processes})) return;
  const std::string missing = missing_capability(device_capabilities(device), use, processes);
  if (!missing.empty()) throw CudaError(missing);
  checked.insert({device, use, processes});
}

void require_shareable_device(int device, int processes) {
  require_capabilities(device, GpuUse::shared_by_processes, processes);
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
  // current. In EXCLUSIVE_PROCESS mode a second process is refused that context: say why.
  const cudaError_t result = cudaSetDevice(device);
  if (result == cudaErrorDevicesUnavailable) {
    (void)cudaGetLastError();
    const std::string missing = missing_capability(device_capabilities(device), GpuUse::shared_by_processes, 0);
    if (!missing.empty()) throw CudaError(fmt::format("{} (cudaSetDevice: cudaErrorDevicesUnavailable)", missing));
  }
  check(result, "cudaSetDevice");
  previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ != nullptr) (void)driver().ctx_set_current(previous_);
}

}  // namespace nodal::detail::gpu
