#include "compatibility.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace nodal::detail::gpu {

int entry_point_version(int toolkit_version, int driver_version) noexcept {
  return driver_version > 0 ? std::min(toolkit_version, driver_version) : toolkit_version;
}

const char* compute_mode_name(ComputeMode mode) noexcept {
  switch (mode) {
    case ComputeMode::default_: return "DEFAULT";
    case ComputeMode::exclusive_thread: return "EXCLUSIVE_THREAD";
    case ComputeMode::prohibited: return "PROHIBITED";
    case ComputeMode::exclusive_process: return "EXCLUSIVE_PROCESS";
  }
  return "unknown";
}

std::string missing_capability(const DeviceCapabilities& caps, GpuUse use, int processes) {
  const int d = caps.device;
  const std::string fix_mode = fmt::format("nvidia-smi -i {} -c DEFAULT, as root", d);
  if (caps.compute_mode == ComputeMode::prohibited) {
    return fmt::format("GPU {} is in PROHIBITED compute mode: no process may use it ({})", d, fix_mode);
  }
  if (use == GpuUse::shared_by_processes && processes != 1 && caps.compute_mode != ComputeMode::default_) {
    if (processes > 1) {
      return fmt::format("GPU {} is in {} compute mode: {} ranks sharing it (--ranks-per-gpu {}) need the DEFAULT mode ({})",
                         d, compute_mode_name(caps.compute_mode), processes, processes, fix_mode);
    }
    return fmt::format("GPU {} is in {} compute mode and another process holds it: ranks that share a GPU "
                       "(--ranks-per-gpu > 1) need the DEFAULT mode ({})",
                       d, compute_mode_name(caps.compute_mode), fix_mode);
  }
  if (use == GpuUse::pool_export) {
    if (!caps.virtual_memory) {
      return fmt::format("GPU {} does not support CUDA virtual memory management "
                         "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0): nodal's GPU pool needs it "
                         "to share CUDA tensors between processes",
                         d);
    }
    if (!caps.posix_fd_handles) {
      return fmt::format("GPU {} cannot export memory as POSIX file descriptors "
                         "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0; a virtualised or "
                         "sandboxed driver?): nodal's GPU pool shares its chunks that way",
                         d);
    }
  }
  if (!caps.ipc_events) {
    return fmt::format("GPU {} does not support interprocess events (CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED is 0): "
                       "nodal orders one process's GPU work after another's with them",
                       d);
  }
  return {};
}

std::string opened_range_problem(const OpenedRange& r, std::uint64_t allocation_size, std::uint64_t used_end) {
  const bool inside = r.opened >= r.range_base && r.opened - r.range_base < r.range_size;
  const std::uint64_t room = inside ? r.range_size - (r.opened - r.range_base) : 0;
  if (inside && room >= used_end && (r.opened != r.range_base || r.range_size == allocation_size)) return {};
  return fmt::format("its IPC handle opened {} bytes at offset {} of a mapped range, where the producer's allocation "
                     "has {} bytes: CUDA shares the whole block behind small cudaMalloc allocations. Share allocations "
                     "of at least 2 MiB (a multiple of 2 MiB), or make the tensor with Tensor::empty on the GPU",
                     room, inside ? r.opened - r.range_base : 0, allocation_size);
}

}  // namespace nodal::detail::gpu
