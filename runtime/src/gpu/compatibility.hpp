// What nodal's GPU layer needs of the CUDA driver and of a device, and the errors that name what
// is missing. Host-only arithmetic on numbers the driver reported (no CUDA header, no call): built
// in every build, so tests/unit/gpu_compatibility_test.cpp checks each decision and message on a
// machine without a GPU. driver.cpp, pool.cpp and the CUDA IPC collectives feed it what they
// queried. Internal.
#pragma once

#include <cstdint>
#include <string>

namespace nodal::detail::gpu {

/// The CUDA version (1000 * major + 10 * minor, CUDA_VERSION's encoding) at which to ask the
/// driver for its entry points (cudaGetDriverEntryPointByVersion): the toolkit's, unless the
/// driver is older, then the driver's. Asking for a version newer than the driver fails
/// ("If the specified CUDA version is greater than the driver version, the API will return
/// cudaErrorInvalidValue", cuda_runtime_api.h), and CUDA's minor-version compatibility lets a
/// 13.1 build run on a 13.0 driver. Every symbol nodal resolves has kept its ABI since CUDA 12.0,
/// so an older version yields the same signatures. `driver_version` <= 0 (unknown): the toolkit's.
int entry_point_version(int toolkit_version, int driver_version) noexcept;

/// cudaComputeMode / CUcomputemode values (driver_types.h, cuda.h).
enum class ComputeMode : int { default_ = 0, exclusive_thread = 1, prohibited = 2, exclusive_process = 3 };
const char* compute_mode_name(ComputeMode mode) noexcept;

/// What the driver says of one device (cuDeviceGetAttribute).
struct DeviceCapabilities {
  int device = 0;                         ///< CUDA device index (in CUDA_VISIBLE_DEVICES)
  bool virtual_memory = false;            ///< CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  bool posix_fd_handles = false;          ///< CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
  bool ipc_events = false;                ///< CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED
  ComputeMode compute_mode = ComputeMode::default_;  ///< CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
};

/// What the GPU layer is about to do with a device.
enum class GpuUse {
  /// The rank's GPU pool: cuMemCreate chunks exported as POSIX file descriptors, hand-off ordered
  /// by interprocess events. "Users must ensure they query for support of the requested handle
  /// type before attempting to export memory" (CUDA Programming Guide, Virtual Memory Management);
  /// NVIDIA's memMapIPCDrv sample checks these attributes and the compute mode.
  pool_export,
  /// Several processes of the job on this one device (--ranks-per-gpu > 1, the CUDA IPC
  /// collectives): each process needs a context there, which EXCLUSIVE_PROCESS allows only once.
  shared_by_processes,
};

/// Empty when `caps` allow `use` by `processes` processes of the job at once on the device
/// (0: an unknown number, the device having refused this process a context);
/// otherwise one sentence naming the device, what is missing and what to do, e.g. "GPU 0 is in
/// EXCLUSIVE_PROCESS compute mode: 2 ranks sharing it (--ranks-per-gpu 2) need the DEFAULT mode
/// (nvidia-smi -i 0 -c DEFAULT, as root)". The caller throws it as a CudaError.
std::string missing_capability(const DeviceCapabilities& caps, GpuUse use, int processes = 1);

/// Where cudaIpcOpenMemHandle mapped a producer's allocation (legacy IPC, Tensor::from_cuda), as
/// cuMemGetAddressRange of the opened pointer saw it, in this process's addresses.
struct OpenedRange {
  std::uint64_t opened = 0;      ///< the pointer cudaIpcOpenMemHandle returned
  std::uint64_t range_base = 0;  ///< the mapped range holding it
  std::uint64_t range_size = 0;
};

/// Empty when the producer's allocation (`allocation_size` bytes, of which the tensor ends at
/// `used_end` bytes from its base) can be read at `r.opened`; otherwise why not, for a CudaError.
/// CUDA shares the whole block behind a cudaMalloc allocation, and small allocations are
/// sub-allocated from larger blocks ("recommended to only share allocations with a 2MiB aligned
/// size", CUDA C++ Programming Guide, Interprocess Communication); whether the opened pointer is
/// the allocation's or its block's start is not documented. Accepted: a range that is exactly the
/// allocation, or a pointer strictly inside a larger range (the driver pointed at the allocation
/// within its block) with room for the tensor. Refused: a range too small for the tensor, and a
/// pointer at the start of a range of another size (it may be the block's start: the bytes
/// read would be another allocation's).
std::string opened_range_problem(const OpenedRange& r, std::uint64_t allocation_size, std::uint64_t used_end);

}  // namespace nodal::detail::gpu
