// Loaders as children of their trainer, started with nodal::spawn (forkserver start method).
#pragma once

#include <exception>
#include <mutex>
#include <thread>

#include "loader.hpp"

namespace fashion_mnist {

/// The trainer's `loaders` loader processes. nodal::spawn runs them and joins them, so it runs on
/// a thread of its own while the trainer trains. When a loader fails, the thread keeps the error
/// and closes the trainer's queues: the trainer, waiting for a batch, wakes up (LoaderEnded) and
/// rethrows it with rethrow_failure().
class LoaderChildren {
 public:
  /// Starts the fork server and then the thread. Call it while the process runs one thread (the
  /// server forks), after loading the data (the children share it copy-on-write) and before
  /// making shared tensors. `task.slot` is ignored (each child is one slot); `task.fail_at`
  /// applies to slot 0. Throws nodal::UsageError when threads already run.
  explicit LoaderChildren(const LoaderTask& task);
  /// On an error path (not joined): closes the queues, which makes the loaders fail and end, and
  /// waits for them.
  ~LoaderChildren();
  LoaderChildren(const LoaderChildren&) = delete;
  LoaderChildren& operator=(const LoaderChildren&) = delete;

  /// Rethrows the loaders' failure (nodal::ProcessRaisedError or ProcessExitedError), if any.
  void rethrow_failure();
  /// Waits until the loaders have ended; rethrows their failure.
  void join();

 private:
  void close_queues() const;

  int trainer_;
  int loaders_;
  int prefetch_;
  std::mutex mutex_;
  std::exception_ptr failure_;
  std::thread thread_;
};

}  // namespace fashion_mnist
