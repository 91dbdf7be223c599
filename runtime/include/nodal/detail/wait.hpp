// The one way nodal waits (DESIGN.md "Waiting"): spin with `pause` for a short time, then yield
// the CPU when ranks outnumber cores, then sleep on a futex; checking the job's abort word and
// the call's deadline throughout. Every blocking call in the runtime goes through wait_until.
// Internal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

namespace nodal {
struct ArenaControl;
}

namespace nodal::detail {

struct WaitEntry;

/// What a waiter sleeps on and a waker bumps. Lives in shared memory next to the state it guards.
/// `sequence` changes on every notify that finds a sleeper; `sleepers` lets notify skip the
/// atomic increment and the futex syscall when nobody sleeps (the common case on a hot path:
/// then notify costs one fence and one load of a line every rank only reads).
struct WaitWord {
  std::atomic<std::uint32_t> sequence{0};
  std::atomic<std::uint32_t> sleepers{0};
};

/// Counts this thread among `word`'s sleepers while it lives: a ready() or a sleep that throws
/// (TimeoutError, PeerFailure) still takes it off, or every later notify would pay the syscall.
class SleeperMark {
 public:
  explicit SleeperMark(WaitWord& word) noexcept : word_(word) { word_.sleepers.fetch_add(1, std::memory_order_seq_cst); }
  ~SleeperMark() { word_.sleepers.fetch_sub(1, std::memory_order_seq_cst); }
  SleeperMark(const SleeperMark&) = delete;
  SleeperMark& operator=(const SleeperMark&) = delete;

 private:
  WaitWord& word_;
};

/// The spin-wait hint (x86 `pause`, AArch64 `yield`): lets the sibling hyperthread run and
/// stops the loop's loads from piling up. One instruction; nothing where neither exists.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// Wakes every waiter of `word` after the state it guards has changed (call it after the change).
/// Correct against a waiter about to sleep: the waiter registers in `sleepers` and then re-tests
/// its condition (Dekker's pattern, both sides sequentially consistent), so either it sees the
/// change or this call sees it and bumps `sequence`.
void notify(WaitWord& word) noexcept;

using Clock = std::chrono::steady_clock;

/// One sleep of at most `timeout` on `word` unless ready() holds (Dekker's pattern as in
/// wait_until), without the job's abort check: for nodalrun's own threads, which go on after a
/// job failed. Returns ready()'s last value.
bool sleep_on(WaitWord& word, const std::function<bool()>& ready, std::chrono::nanoseconds timeout);

/// No deadline when `timeout` is empty.
struct Deadline {
  std::optional<Clock::time_point> at;
  static Deadline after(std::optional<std::chrono::nanoseconds> timeout) {
    return timeout ? Deadline{Clock::now() + *timeout} : Deadline{};
  }
};

/// One waiter's progress through spin -> yield -> futex. Throws PeerFailure when the job has
/// been declared failed, TimeoutError (naming `what`) when the deadline passes. A waiter that
/// sleeps shows its call in the job's wait table (wait_record.hpp) until it is done.
class Waiter {
 public:
  /// `yield_core`: what this waiter waits for needs another process of this node to run (a
  /// node's agent, which moves steps between nodes): it yields its core as when oversubscribed.
  Waiter(Deadline deadline, std::string_view what, bool yield_core = false) noexcept
      : deadline_(deadline), what_(what), yield_core_(yield_core) {}
  ~Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  /// One spin (a `pause`) or, when ranks outnumber cores, one sched_yield. Returns false once
  /// the spinning and yielding time is over: the caller should then sleep().
  bool spin();
  /// Sleeps on the futex while word.sequence == seen, at most one slice (so the abort word and
  /// the deadline are re-checked regularly).
  void sleep(WaitWord& word, std::uint32_t seen);
  /// Throws if the job failed or the deadline passed (also done by spin and sleep).
  void check() const;

 private:
  Deadline deadline_;
  std::string_view what_;
  bool yield_core_ = false;
  std::uint32_t rounds_ = 0;
  Clock::time_point started_{};
  WaitEntry* entry_ = nullptr;  ///< the wait table's entry, once the waiter first slept
};

/// Returns once ready() holds. ready() may have side effects (a lock's compare-exchange, a
/// queue's dequeue): it is called until it first returns true. The condition is re-tested
/// after every `pause`, so a spinning waiter sees a change within one cache-line transfer.
/// `yield_core`: see Waiter.
template <class Ready>
void wait_until(WaitWord& word, Ready&& ready, Deadline deadline, std::string_view what, bool yield_core = false) {
  if (ready()) return;
  Waiter waiter(deadline, what, yield_core);
  for (;;) {
    if (waiter.spin()) {
      if (ready()) return;
      continue;
    }
    std::uint32_t seen = word.sequence.load(std::memory_order_seq_cst);
    bool done = false;
    {
      SleeperMark mark(word);
      done = ready();
      if (!done) waiter.sleep(word, seen);
    }
    if (done || ready()) return;
  }
}

/// Waits until try_take() succeeds (a lock's or a semaphore's compare-exchange). Once in 256
/// failed attempts it calls check_holder(), which throws PeerFailure when the process holding what
/// it waits for has died: such a holder never gives it back. `timeout` empty: no deadline.
template <class TryTake, class CheckHolder>
void wait_to_take(WaitWord& word, TryTake&& try_take, CheckHolder&& check_holder,
                  std::optional<std::chrono::nanoseconds> timeout, std::string_view what) {
  std::uint32_t attempts = 0;
  wait_until(
      word,
      [&] {
        if (try_take()) return true;
        if (++attempts % 256 == 0) check_holder();
        return false;
      },
      Deadline::after(timeout), what);
}

/// Throws PeerFailure if the job has been declared failed. Cheap: one load.
void check_job_alive();
/// Whether the job has been declared failed (the test check_job_alive makes). Cheap: one load.
bool job_failed();
/// Throws PeerFailure naming what `control` says failed first (its rank, if one is to blame).
[[noreturn]] void throw_peer_failure(const ArenaControl& control);

/// True when this node runs more ranks than this process may use CPUs (then spinning only steals
/// the CPU from the rank we wait for).
bool oversubscribed() noexcept;

}  // namespace nodal::detail
