// Without a usable GPU (a build without CUDA, no driver, no device): every GPU call is a clear
// CudaError saying why, and nothing else changes. On a machine with a GPU these tests skip.
#include <gtest/gtest.h>

#include <nodal/cuda.hpp>
#include <nodal/errors.hpp>
#include <nodal/tensor.hpp>
#include <nodal/tensor_queue.hpp>

#include <string>

namespace {

#define SKIP_IF_GPU()                                                        \
  if (nodal::cuda::available()) GTEST_SKIP() << "a GPU is available here"

TEST(GpuUnavailable, ReasonIsGivenAndNoDevicesCounted) {
  SKIP_IF_GPU();
  EXPECT_EQ(nodal::cuda::device_count(), 0);
  std::string reason = nodal::cuda::unavailable_reason();
  EXPECT_FALSE(reason.empty());
  if (!nodal::cuda::built_with_cuda()) {
    EXPECT_NE(reason.find("built without CUDA"), std::string::npos) << reason;
  }
  std::printf("reason: %s\n", reason.c_str());
}

TEST(GpuUnavailable, CudaTensorThrowsCudaErrorWithTheReason) {
  SKIP_IF_GPU();
  const std::string reason = nodal::cuda::unavailable_reason();
  for (int device : {0, 1}) {
    try {
      (void)nodal::Tensor::empty({4}, nodal::DType::f32, nodal::Device::cuda(device));
      FAIL() << "Tensor::empty on cuda:" << device << " did not throw";
    } catch (const nodal::CudaError& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW((void)nodal::Tensor::zeros({2, 3}, nodal::DType::i64, nodal::Device::cuda(0)), nodal::CudaError);
  auto host = nodal::Tensor::zeros({8}, nodal::DType::f32);
  EXPECT_THROW((void)host.to(nodal::Device::cuda(0)), nodal::CudaError);
  EXPECT_THROW(nodal::cuda::synchronize(), nodal::CudaError);
  int fake = 0;
  EXPECT_THROW((void)nodal::Tensor::from_cuda(&fake, {1}, nodal::DType::i32, 0, nullptr), nodal::CudaError);
}

TEST(GpuUnavailable, CurrentStreamIsPerThreadAndDefaultsToTheLegacyStream) {
  EXPECT_EQ(nodal::cuda::current_stream(), nullptr);
  auto* fake = reinterpret_cast<nodal::cuda::Stream>(0x1000);
  nodal::cuda::set_current_stream(fake);
  if (nodal::cuda::built_with_cuda()) {
    EXPECT_EQ(nodal::cuda::current_stream(), fake);
  }
  nodal::cuda::set_current_stream(nullptr);
  EXPECT_EQ(nodal::cuda::current_stream(), nullptr);
}

TEST(GpuUnavailable, CpuTensorsStillTravelThroughQueues) {
  SKIP_IF_GPU();
  auto queue = nodal::TensorQueue::open("gpu-unavailable-cpu", 2);
  auto t = nodal::Tensor::zeros({16}, nodal::DType::f32);
  queue.put(t);
  auto item = queue.get();
  ASSERT_TRUE(item);
  EXPECT_EQ(item->tensor.device().kind, nodal::Device::Kind::cpu);
  EXPECT_TRUE(item->tensor.equal(t));
}

}  // namespace
