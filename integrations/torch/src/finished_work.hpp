// The Work every ProcessGroupNodal call returns: already finished, its future completed with the
// call's output tensors (a TensorList: DDP's allreduce hook reads the bucket at [0]). Without the
// finish() in its constructor, torch's Work::wait() would block forever (research/torch-c10d-
// backend.md: verified with torch 1.13). Internal.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>

#include <vector>

namespace nodal::torch_backend {

class FinishedWork final : public c10d::Work {
 public:
  FinishedWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// A finished Work for `op` whose result and future hold `outputs`.
c10::intrusive_ptr<c10d::Work> finished(int rank, c10d::OpType op, std::vector<at::Tensor> outputs = {});

}  // namespace nodal::torch_backend
