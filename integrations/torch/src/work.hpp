// The Work objects ProcessGroupNodal returns. Internal.
// - FinishedWork: a call that ran on the caller's thread; already finished, its future completed
//   with the call's output tensors (a TensorList: DDP's allreduce hook reads the bucket at [0]).
//   Without the finish() in its constructor torch's Work::wait() would block forever
//   (research/torch-c10d-backend.md, verified with torch 1.13).
// - PendingWork: a call running on the communicator's progress thread (a nodal::Work); the
//   progress thread finishes it and completes its future when the call ends (Work::on_completion),
//   so DDP's backward pass goes on while a bucket is reduced, as with torch's own backends.
#pragma once

#include <nodal/work.hpp>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>

#include <exception>
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

class PendingWork final : public c10d::Work {
 public:
  PendingWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  friend c10::intrusive_ptr<c10d::Work> pending(int, c10d::OpType, const char*, nodal::Work, std::vector<at::Tensor>);
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// A Work for `op` that finishes (and completes its future with `outputs`, or with the error as
/// torch_error words it) when `work` does.
c10::intrusive_ptr<c10d::Work> pending(int rank, c10d::OpType op, const char* call, nodal::Work work,
                                       std::vector<at::Tensor> outputs);

/// nodal's error `error` from `call` as the c10::Error torch code expects ("nodal: allreduce:
/// PeerFailure: ..."); other exceptions as they are.
std::exception_ptr torch_error(std::exception_ptr error, const char* call);

}  // namespace nodal::torch_backend
