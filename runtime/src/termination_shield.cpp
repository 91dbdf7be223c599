#include <nodal/detail/termination_shield.hpp>

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace nodal::detail {
namespace {

/// Threads inside a section now. Sequentially consistent with g_pending, as in Dekker's
/// algorithm: a thread entering a section and the handler cannot both miss each other.
std::atomic<int> g_depth{0};
/// Set by the handler: SIGTERM arrived while a section was open.
std::atomic<int> g_pending{0};
/// Sections this thread is in (never read by the handler).
thread_local int t_depth = 0;
/// Set once, before any section of the process, by defer_termination_in_shielded_sections.
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free, "used in a signal handler");

/// Ends the process by SIGTERM's default action (async-signal-safe).
[[noreturn]] void terminate_now() noexcept {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  ::sigemptyset(&default_action.sa_mask);
  ::sigaction(SIGTERM, &default_action, nullptr);
  sigset_t term;
  ::sigemptyset(&term);
  ::sigaddset(&term, SIGTERM);
  ::pthread_sigmask(SIG_UNBLOCK, &term, nullptr);
  ::raise(SIGTERM);
  ::_exit(128 + SIGTERM);  // not reached
}

void leave() noexcept {
  if (g_depth.fetch_sub(1) == 1 && g_pending.load() != 0) terminate_now();
}

void on_sigterm(int) {
  g_pending.store(1);
  if (g_depth.load() == 0) terminate_now();
  // Else the last thread leaving a section ends the process.
}

}  // namespace

TerminationShield::TerminationShield() noexcept : active_(g_installed.load(std::memory_order_relaxed)) {
  if (!active_) return;
  g_depth.fetch_add(1);
  ++t_depth;
  // SIGTERM came: the process is ending. A thread entering its outermost section backs out; if
  // no other thread is inside one, it ends the process here, else it waits for the last one to
  // leave. A thread already inside a section goes on: its outer section must finish (and its end
  // ends the process), or it would wait for itself.
  if (t_depth == 1 && g_pending.load() != 0) {
    --t_depth;
    leave();
    for (;;) ::pause();
  }
}

TerminationShield::~TerminationShield() {
  if (!active_) return;
  --t_depth;
  leave();
}

void defer_termination_in_shielded_sections() noexcept {
  g_installed.store(true);  // before the handler: a SIGTERM it handles finds sections counted
  struct sigaction action {};
  action.sa_handler = &on_sigterm;
  ::sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &action, nullptr);
}

}  // namespace nodal::detail
