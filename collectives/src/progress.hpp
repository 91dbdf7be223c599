// A communicator's progress thread: the calls of its non-blocking collectives (and, once it exists,
// of its blocking ones) run there one at a time, in the order they were made, so every rank still
// makes the same calls in the same order. Internal.
//
// Why a thread rather than progress by the caller: the shared-memory algorithms move the data
// with the CPU (there is no NIC or DMA engine to hand a message to), so a call overlaps the
// caller's compute only if another thread does the copying and reducing. MPI libraries and
// torch's ProcessGroupGloo do the same for their shared-memory and TCP paths.
#pragma once

#include <nodal/cuda.hpp>
#include <nodal/detail/wait.hpp>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace nodal::detail {

/// One queued call, as its Work sees it.
struct WorkState {
  std::atomic<bool> done{false};
  WaitWord word;             ///< notified when done
  std::exception_ptr error;  ///< set before done
  std::string what;          ///< "iallreduce on communicator 'world'", for a TimeoutError
  std::mutex mutex;          ///< orders `done` against on_completion's check of it
  std::vector<std::function<void()>> callbacks;  ///< Work::on_completion's, until done
};

/// Waits for `work` (Work::wait): throws TimeoutError after `timeout`, PeerFailure when the job
/// fails, then the call's own error.
void wait_work(WorkState& work, std::optional<std::chrono::nanoseconds> timeout);

class ProgressThread {
 public:
  ProgressThread();
  /// Lets the queued calls finish, then stops the thread. Called on the thread itself (the last
  /// reference to the communicator went with a finished call), it lets the thread end by itself.
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  /// Queues `call`, to run with the caller's cuda::current_stream() as the thread's, and returns
  /// its state (done once it ran; `error` holds what it threw).
  std::shared_ptr<WorkState> submit(std::function<void()> call, std::string what);
  /// Whether the calling thread is this progress thread (its calls then run at once).
  bool on_this_thread() const noexcept { return std::this_thread::get_id() == id_; }
  /// Whether every call submitted so far has finished (and its effects are visible to the caller).
  /// The communicator's one user thread may then run a blocking call itself, in order: nothing is
  /// queued, and only that thread submits. Saves the thread hop (~25 us on the 2-core VM).
  bool idle() const noexcept;

 private:
  struct Queue;
  /// The thread's loop; it holds its own reference to the queue.
  static void run_queue(std::shared_ptr<Queue> queue);
  std::shared_ptr<Queue> queue_;
  std::thread::id id_;
};

}  // namespace nodal::detail
