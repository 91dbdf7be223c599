#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/semaphore.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/wait.hpp>
#include <nodal/detail/wait_record.hpp>

#include <unistd.h>

#include <fmt/format.h>

namespace nodal {
namespace detail {

/// Processes holding units they acquired and have not released: a dead one among them is how a
/// waiter knows the units will never come back. A release by a process that holds none (the
/// producer/consumer pattern) is an anonymous one and changes no entry.
inline constexpr int kSemaphoreHolders = 64;

struct SemaphoreState {
  SemaphoreState(int initial, bool is_bounded, std::string_view semaphore_name)
      : value(initial), bound(initial), bounded(is_bounded), name(semaphore_name) {}
  WaitWord word;
  std::atomic<std::int32_t> value;
  const std::int32_t bound;  ///< the initial value: the most a bounded semaphore may hold
  const bool bounded;
  const ObjectName name;
  struct Holder {
    std::atomic<std::int32_t> pid{0};
    std::atomic<std::int32_t> units{0};
  } holders[kSemaphoreHolders];
};

namespace {

void describe_semaphore(const void* self, std::string& what, std::string& waiting_for) {
  const SemaphoreState& state = *static_cast<const SemaphoreState*>(self);
  what = fmt::format("{} '{}' acquire", state.bounded ? "BoundedSemaphore" : "Semaphore", state.name.text);
  std::string holders;
  for (const SemaphoreState::Holder& h : state.holders) {
    const int units = h.units.load(std::memory_order_relaxed);
    if (units > 0) holders += fmt::format("{}pid {} ({})", holders.empty() ? "" : ", ", h.pid.load(), units);
  }
  waiting_for = holders.empty() ? std::string("a release") : fmt::format("a release; held by {}", holders);
}

/// This process's holder entry, claimed when `claim` (nullptr when none and not claiming, or the
/// table is full: then the units are simply not tracked).
SemaphoreState::Holder* holder_of_this_process(SemaphoreState& state, bool claim) {
  const std::int32_t me = static_cast<std::int32_t>(::getpid());
  for (SemaphoreState::Holder& h : state.holders) {
    if (h.pid.load(std::memory_order_acquire) == me) return &h;
  }
  if (!claim) return nullptr;
  for (SemaphoreState::Holder& h : state.holders) {
    std::int32_t none = 0;
    if (h.pid.compare_exchange_strong(none, me, std::memory_order_acq_rel)) return &h;
  }
  return nullptr;
}

/// Throws PeerFailure when a process died holding units.
void check_holders(const SemaphoreState& state) {
  for (const SemaphoreState::Holder& h : state.holders) {
    const int pid = h.pid.load(std::memory_order_acquire);
    if (pid > 0 && h.units.load(std::memory_order_relaxed) > 0 && !process_alive(pid)) {
      throw PeerFailure(fmt::format("the process holding {} unit(s) of semaphore '{}' (pid {}) died without releasing "
                                    "them",
                                    h.units.load(), state.name.text, pid));
    }
  }
}

SemaphoreState& open_state(const std::string& name, int value, bool bounded) {
  if (value < 0) throw UsageError(fmt::format("Semaphore::open({}): value {} is negative", name, value));
  SemaphoreState& state = job_arena().find_or_construct<SemaphoreState>(("semaphore:" + name).c_str(), value, bounded, name);
  if (state.bounded != bounded || (bounded && state.bound != value)) {
    throw UsageError(fmt::format("semaphore '{}' exists as {} {}, not as {} {}", name,
                                 state.bounded ? "a BoundedSemaphore of" : "a Semaphore, initially", state.bound,
                                 bounded ? "a BoundedSemaphore of" : "a Semaphore, initially", value));
  }
  return state;
}

}  // namespace
}  // namespace detail

Semaphore Semaphore::open(const std::string& name, int value) { return Semaphore(&detail::open_state(name, value, false)); }

BoundedSemaphore BoundedSemaphore::open(const std::string& name, int value) {
  return BoundedSemaphore(&detail::open_state(name, value, true));
}

bool Semaphore::try_acquire() {
  std::int32_t value = state_->value.load(std::memory_order_relaxed);
  while (value > 0) {
    if (state_->value.compare_exchange_weak(value, value - 1, std::memory_order_acquire)) {
      if (auto* h = detail::holder_of_this_process(*state_, true)) h->units.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

void Semaphore::acquire(Timeout timeout) {
  detail::BlockingCall blocking(&detail::describe_semaphore, state_);
  detail::wait_to_take(
      state_->word, [&] { return try_acquire(); }, [&] { detail::check_holders(*state_); }, timeout,
      "Semaphore::acquire");
}

void Semaphore::release(int n) {
  if (n < 1) throw UsageError(fmt::format("semaphore '{}' release({}): n must be at least 1", state_->name.text, n));
  std::int32_t value = state_->value.load(std::memory_order_relaxed);
  do {
    if (state_->bounded && value + n > state_->bound) {
      throw UsageError(fmt::format("BoundedSemaphore '{}' released too many times: {} + {} would exceed its bound {}",
                                   state_->name.text, value, n, state_->bound));
    }
  } while (!state_->value.compare_exchange_weak(value, value + n, std::memory_order_release));
  if (auto* h = detail::holder_of_this_process(*state_, false)) {
    // Units this process held go back first; the rest of n is an anonymous release.
    std::int32_t units = h->units.load(std::memory_order_relaxed);
    while (units > 0 && !h->units.compare_exchange_weak(units, units - std::min(units, n), std::memory_order_relaxed)) {
    }
  }
  detail::notify(state_->word);
}

int Semaphore::value() const { return state_->value.load(std::memory_order_acquire); }

}  // namespace nodal
