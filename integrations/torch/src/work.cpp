#include "work.hpp"

#include "tensor_bridge.hpp"

#include <nodal/errors.hpp>

#include <ATen/core/jit_type.h>

namespace nodal::torch_backend {
namespace {

c10::intrusive_ptr<c10::ivalue::Future> tensor_list_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

}  // namespace

FinishedWork::FinishedWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, op), outputs_(std::move(outputs)), future_(tensor_list_future()) {
  future_->markCompleted(c10::IValue(outputs_));
  finish();
}

c10::intrusive_ptr<c10d::Work> finished(int rank, c10d::OpType op, std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<FinishedWork>(rank, op, std::move(outputs));
}

PendingWork::PendingWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, op), outputs_(std::move(outputs)), future_(tensor_list_future()) {}

c10::intrusive_ptr<c10d::Work> pending(int rank, c10d::OpType op, const char* call, nodal::Work work,
                                       std::vector<at::Tensor> outputs) {
  auto result = c10::make_intrusive<PendingWork>(rank, op, std::move(outputs));
  // The callback holds the Work until the call ends (on the progress thread, or here if it has).
  work.on_completion([self = result, work, call]() mutable {
    std::exception_ptr error;
    try {
      work.test();
    } catch (...) {
      error = torch_error(std::current_exception(), call);
    }
    if (error) {
      self->future_->setError(error);
    } else {
      self->future_->markCompleted(c10::IValue(self->outputs_));
    }
    self->finish(error);
  });
  return result;
}

std::exception_ptr torch_error(std::exception_ptr error, const char* call) {
  try {
    std::rethrow_exception(error);
  } catch (const PeerFailure& e) {
    return std::make_exception_ptr(c10::Error(c10::str("nodal: ", call, ": PeerFailure: ", e.what()), ""));
  } catch (const UsageError& e) {
    return std::make_exception_ptr(c10::Error(c10::str("nodal: ", call, ": UsageError: ", e.what()), ""));
  } catch (const Error& e) {
    return std::make_exception_ptr(c10::Error(c10::str("nodal: ", call, ": ", e.what()), ""));
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace nodal::torch_backend
