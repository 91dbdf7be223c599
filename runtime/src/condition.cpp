#include <nodal/arena.hpp>
#include <nodal/condition.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/wait.hpp>
#include <nodal/detail/wait_record.hpp>

#include <limits>

#include <fmt/format.h>

namespace nodal {
namespace detail {

/// Tickets, as Python's threading.Condition keeps a queue of waiters: a waiter takes the next
/// ticket (under the lock) and waits until notify has moved `wake_below` past it, so notify(n)
/// wakes exactly the n oldest waiters, never one that came after it. A waiter that times out
/// cancels its ticket (under the lock again) so that a later notify skips it rather than being
/// spent on nobody.
inline constexpr int kCancelledTickets = 64;

struct ConditionState {
  explicit ConditionState(std::string_view condition_name) : name(condition_name) {}
  WaitWord word;
  std::atomic<std::uint64_t> next_ticket{0};
  std::atomic<std::uint64_t> wake_below{0};
  // Tickets >= wake_below whose waiters timed out; only touched under the lock.
  std::uint64_t cancelled[kCancelledTickets] = {};
  int cancelled_count = 0;
  const ObjectName name;
};

namespace {

void describe_condition(const void* self, std::string& what, std::string& waiting_for) {
  what = fmt::format("Condition '{}' wait", static_cast<const ConditionState*>(self)->name.text);
  waiting_for = "a notify";
}

/// Removes `ticket` from the cancelled ones; false when it is not there.
bool take_cancelled(ConditionState& state, std::uint64_t ticket) {
  for (int i = 0; i < state.cancelled_count; ++i) {
    if (state.cancelled[i] != ticket) continue;
    state.cancelled[i] = state.cancelled[--state.cancelled_count];
    return true;
  }
  return false;
}

}  // namespace
}  // namespace detail

Condition Condition::open(const std::string& name) {
  auto& state = detail::job_arena().find_or_construct<detail::ConditionState>(("condition:" + name).c_str(), name);
  return Condition(&state, RLock::open("condition:" + name));
}

bool Condition::wait(Timeout timeout) {
  const int depth = lock_.held_by_me();
  if (depth == 0) throw UsageError(fmt::format("Condition '{}' wait: this thread does not hold its lock", state_->name.text));
  detail::BlockingCall blocking(&detail::describe_condition, state_);
  // The ticket is taken under the lock: a notify made once the lock is free counts this waiter.
  const std::uint64_t ticket = state_->next_ticket.fetch_add(1, std::memory_order_acq_rel);
  for (int i = 0; i < depth; ++i) lock_.release();
  auto woken = [&] { return state_->wake_below.load(std::memory_order_acquire) > ticket; };
  bool timed_out = false;
  try {
    detail::wait_until(state_->word, woken, detail::Deadline::after(timeout), "Condition::wait");
  } catch (const TimeoutError&) {
    timed_out = true;
  }  // PeerFailure goes on up: the job failed, and the lock is not taken back
  lock_.acquire();
  for (int i = 1; i < depth; ++i) lock_.acquire();
  if (!timed_out || woken()) return true;  // a notify between the deadline and the lock counts
  if (state_->cancelled_count < detail::kCancelledTickets) {
    state_->cancelled[state_->cancelled_count++] = ticket;
  }  // else a later notify may be spent on this ticket: 64 timed-out waiters at once are not expected
  return false;
}

bool Condition::wait_for(const std::function<bool()>& predicate, Timeout timeout) {
  const auto deadline = timeout ? std::optional(detail::Clock::now() + *timeout) : std::nullopt;
  bool result = predicate();
  while (!result) {
    Timeout left;
    if (deadline) {
      left = std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - detail::Clock::now());
      if (left->count() <= 0) break;
    }
    wait(left);
    result = predicate();
  }
  return result;
}

void Condition::notify(int n) {
  if (lock_.held_by_me() == 0) {
    throw UsageError(fmt::format("Condition '{}' notify: this thread does not hold its lock", state_->name.text));
  }
  // Under the lock: no ticket is taken or cancelled meanwhile.
  const std::uint64_t end = state_->next_ticket.load(std::memory_order_acquire);
  std::uint64_t wake_below = state_->wake_below.load(std::memory_order_relaxed);
  int woken = 0;
  while (woken < n && wake_below < end) {
    if (!detail::take_cancelled(*state_, wake_below)) ++woken;
    ++wake_below;
  }
  state_->wake_below.store(wake_below, std::memory_order_release);
  if (woken > 0) detail::notify(state_->word);
}

void Condition::notify_all() { notify(std::numeric_limits<int>::max()); }

}  // namespace nodal
