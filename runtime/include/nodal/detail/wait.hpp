// The one way nodal waits (DESIGN.md "Waiting"): spin with `pause` for a short time, then yield
// the CPU when ranks outnumber cores, then sleep on a futex; checking the job's abort word and
// the call's deadline throughout. Every blocking call in the runtime goes through wait_until.
// Internal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace nodal::detail {

/// What a waiter sleeps on and a waker bumps. Lives in shared memory next to the state it guards.
/// `sequence` changes on every notify; `sleepers` lets notify skip the futex syscall when nobody
/// sleeps (the common case on the hot path).
struct WaitWord {
  std::atomic<std::uint32_t> sequence{0};
  std::atomic<std::uint32_t> sleepers{0};
};

/// Wakes every waiter of `word` after the state it guards has changed (call it after the change).
void notify(WaitWord& word) noexcept;

using Clock = std::chrono::steady_clock;

/// No deadline when `timeout` is empty.
struct Deadline {
  std::optional<Clock::time_point> at;
  static Deadline after(std::optional<std::chrono::nanoseconds> timeout) {
    return timeout ? Deadline{Clock::now() + *timeout} : Deadline{};
  }
};

/// One waiter's progress through spin -> yield -> futex. Throws PeerFailure when the job has
/// been declared failed, TimeoutError (naming `what`) when the deadline passes.
class Waiter {
 public:
  Waiter(Deadline deadline, std::string_view what) noexcept : deadline_(deadline), what_(what) {}
  /// Waits a little; `seen` is word.sequence as read before the caller last tested its condition.
  void pause(WaitWord& word, std::uint32_t seen);
  /// Throws if the job failed or the deadline passed (also done by pause from time to time).
  void check() const;

 private:
  Deadline deadline_;
  std::string_view what_;
  std::uint32_t rounds_ = 0;
};

/// Returns once ready() holds. ready() may have side effects (a lock's compare-exchange, a
/// queue's dequeue): it is called until it first returns true.
template <class Ready>
void wait_until(WaitWord& word, Ready&& ready, Deadline deadline, std::string_view what) {
  if (ready()) return;
  Waiter waiter(deadline, what);
  for (;;) {
    std::uint32_t seen = word.sequence.load(std::memory_order_acquire);
    if (ready()) return;
    waiter.pause(word, seen);
  }
}

/// Throws PeerFailure if the job has been declared failed. Cheap: one load.
void check_job_alive();

/// True when this node runs more ranks than this process may use CPUs (then spinning only steals
/// the CPU from the rank we wait for).
bool oversubscribed() noexcept;

}  // namespace nodal::detail
