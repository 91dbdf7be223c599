#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/sync.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/wait.hpp>
#include <nodal/detail/wait_record.hpp>

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

namespace nodal {
namespace detail {

struct LockState {
  explicit LockState(std::string_view lock_name = {}) : name(lock_name) {}
  WaitWord word;
  std::atomic<std::uint32_t> locked{0};
  std::atomic<std::int32_t> owner{0};  ///< pid of the holder, 0 when free
  const ObjectName name;
};

struct RLockState {
  explicit RLockState(std::string_view lock_name) : name(lock_name) {}
  WaitWord word;
  std::atomic<std::int32_t> owner_tid{0};  ///< the holding thread (gettid: unique system-wide), 0 when free
  std::atomic<std::int32_t> owner_pid{0};  ///< its process, to tell a dead holder
  std::int32_t count = 0;                  ///< recursion depth, touched by the holder only
  const ObjectName name;
};

struct EventState {
  explicit EventState(std::string_view event_name) : name(event_name) {}
  WaitWord word;
  std::atomic<std::uint32_t> flag{0};
  const ObjectName name;
};

struct BarrierState {
  BarrierState(int n, std::string_view barrier_name) : parties(n), name(barrier_name) {}
  WaitWord word;
  std::atomic<std::uint32_t> arrived{0};
  std::atomic<std::uint32_t> generation{0};
  const int parties;
  const ObjectName name;
};

namespace {

/// The wait table's lines for a Lock, Event or Barrier wait (wait_record.hpp).
void describe_lock(const void* self, std::string& what, std::string& waiting_for) {
  const LockState& state = *static_cast<const LockState*>(self);
  what = fmt::format("Lock '{}' lock", state.name.text);
  waiting_for = fmt::format("pid {} to unlock it", state.owner.load(std::memory_order_relaxed));
}
void describe_rlock(const void* self, std::string& what, std::string& waiting_for) {
  const RLockState& state = *static_cast<const RLockState*>(self);
  what = fmt::format("RLock '{}' acquire", state.name.text);
  waiting_for = fmt::format("pid {} (thread {}) to release it", state.owner_pid.load(std::memory_order_relaxed),
                            state.owner_tid.load(std::memory_order_relaxed));
}
void describe_event(const void* self, std::string& what, std::string& waiting_for) {
  what = fmt::format("Event '{}' wait", static_cast<const EventState*>(self)->name.text);
  waiting_for = "a set()";
}
void describe_barrier(const void* self, std::string& what, std::string& waiting_for) {
  const BarrierState& state = *static_cast<const BarrierState*>(self);
  what = fmt::format("Barrier '{}' wait ({} parties)", state.name.text, state.parties);
  waiting_for = fmt::format("{} more parties to arrive",
                            state.parties - static_cast<int>(state.arrived.load(std::memory_order_relaxed)));
}

}  // namespace

namespace {

/// Names are per kind, so a Lock and an Event may share one.
std::string object_name(const std::string& kind, const std::string& name) { return kind + ":" + name; }

}  // namespace

void* open_locked_block(const std::string& kind, const std::string& name, std::size_t bytes, const void* initial,
                        LockState** lock) {
  // [LockState][pad to 128][data]
  constexpr std::size_t kDataOffset = 128;
  static_assert(sizeof(LockState) <= kDataOffset);
  void* block = job_arena().find_or_create(object_name(kind, name).c_str(), kDataOffset + bytes, 64, [&](void* where) {
    new (where) LockState(name);
    auto* data = static_cast<std::byte*>(where) + kDataOffset;
    if (initial) {
      std::memcpy(data, initial, bytes);
    } else {
      std::memset(data, 0, bytes);
    }
  });
  *lock = static_cast<LockState*>(block);
  return static_cast<std::byte*>(block) + kDataOffset;
}

}  // namespace detail

Lock Lock::open(const std::string& name) {
  return Lock(
      &detail::job_arena().find_or_construct<detail::LockState>(detail::object_name("lock", name).c_str(), name));
}

bool Lock::try_lock() {
  std::uint32_t expected = 0;
  if (!state_->locked.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return false;
  state_->owner.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
  return true;
}

void Lock::lock(Timeout timeout) {
  detail::BlockingCall blocking(&detail::describe_lock, state_);
  detail::wait_to_take(
      state_->word, [&] { return try_lock(); },
      [&] {
        const std::int32_t owner = state_->owner.load(std::memory_order_relaxed);
        if (!detail::process_alive(owner)) {
          throw PeerFailure(fmt::format("the process holding this lock (pid {}) died without releasing it", owner));
        }
      },
      timeout, "Lock::lock");
}

void Lock::unlock() {
  if (state_->owner.load(std::memory_order_relaxed) != static_cast<std::int32_t>(::getpid()) ||
      state_->locked.load(std::memory_order_relaxed) == 0) {
    throw UsageError("Lock::unlock: this process does not hold the lock");
  }
  state_->owner.store(0, std::memory_order_relaxed);
  state_->locked.store(0, std::memory_order_release);
  detail::notify(state_->word);
}

namespace {

int this_thread_id() noexcept { return static_cast<int>(::syscall(SYS_gettid)); }

}  // namespace

RLock RLock::open(const std::string& name) {
  return RLock(
      &detail::job_arena().find_or_construct<detail::RLockState>(detail::object_name("rlock", name).c_str(), name));
}

int RLock::held_by_me() const {
  return state_->owner_tid.load(std::memory_order_acquire) == this_thread_id() ? state_->count : 0;
}

bool RLock::try_acquire() {
  const std::int32_t me = this_thread_id();
  if (state_->owner_tid.load(std::memory_order_relaxed) == me) {
    ++state_->count;
    return true;
  }
  std::int32_t expected = 0;
  if (!state_->owner_tid.compare_exchange_strong(expected, me, std::memory_order_acquire)) return false;
  state_->owner_pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
  state_->count = 1;
  return true;
}

void RLock::acquire(Timeout timeout) {
  detail::BlockingCall blocking(&detail::describe_rlock, state_);
  detail::wait_to_take(
      state_->word, [&] { return try_acquire(); },
      [&] {
        const std::int32_t owner = state_->owner_pid.load(std::memory_order_relaxed);
        if (!detail::process_alive(owner)) {
          throw PeerFailure(fmt::format("the process holding RLock '{}' (pid {}) died without releasing it",
                                        state_->name.text, owner));
        }
      },
      timeout, "RLock::acquire");
}

void RLock::release() {
  if (state_->owner_tid.load(std::memory_order_relaxed) != this_thread_id() || state_->count <= 0) {
    throw UsageError(fmt::format("RLock '{}' release: this thread does not hold it", state_->name.text));
  }
  if (--state_->count > 0) return;
  state_->owner_pid.store(0, std::memory_order_relaxed);
  state_->owner_tid.store(0, std::memory_order_release);
  detail::notify(state_->word);
}

Event Event::open(const std::string& name) {
  return Event(
      &detail::job_arena().find_or_construct<detail::EventState>(detail::object_name("event", name).c_str(), name));
}

void Event::set() {
  state_->flag.store(1, std::memory_order_release);
  detail::notify(state_->word);
}

void Event::clear() { state_->flag.store(0, std::memory_order_release); }

bool Event::is_set() const { return state_->flag.load(std::memory_order_acquire) != 0; }

void Event::wait(Timeout timeout) {
  detail::BlockingCall blocking(&detail::describe_event, state_);
  detail::wait_until(state_->word, [&] { return is_set(); }, detail::Deadline::after(timeout), "Event::wait");
}

Barrier Barrier::open(const std::string& name, int parties) {
  if (parties < 1) throw UsageError(fmt::format("Barrier::open({}): parties must be >= 1, not {}", name, parties));
  auto& state = detail::job_arena().find_or_construct<detail::BarrierState>(
      detail::object_name("barrier", name).c_str(), parties, name);
  if (state.parties != parties) {
    throw UsageError(fmt::format("Barrier '{}' exists for {} parties, not {}", name, state.parties, parties));
  }
  return Barrier(&state);
}

int Barrier::parties() const { return state_->parties; }

void Barrier::wait(Timeout timeout) {
  detail::BlockingCall blocking(&detail::describe_barrier, state_);
  std::uint32_t generation = state_->generation.load(std::memory_order_acquire);
  if (state_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(state_->parties)) {
    state_->arrived.store(0, std::memory_order_relaxed);
    state_->generation.fetch_add(1, std::memory_order_release);
    detail::notify(state_->word);
    return;
  }
  try {
    detail::wait_until(
        state_->word, [&] { return state_->generation.load(std::memory_order_acquire) != generation; },
        detail::Deadline::after(timeout), "Barrier::wait");
  } catch (...) {
    // Take this arrival back while the round is still open, so that a caller who catches the
    // TimeoutError and waits again does not make the round complete one process early.
    std::uint32_t arrived = state_->arrived.load(std::memory_order_acquire);
    while (state_->generation.load(std::memory_order_acquire) == generation && arrived > 0 &&
           !state_->arrived.compare_exchange_weak(arrived, arrived - 1, std::memory_order_acq_rel)) {
    }
    throw;
  }
}

}  // namespace nodal
