// A process-shared condition variable, like Python's multiprocessing.Condition: a named object in
// the job's arena with its own recursive lock (multiprocessing.Condition's default RLock).
#pragma once

#include <nodal/sync.hpp>

#include <functional>
#include <string>

namespace nodal {

namespace detail {
struct ConditionState;
}

class Condition {
 public:
  /// The job's condition called `name` (its lock is the RLock "condition:<name>"). Throws ShmError.
  static Condition open(const std::string& name);

  /// The condition's lock (RLock semantics: the holder may take it again).
  void acquire(Timeout timeout = std::nullopt) { lock_.acquire(timeout); }
  void release() { lock_.release(); }
  RLock& get_lock() { return lock_; }

  /// Releases the lock (all recursion levels), waits for a notify, takes the lock back as it was.
  /// Returns false when `timeout` passed first (the lock is taken back then too). Throws
  /// UsageError when this thread does not hold the lock; PeerFailure when the job failed or the
  /// lock's holder died.
  bool wait(Timeout timeout = std::nullopt);
  /// Waits until predicate() holds (checked under the lock, first before any wait); returns its
  /// last value, false when `timeout` passed first.
  bool wait_for(const std::function<bool()>& predicate, Timeout timeout = std::nullopt);
  /// Wakes up to `n` of the processes (threads) waiting now. The caller must hold the lock
  /// (UsageError otherwise), as in Python.
  void notify(int n = 1);
  void notify_all();

 private:
  Condition(detail::ConditionState* state, RLock lock) : state_(state), lock_(lock) {}
  detail::ConditionState* state_;
  RLock lock_;
};

}  // namespace nodal
