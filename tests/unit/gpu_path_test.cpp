// Which GPU path a communicator takes (collectives/src/gpu_path.hpp): host-only, so it runs in
// every build, with or without a GPU.
#include "gpu_path.hpp"

#include <nodal/cuda.hpp>
#include <nodal/errors.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using nodal::UsageError;
using nodal::detail::choose_gpu_path;
using nodal::detail::GpuPath;
using nodal::detail::GpuUuid;

GpuUuid gpu(std::uint8_t id) {
  GpuUuid uuid{};
  uuid[0] = 0x47;
  uuid[15] = id;
  return uuid;
}

std::string message_of(const std::vector<GpuUuid>& gpus, bool nccl, const char* forced) {
  try {
    choose_gpu_path(gpus, nccl, forced);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no UsageError";
}

TEST(GpuPathTest, OneRankPerGpuTakesNcclWhenBuiltWithIt) {
  EXPECT_EQ(choose_gpu_path({gpu(0), gpu(1), gpu(2), gpu(3)}, true, ""), GpuPath::nccl);
  EXPECT_EQ(choose_gpu_path({gpu(0)}, true, "auto"), GpuPath::nccl);  // one rank: NCCL's one layout on one GPU
  EXPECT_EQ(choose_gpu_path({gpu(0), gpu(1)}, false, ""), GpuPath::cuda_ipc);
}

TEST(GpuPathTest, RanksSharingAGpuTakeCudaIpc) {
  EXPECT_EQ(choose_gpu_path({gpu(0), gpu(0)}, true, ""), GpuPath::cuda_ipc);
  EXPECT_EQ(choose_gpu_path({gpu(0), gpu(1), gpu(2), gpu(1)}, true, ""), GpuPath::cuda_ipc);
  EXPECT_EQ(choose_gpu_path(std::vector<GpuUuid>(8, gpu(5)), true, ""), GpuPath::cuda_ipc);
}

TEST(GpuPathTest, ForcedBackends) {
  EXPECT_EQ(choose_gpu_path({gpu(0), gpu(1)}, true, "cuda_ipc"), GpuPath::cuda_ipc);
  EXPECT_EQ(choose_gpu_path({gpu(0), gpu(1)}, true, "nccl"), GpuPath::nccl);
  // NCCL refuses two ranks on one GPU: say which two, and what to do.
  std::string shared = message_of({gpu(0), gpu(1), gpu(2), gpu(1)}, true, "nccl");
  EXPECT_NE(shared.find("ranks 1 and 3 share a GPU"), std::string::npos) << shared;
  EXPECT_NE(shared.find("Duplicate GPU detected"), std::string::npos) << shared;
  EXPECT_NE(message_of({gpu(0)}, false, "nccl").find("built without NCCL"), std::string::npos);
  EXPECT_NE(message_of({gpu(0)}, true, "gloo").find("NODAL_GPU_BACKEND='gloo'"), std::string::npos);
}

TEST(GpuPathTest, AcrossNodesOnlyNcclWithOneGpuPerRank) {
  auto across = [](const std::vector<GpuUuid>& gpus, bool nccl, const char* forced) {
    try {
      return std::string(nodal::detail::gpu_path_name(choose_gpu_path(gpus, nccl, forced, true)));
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
  };
  EXPECT_EQ(across({gpu(0), gpu(1), gpu(2), gpu(3)}, true, ""), "nccl");
  EXPECT_EQ(across({gpu(0), gpu(1)}, true, "auto"), "nccl");
  EXPECT_NE(across({gpu(0), gpu(1), gpu(1)}, true, "").find("ranks 1 and 2 share a GPU"), std::string::npos);
  EXPECT_NE(across({gpu(0), gpu(1)}, false, "").find("built without it"), std::string::npos);
  EXPECT_NE(across({gpu(0), gpu(1)}, true, "cuda_ipc").find("CUDA IPC does not cross nodes"), std::string::npos);
}

TEST(GpuPathTest, GpuUuidWithoutAGpuSaysWhy) {
  if (nodal::cuda::available()) GTEST_SKIP() << "a GPU is available here";
  try {
    nodal::detail::gpu_uuid(0);
    ADD_FAILURE() << "no CudaError";
  } catch (const nodal::CudaError& e) {
    EXPECT_NE(std::string(e.what()).find(nodal::cuda::unavailable_reason()), std::string::npos) << e.what();
  }
}

}  // namespace
