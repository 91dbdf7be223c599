#include "gpu_assignment.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>

#include <filesystem>
#include <set>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace nodal::launcher {
namespace {

/// The comma-separated entries of `text`, each trimmed of spaces; empty ones kept (the callers
/// refuse them with their own words).
std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> items;
  for (;;) {
    std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    std::size_t first = item.find_first_not_of(' ');
    item = first == std::string_view::npos ? std::string_view() : item.substr(first, item.find_last_not_of(' ') - first + 1);
    items.emplace_back(item);
    if (comma == std::string_view::npos) return items;
    text.remove_prefix(comma + 1);
  }
}

/// What the driver lists, for the messages: "found 2 GPUs in /proc/driver/nvidia/gpus: 0-1".
std::string found_gpus(int proc_gpus) {
  if (proc_gpus <= 0) return fmt::format("found no GPU: {} is empty or missing", kProcNvidiaGpus);
  if (proc_gpus == 1) return fmt::format("found 1 GPU in {}: 0", kProcNvidiaGpus);
  return fmt::format("found {} GPUs in {}: 0-{}", proc_gpus, kProcNvidiaGpus, proc_gpus - 1);
}

/// `--gpus LIST` as GPU indices, written back in canonical form ("01" is "1").
std::vector<std::string> parse_index_list(std::string_view flag, int proc_gpus) {
  constexpr const char* kExpected = "expected all or GPU indices like 0,1,3";
  std::vector<int> indices;
  std::set<int> seen;
  for (const std::string& item : split_list(flag)) {
    if (item.empty()) throw UsageError(fmt::format("--gpus {}: empty entry; {}", flag, kExpected));
    int index = detail::parse_int(item);
    if (index < 0) throw UsageError(fmt::format("--gpus {}: '{}' is not a GPU index; {}", flag, item, kExpected));
    if (!seen.insert(index).second) throw UsageError(fmt::format("--gpus {}: GPU {} is listed twice", flag, index));
    indices.push_back(index);
  }
  // Then the machine (a typo first: it is the same on every machine). The list is in /proc's
  // numbering (the ranks get CUDA_DEVICE_ORDER=PCI_BUS_ID), whatever nodalrun's
  // CUDA_VISIBLE_DEVICES says: an index without an entry there names no GPU.
  std::vector<std::string> gpus;
  for (int index : indices) {
    if (index >= proc_gpus) {
      throw UsageError(fmt::format("--gpus {}: no GPU {} on this machine ({})", flag, index, found_gpus(proc_gpus)));
    }
    gpus.push_back(std::to_string(index));
  }
  return gpus;
}

/// `--gpus all`: CUDA_VISIBLE_DEVICES's entries when set (as written), else every GPU in /proc.
std::vector<std::string> all_gpus(const std::optional<std::string>& cuda_visible_devices, int proc_gpus) {
  if (cuda_visible_devices) {
    std::vector<std::string> gpus = split_list(*cuda_visible_devices);
    for (const std::string& item : gpus) {
      if (item.empty()) {
        throw UsageError(fmt::format("--gpus all: CUDA_VISIBLE_DEVICES='{}' has an empty entry (or none at all)",
                                     *cuda_visible_devices));
      }
    }
    return gpus;
  }
  if (proc_gpus <= 0) {
    throw UsageError(fmt::format("--gpus all: no NVIDIA GPU found ({} is empty or missing; CUDA_VISIBLE_DEVICES unset)",
                                 kProcNvidiaGpus));
  }
  std::vector<std::string> gpus;
  for (int i = 0; i < proc_gpus; ++i) gpus.push_back(std::to_string(i));
  return gpus;
}

}  // namespace

int count_gpus(const char* dir) {
  std::error_code error;
  int count = 0;
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) ++count;
  return count;
}

GpuAssignment assign_gpus(std::string_view flag, int nprocs, int ranks_per_gpu,
                          const std::optional<std::string>& cuda_visible_devices, int proc_gpus) {
  std::vector<std::string> gpus =
      flag == "all" ? all_gpus(cuda_visible_devices, proc_gpus) : parse_index_list(flag, proc_gpus);
  const int count = static_cast<int>(gpus.size());
  if (nprocs > count * ranks_per_gpu) {
    const int needed = (nprocs + count - 1) / count;
    throw UsageError(fmt::format("-n {} ranks on {} GPU{} with --ranks-per-gpu {}: at most {} ranks fit; raise "
                                 "--ranks-per-gpu to {} or give more GPUs",
                                 nprocs, count, count == 1 ? "" : "s", ranks_per_gpu, count * ranks_per_gpu, needed));
  }
  GpuAssignment assignment{fmt::format("{}", fmt::join(gpus, ",")), {}};
  for (int rank = 0; rank < nprocs; ++rank) assignment.device_of_rank.push_back(rank / ranks_per_gpu);
  return assignment;
}

}  // namespace nodal::launcher
