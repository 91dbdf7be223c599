// nodal::Work: the handle a non-blocking collective returns (Communicator::iallreduce, ...), like
// MPI_Request and torch.distributed's Work (async_op=True).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

namespace nodal {

namespace detail {
struct WorkState;
}

/// A non-blocking call in flight. Cheap to copy (copies share the call); keeps the call's tensors
/// alive until it completes. A default-constructed Work is a completed no-op.
class Work {
 public:
  Work() = default;

  /// Whether the call has finished, successfully or not. Never throws, never waits.
  bool is_completed() const noexcept;
  /// Like is_completed(), but once the call has finished with an error, rethrows it (UsageError
  /// for a mismatch with the peers' calls, PeerFailure, CudaError), on every call of test/wait.
  bool test();
  /// Waits until the call has finished and rethrows its error, if any. With a timeout, throws
  /// TimeoutError once it passes (the call goes on: wait again later, as with torch's
  /// Work.wait(timeout)). Throws PeerFailure when the job fails while waiting. Waits the
  /// runtime's way (spin, yield when oversubscribed, futex).
  void wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  /// Runs `callback` once the call has finished, successfully or not (test() then says which):
  /// on the communicator's progress thread right after the call, or at once on this thread when
  /// it has finished already. What completes a torch future without a thread waiting for it
  /// (integrations/torch). Keep it short: the communicator's next call waits for it. It must not
  /// throw (what it throws is dropped) nor make calls on the same communicator.
  void on_completion(std::function<void()> callback);

 private:
  friend class Communicator;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace nodal
