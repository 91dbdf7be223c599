// nodalrun --gpus: which GPUs each rank sees and which one is its own, and every refusal.
#include <gtest/gtest.h>

#include <nodal/errors.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpu_assignment.hpp"

namespace nodal::launcher {
namespace {

/// The UsageError's message ("" when the assignment succeeds).
std::string refusal(std::string_view flag, int nprocs, int ranks_per_gpu, std::optional<std::string> visible,
                    int proc_gpus) {
  try {
    assign_gpus(flag, nprocs, ranks_per_gpu, visible, proc_gpus);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(GpuAssignment, ConsecutiveRanksShareAGpuAndEveryRankSeesTheWholeList) {
  GpuAssignment a = assign_gpus("0,1", 4, 2, std::nullopt, 2);
  EXPECT_EQ(a.visible_devices, "0,1");
  EXPECT_EQ(a.device_of_rank, (std::vector<int>{0, 0, 1, 1}));

  GpuAssignment b = assign_gpus("3,1,2", 3, 1, std::nullopt, 4);
  EXPECT_EQ(b.visible_devices, "3,1,2");  // in the order given
  EXPECT_EQ(b.device_of_rank, (std::vector<int>{0, 1, 2}));

  GpuAssignment partial = assign_gpus("0,1,2,3", 5, 2, std::nullopt, 4);  // fewer ranks than slots
  EXPECT_EQ(partial.device_of_rank, (std::vector<int>{0, 0, 1, 1, 2}));
}

TEST(GpuAssignment, ListIsCanonical) {
  GpuAssignment a = assign_gpus(" 07, 1", 2, 1, std::nullopt, 8);
  EXPECT_EQ(a.visible_devices, "7,1");
  // CUDA_VISIBLE_DEVICES of nodalrun does not change what a list means.
  EXPECT_EQ(assign_gpus("1", 1, 1, std::string("GPU-abc"), 2).visible_devices, "1");
}

TEST(GpuAssignment, AllMeansCudaVisibleDevicesWhenSet) {
  GpuAssignment a = assign_gpus("all", 3, 2, std::string("GPU-aaaa-1,GPU-bbbb-2"), 8);
  EXPECT_EQ(a.visible_devices, "GPU-aaaa-1,GPU-bbbb-2");  // UUIDs kept as written
  EXPECT_EQ(a.device_of_rank, (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(assign_gpus("all", 2, 1, std::string("5,3"), 0).visible_devices, "5,3");
}

TEST(GpuAssignment, AllMeansEveryGpuInProcOtherwise) {
  GpuAssignment a = assign_gpus("all", 4, 1, std::nullopt, 4);
  EXPECT_EQ(a.visible_devices, "0,1,2,3");
  EXPECT_EQ(a.device_of_rank, (std::vector<int>{0, 1, 2, 3}));
}

TEST(GpuAssignment, RefusesMalformedListsBeforeLookingAtTheMachine) {
  // proc_gpus 0: a typo is named as such, not as a GPU that is missing.
  EXPECT_EQ(refusal("0,,1", 2, 1, std::nullopt, 0), "--gpus 0,,1: empty entry; expected all or GPU indices like 0,1,3");
  EXPECT_EQ(refusal("", 1, 1, std::nullopt, 0), "--gpus : empty entry; expected all or GPU indices like 0,1,3");
  EXPECT_EQ(refusal("0,", 1, 1, std::nullopt, 0), "--gpus 0,: empty entry; expected all or GPU indices like 0,1,3");
  EXPECT_EQ(refusal("0,x", 2, 1, std::nullopt, 0),
            "--gpus 0,x: 'x' is not a GPU index; expected all or GPU indices like 0,1,3");
  EXPECT_EQ(refusal("-1", 1, 1, std::nullopt, 0),
            "--gpus -1: '-1' is not a GPU index; expected all or GPU indices like 0,1,3");
  EXPECT_EQ(refusal("ALL", 1, 1, std::nullopt, 2),
            "--gpus ALL: 'ALL' is not a GPU index; expected all or GPU indices like 0,1,3");
  EXPECT_EQ(refusal("0,1,00", 3, 1, std::nullopt, 0), "--gpus 0,1,00: GPU 0 is listed twice");
}

TEST(GpuAssignment, RefusesAnIndexBeyondTheGpusInProc) {
  EXPECT_EQ(refusal("0,2", 2, 1, std::nullopt, 2),
            "--gpus 0,2: no GPU 2 on this machine (found 2 GPUs in /proc/driver/nvidia/gpus: 0-1)");
  EXPECT_EQ(refusal("1", 1, 1, std::nullopt, 1),
            "--gpus 1: no GPU 1 on this machine (found 1 GPU in /proc/driver/nvidia/gpus: 0)");
}

TEST(GpuAssignment, RefusesEveryListWithoutAnyGpuInProc) {
  const std::string none = "found no GPU: /proc/driver/nvidia/gpus is empty or missing";
  EXPECT_EQ(refusal("5", 1, 1, std::nullopt, 0), "--gpus 5: no GPU 5 on this machine (" + none + ")");
  EXPECT_EQ(refusal("0", 1, 1, std::nullopt, 0), "--gpus 0: no GPU 0 on this machine (" + none + ")");
  // nodalrun's CUDA_VISIBLE_DEVICES names no GPU of /proc's numbering: it does not make a list valid.
  EXPECT_EQ(refusal("0,1", 2, 1, std::string("0,1"), 0), "--gpus 0,1: no GPU 0 on this machine (" + none + ")");
}

TEST(GpuAssignment, RefusesAllWithoutAnyGpu) {
  EXPECT_EQ(refusal("all", 1, 1, std::nullopt, 0),
            "--gpus all: no NVIDIA GPU found (/proc/driver/nvidia/gpus is empty or missing; CUDA_VISIBLE_DEVICES "
            "unset)");
  EXPECT_EQ(refusal("all", 1, 1, std::string(""), 4),
            "--gpus all: CUDA_VISIBLE_DEVICES='' has an empty entry (or none at all)");
  EXPECT_EQ(refusal("all", 1, 1, std::string("0,,1"), 4),
            "--gpus all: CUDA_VISIBLE_DEVICES='0,,1' has an empty entry (or none at all)");
}

TEST(GpuAssignment, RefusesMoreRanksThanFit) {
  EXPECT_EQ(refusal("0,1", 8, 1, std::nullopt, 2),
            "-n 8 ranks on 2 GPUs with --ranks-per-gpu 1: at most 2 ranks fit; raise --ranks-per-gpu to 4 or give "
            "more GPUs");
  EXPECT_EQ(refusal("all", 5, 2, std::string("0,1"), 0),
            "-n 5 ranks on 2 GPUs with --ranks-per-gpu 2: at most 4 ranks fit; raise --ranks-per-gpu to 3 or give "
            "more GPUs");
  EXPECT_EQ(refusal("0", 2, 1, std::nullopt, 1),
            "-n 2 ranks on 1 GPU with --ranks-per-gpu 1: at most 1 ranks fit; raise --ranks-per-gpu to 2 or give "
            "more GPUs");
}

TEST(GpuAssignment, CountsTheEntriesOfTheDriversDirectory) {
  auto dir = std::filesystem::temp_directory_path() / ("nodal-gpus-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(count_gpus(dir.c_str()), 0);  // missing
  std::filesystem::create_directories(dir);
  EXPECT_EQ(count_gpus(dir.c_str()), 0);  // empty
  for (const char* bus : {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"}) std::filesystem::create_directory(dir / bus);
  EXPECT_EQ(count_gpus(dir.c_str()), 3);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace nodal::launcher
