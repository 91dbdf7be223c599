// The Work ProcessGroupNodal returns: its future holds the call's output tensors once the call has
// ended (a TensorList: DDP's allreduce hook reads the bucket at [0]). A call that ran on the
// caller's thread returns it finished (finished()); an allreduce running on the communicator's
// progress thread (NODAL_TORCH_ASYNC=1) returns it pending, and the progress thread completes it
// when the call ends (pending(), through nodal::Work::on_completion). complete() both completes
// the future and calls Work::finish(): without finish() torch's Work::wait() blocks forever
// (research/torch-c10d-backend.md, verified with torch 1.13). Internal.
#pragma once

#include <nodal/work.hpp>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/core/ivalue.h>

#include <exception>
#include <vector>

namespace nodal::torch_backend {

class TensorListWork final : public c10d::Work {
 public:
  TensorListWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  /// Ends the Work: its future gets the outputs, or `error` (then wait() rethrows it).
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// A finished Work for `op` whose result and future hold `outputs`.
c10::intrusive_ptr<c10d::Work> finished(int rank, c10d::OpType op, std::vector<at::Tensor> outputs = {});

/// A Work for `op` that ends (with `outputs`, or with the error as torch_error words it) when
/// `work` does.
c10::intrusive_ptr<c10d::Work> pending(int rank, c10d::OpType op, const char* call, nodal::Work work,
                                       std::vector<at::Tensor> outputs);

/// nodal's error `error` from `call` as the c10::Error torch code expects ("nodal: allreduce:
/// PeerFailure: ..."); other exceptions as they are.
std::exception_ptr torch_error(std::exception_ptr error, const char* call);

}  // namespace nodal::torch_backend
