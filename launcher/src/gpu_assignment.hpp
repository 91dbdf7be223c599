// Which CUDA devices nodalrun's --gpus gives each rank. Pure: the caller reads the environment
// and /proc, so every rule is testable without a GPU or a process.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nodal::launcher {

/// Where the NVIDIA driver lists the GPUs (one entry each) without initialising CUDA, which a
/// launcher that forks must not do.
inline constexpr const char* kProcNvidiaGpus = "/proc/driver/nvidia/gpus";

/// The job's GPUs and each rank's share of them.
struct GpuAssignment {
  /// CUDA_VISIBLE_DEVICES of every rank: the whole list, comma-joined, so that ranks on different
  /// GPUs can still reach each other by CUDA IPC.
  std::string visible_devices;
  /// NODAL_DEVICE of each rank: an index into that list (consecutive ranks share a GPU).
  std::vector<int> device_of_rank;
};

/// Entries of `dir` (kProcNvidiaGpus); 0 when it is missing or empty.
int count_gpus(const char* dir = kProcNvidiaGpus);

/// Assigns `nprocs` ranks to the GPUs of `flag` ("all" or a list like "0,1,3"), `ranks_per_gpu`
/// (>= 1) to a GPU: rank r gets the (r / ranks_per_gpu)-th GPU. "all" means the entries of
/// `cuda_visible_devices` (nodalrun's own CUDA_VISIBLE_DEVICES, kept as written: indices or
/// UUIDs) when set, else GPUs 0 to `proc_gpus` - 1. A list's indices are /proc's numbering, so
/// `proc_gpus` (count_gpus()) bounds them: without a GPU there, every list is refused.
/// Throws UsageError with one line: a malformed list (empty entry, not an index, a GPU twice),
/// an index beyond `proc_gpus` (naming what was found), no GPU at all for "all", more ranks than
/// the GPUs can take.
GpuAssignment assign_gpus(std::string_view flag, int nprocs, int ranks_per_gpu,
                          const std::optional<std::string>& cuda_visible_devices, int proc_gpus);

}  // namespace nodal::launcher
