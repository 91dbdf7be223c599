// The GPU layer's requirements of the driver and the device (runtime/src/gpu/compatibility.hpp),
// decided from the numbers the driver reports: checked here without a GPU, with the messages a
// user would read.
#include "compatibility.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace nodal::detail::gpu {
namespace {

TEST(EntryPointVersion, IsTheToolkitsUnlessTheDriverIsOlder) {
  EXPECT_EQ(entry_point_version(13000, 13000), 13000);
  EXPECT_EQ(entry_point_version(13010, 13000), 13000);  // a 13.1 build on an r580 (13.0) driver
  EXPECT_EQ(entry_point_version(12080, 12040), 12040);  // a 12.8 build on r550 (12.4)
  EXPECT_EQ(entry_point_version(13000, 13020), 13000);  // a newer driver: the header's ABI
  EXPECT_EQ(entry_point_version(13000, 0), 13000);      // unknown (no driver): the toolkit's
}

DeviceCapabilities capable(int device = 0) {
  DeviceCapabilities caps;
  caps.device = device;
  caps.virtual_memory = true;
  caps.posix_fd_handles = true;
  caps.ipc_events = true;
  caps.compute_mode = ComputeMode::default_;
  return caps;
}

TEST(MissingCapability, NothingOnACapableGpuInDefaultMode) {
  EXPECT_EQ(missing_capability(capable(), GpuUse::pool_export), "");
  EXPECT_EQ(missing_capability(capable(), GpuUse::shared_by_processes, 8), "");
}

TEST(MissingCapability, ExclusiveProcessModeRefusesRanksSharingAGpu) {
  DeviceCapabilities caps = capable(0);
  caps.compute_mode = ComputeMode::exclusive_process;
  EXPECT_EQ(missing_capability(caps, GpuUse::shared_by_processes, 2),
            "GPU 0 is in EXCLUSIVE_PROCESS compute mode: 2 ranks sharing it (--ranks-per-gpu 2) need the DEFAULT "
            "mode (nvidia-smi -i 0 -c DEFAULT, as root)");
  EXPECT_EQ(missing_capability(caps, GpuUse::shared_by_processes, 0),
            "GPU 0 is in EXCLUSIVE_PROCESS compute mode and another process holds it: ranks that share a GPU "
            "(--ranks-per-gpu > 1) need the DEFAULT mode (nvidia-smi -i 0 -c DEFAULT, as root)");
  // One process per GPU is what the mode is for: the pool works, and so does one rank alone.
  EXPECT_EQ(missing_capability(caps, GpuUse::shared_by_processes, 1), "");
  EXPECT_EQ(missing_capability(caps, GpuUse::pool_export), "");
}

TEST(MissingCapability, ProhibitedModeRefusesEverything) {
  DeviceCapabilities caps = capable(3);
  caps.compute_mode = ComputeMode::prohibited;
  const std::string expected = "GPU 3 is in PROHIBITED compute mode: no process may use it (nvidia-smi -i 3 -c DEFAULT, as root)";
  EXPECT_EQ(missing_capability(caps, GpuUse::pool_export), expected);
  EXPECT_EQ(missing_capability(caps, GpuUse::shared_by_processes, 1), expected);
}

TEST(MissingCapability, ThePoolNeedsVirtualMemoryAndFileDescriptorExport) {
  DeviceCapabilities caps = capable(1);
  caps.virtual_memory = false;
  EXPECT_EQ(missing_capability(caps, GpuUse::pool_export),
            "GPU 1 does not support CUDA virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_"
            "SUPPORTED is 0): nodal's GPU pool needs it to share CUDA tensors between processes");
  caps = capable(1);
  caps.posix_fd_handles = false;
  EXPECT_EQ(missing_capability(caps, GpuUse::pool_export),
            "GPU 1 cannot export memory as POSIX file descriptors (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_"
            "DESCRIPTOR_SUPPORTED is 0; a virtualised or sandboxed driver?): nodal's GPU pool shares its chunks "
            "that way");
  // Sharing through the legacy IPC API needs neither.
  EXPECT_EQ(missing_capability(caps, GpuUse::shared_by_processes, 2), "");
}

TEST(MissingCapability, InterprocessEventsAreNeededEitherWay) {
  DeviceCapabilities caps = capable(0);
  caps.ipc_events = false;
  const std::string expected =
      "GPU 0 does not support interprocess events (CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED is 0): nodal orders one "
      "process's GPU work after another's with them";
  EXPECT_EQ(missing_capability(caps, GpuUse::pool_export), expected);
  EXPECT_EQ(missing_capability(caps, GpuUse::shared_by_processes, 2), expected);
}

constexpr std::uint64_t kMiB = 1 << 20;

TEST(OpenedRange, TheProducersAllocationExactlyIsAccepted) {
  EXPECT_EQ(opened_range_problem({0x7000'0000, 0x7000'0000, 4 * kMiB}, 4 * kMiB, 4 * kMiB), "");
  EXPECT_EQ(opened_range_problem({0x7000'0000, 0x7000'0000, 1024}, 1024, 1000), "");  // small, but its own range
}

TEST(OpenedRange, APointerInsideALargerBlockIsTheAllocationWithinIt) {
  // The driver mapped the 2 MiB block and pointed at the 1024-byte allocation 512 bytes into it.
  EXPECT_EQ(opened_range_problem({0x7000'0200, 0x7000'0000, 2 * kMiB}, 1024, 1024), "");
}

TEST(OpenedRange, ABlocksStartOfAnotherSizeIsRefused) {
  // Opened at the start of a 2 MiB range for a 1024-byte allocation: maybe the block's start, and
  // the bytes there another allocation's.
  const std::string problem = opened_range_problem({0x7000'0000, 0x7000'0000, 2 * kMiB}, 1024, 1024);
  EXPECT_EQ(problem,
            "its IPC handle opened 2097152 bytes at offset 0 of a mapped range, where the producer's allocation has "
            "1024 bytes: CUDA shares the whole block behind small cudaMalloc allocations. Share allocations of at "
            "least 2 MiB (a multiple of 2 MiB), or make the tensor with Tensor::empty on the GPU");
}

TEST(OpenedRange, ARangeTooSmallForTheTensorIsRefused) {
  EXPECT_NE(opened_range_problem({0x7000'0000, 0x7000'0000, kMiB}, kMiB, kMiB + 1), "");
  EXPECT_NE(opened_range_problem({0x7010'0000, 0x7000'0000, kMiB}, 4 * kMiB, 16), "");  // past the range's end
  EXPECT_NE(opened_range_problem({0x6000'0000, 0x7000'0000, kMiB}, kMiB, 16), "");      // before its start
}

TEST(ComputeModeName, NamesNvidiaSmiUses) {
  EXPECT_STREQ(compute_mode_name(ComputeMode::default_), "DEFAULT");
  EXPECT_STREQ(compute_mode_name(ComputeMode::exclusive_thread), "EXCLUSIVE_THREAD");
  EXPECT_STREQ(compute_mode_name(ComputeMode::prohibited), "PROHIBITED");
  EXPECT_STREQ(compute_mode_name(ComputeMode::exclusive_process), "EXCLUSIVE_PROCESS");
}

}  // namespace
}  // namespace nodal::detail::gpu
