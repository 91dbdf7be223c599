#include "work.hpp"

#include <nodal/errors.hpp>

#include <ATen/core/jit_type.h>

namespace nodal::torch_backend {

TensorListWork::TensorListWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, op), outputs_(std::move(outputs)) {
  // One type for every future (made once: a Work is made on every call).
  static const c10::TypePtr tensor_list = c10::ListType::create(c10::TensorType::get());
  future_ = c10::make_intrusive<c10::ivalue::Future>(tensor_list);
}

void TensorListWork::complete(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

c10::intrusive_ptr<c10d::Work> finished(int rank, c10d::OpType op, std::vector<at::Tensor> outputs) {
  auto work = c10::make_intrusive<TensorListWork>(rank, op, std::move(outputs));
  work->complete(nullptr);
  return work;
}

c10::intrusive_ptr<c10d::Work> pending(int rank, c10d::OpType op, const char* call, nodal::Work work,
                                       std::vector<at::Tensor> outputs) {
  auto result = c10::make_intrusive<TensorListWork>(rank, op, std::move(outputs));
  // The callback holds the torch Work until the call ends (on the progress thread, or here if it has).
  work.on_completion([self = result, work, call]() mutable {
    std::exception_ptr error;
    try {
      work.test();
    } catch (...) {
      error = torch_error(std::current_exception(), call);
    }
    self->complete(error);
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
