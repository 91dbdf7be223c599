// Process-shared counting semaphores, like Python's multiprocessing.Semaphore and
// BoundedSemaphore: named objects in the job's arena that every process of the job opens by name.
// A process that dies holding units it acquired (and did not release itself) turns every wait
// into PeerFailure, as a robust mutex's EOWNERDEAD does, instead of a deadlock.
#pragma once

#include <nodal/sync.hpp>

#include <string>

namespace nodal {

namespace detail {
struct SemaphoreState;
}

/// A counter processes acquire (decrement, waiting while it is 0) and release (increment).
class Semaphore {
 public:
  /// The job's semaphore called `name`, created with `value` units by the first opener. Throws
  /// UsageError when it exists as a BoundedSemaphore or `value` is negative; ShmError.
  static Semaphore open(const std::string& name, int value = 1);
  /// Takes one unit, waiting while there is none. Throws TimeoutError after `timeout`, PeerFailure
  /// when the job failed or a process died holding units of this semaphore.
  void acquire(Timeout timeout = std::nullopt);
  /// Takes one unit if there is one now.
  bool try_acquire();
  /// Gives `n` units back (any process may release, as in Python). BoundedSemaphore: UsageError
  /// when that would exceed its initial value.
  void release(int n = 1);
  /// The units free now (Python's get_value).
  int value() const;

 protected:
  explicit Semaphore(detail::SemaphoreState* state) : state_(state) {}
  detail::SemaphoreState* state_;
};

/// A Semaphore that refuses to be released above its initial value (multiprocessing.BoundedSemaphore):
/// a release without a matching acquire is a bug, caught at the release.
class BoundedSemaphore : public Semaphore {
 public:
  /// Throws UsageError when the semaphore exists unbounded or with another bound.
  static BoundedSemaphore open(const std::string& name, int value = 1);

 private:
  using Semaphore::Semaphore;
};

}  // namespace nodal
