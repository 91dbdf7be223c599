// nodal::Process: Python's multiprocessing.Process over one child of a ChildGroup, and the
// registry of started Processes that the exit handler terminates (daemons) or joins (the others),
// as Python's multiprocessing.util._exit_function does.
#include <nodal/process.hpp>
#include <nodal/errors.hpp>

#include "child_group.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace nodal {

using Clock = std::chrono::steady_clock;

struct Process::State {
  std::function<void()> target;
  ProcessOptions options;
  bool started = false;
  /// The child; null before start(), and after a start that a re-executed child replayed (its
  /// parent started that Process: nothing runs here, and it reads as exited with code 0).
  std::unique_ptr<detail::ChildGroup> child;
  std::optional<std::string> raised;  ///< target() threw: the child's report
  std::optional<int> wait_status;     ///< the child exited (and was reaped)
  bool ended_by_parent = false;       ///< terminate() or kill() was sent: the exit is no error

  pid_t pid() const { return child ? child->pids().front() : -1; }

  /// Takes the child's news until it has exited or `deadline` passes (nullopt: no deadline).
  /// Returns whether it has exited.
  bool update(std::optional<Clock::time_point> deadline) {
    if (!child) return true;
    std::vector<detail::ChildEvent> events;
    while (child->running() > 0) {
      events.clear();
      child->wait(deadline, events);
      for (detail::ChildEvent& event : events) {
        if (event.raised) {
          raised = std::move(event.raised);
        } else {
          wait_status = event.wait_status;
        }
      }
      if (deadline && Clock::now() >= *deadline) break;
    }
    return child->running() == 0;
  }

  /// The error the exit means, null for none (see Process::join).
  std::exception_ptr failure() const {
    if (raised) return detail::failure_of({0, pid(), raised, 0}, options.name);
    if (!wait_status || ended_by_parent) return nullptr;
    return detail::failure_of({0, pid(), std::nullopt, *wait_status}, options.name);
  }
};

namespace {

/// Numbers Processes for their default names.
std::atomic<int> g_processes_made{0};

/// Python's multiprocessing._children: the started Processes not yet seen exited, whether or not
/// their Process objects still exist. A forked child starts with an empty one (the parent's
/// children are not its own): see registry().
struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<Process::State>> states;
};

/// pthread_atfork child handler: a fork's copy of the registry names its parent's children, and
/// its mutex may be held by a thread that does not exist in the fork. Re-created in place without
/// destroying the copy (that would kill the parent's children through their pidfds) and without
/// allocating (a fork of a threaded program runs this too).
void forget_inherited_registry() noexcept;

Registry& registry() {
  // Leaked on purpose: the exit handler may run after static destructors.
  static Registry* const instance = [] {
    auto* made = new Registry;
    ::pthread_atfork(nullptr, nullptr, &forget_inherited_registry);
    return made;
  }();
  return *instance;
}

void forget_inherited_registry() noexcept { std::construct_at(&registry()); }

void join_at_exit() { detail::join_children_at_exit(); }

void enroll(const std::shared_ptr<Process::State>& state) {
  static std::once_flag exit_handler;
  std::call_once(exit_handler, [] { std::atexit(&join_at_exit); });
  Registry& children = registry();
  std::lock_guard lock(children.mutex);
  children.states.push_back(state);
}

/// A failed child that nobody will join: its error goes to stderr rather than nowhere (Python's
/// child prints its own traceback).
void report_unjoined(const Process::State& state) noexcept {
  try {
    if (std::exception_ptr failure = state.failure()) std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nodal: not joined: %s\n", e.what());
    std::fflush(stderr);
  } catch (...) {
  }
}

void forget(const Process::State* state) {
  Registry& children = registry();
  std::lock_guard lock(children.mutex);
  std::erase_if(children.states, [state](const auto& entry) { return entry.get() == state; });
}

/// Reaps the children whose Process objects are gone and that have exited (Python's _cleanup at
/// each start), so that a program starting Processes in a loop without joining keeps no zombies.
void reap_abandoned() {
  Registry& children = registry();
  std::lock_guard lock(children.mutex);
  std::erase_if(children.states, [](const std::shared_ptr<Process::State>& state) {
    if (state.use_count() > 1) return false;  // its Process object will see to it
    try {
      if (!state->update(Clock::now())) return false;
    } catch (...) {
      return true;  // reaped behind our back: nothing left to wait for
    }
    report_unjoined(*state);
    return true;
  });
}

/// ForkServerEntry: the target is a plain void() function, passed as the entry's void(int).
[[noreturn]] void run_forkserver_process(void (*fn)(int), int rank, int control_fd) {
  const auto target = reinterpret_cast<void (*)()>(fn);  // NOLINT: back to the type it was made from
  detail::run_child([target](int) { target(); }, rank, control_fd);
}

}  // namespace

void detail::join_children_at_exit() noexcept {
  std::vector<std::shared_ptr<Process::State>> states;
  {
    Registry& children = registry();
    std::lock_guard lock(children.mutex);
    states.swap(children.states);
  }
  // Daemons first, all at once, so that their grace periods run side by side.
  std::vector<std::optional<Clock::time_point>> kill_at(states.size());
  for (std::size_t i = 0; i < states.size(); ++i) {
    Process::State& state = *states[i];
    if (!state.options.daemon || !state.child || state.child->running() == 0) continue;
    state.ended_by_parent = true;
    state.child->signal_all(SIGTERM);
    kill_at[i] = Clock::now() + std::max(state.options.grace, std::chrono::milliseconds(0));
  }
  for (std::size_t i = 0; i < states.size(); ++i) {
    Process::State& state = *states[i];
    try {
      if (kill_at[i] && !state.update(kill_at[i])) state.child->signal_all(SIGKILL);
      state.update(std::nullopt);
    } catch (...) {
      continue;  // reaped behind our back: nothing left to wait for
    }
    report_unjoined(state);  // nobody has seen it exit, and nobody will
  }
}

Process::Process(std::function<void()> target, ProcessOptions options) : state_(std::make_shared<State>()) {
  const int number = ++g_processes_made;
  if (!target) throw UsageError("nodal::Process: target is empty");
  state_->target = std::move(target);
  state_->options = std::move(options);
  if (state_->options.name.empty()) state_->options.name = fmt::format("Process-{}", number);
}

Process::Process(Process&& other) noexcept = default;

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
  }
  return *this;
}

Process::~Process() { release(); }

void Process::release() noexcept {
  if (!state_ || !state_->child || state_->child->running() == 0) return;
  try {
    if (!state_->update(Clock::now())) return;  // the registry keeps it
  } catch (...) {
  }
  forget(state_.get());
  report_unjoined(*state_);
}

Process::State& Process::state(const char* call) const {
  if (!state_) throw UsageError(fmt::format("nodal::Process::{} on a moved-from Process", call));
  return *state_;
}

void Process::start() {
  State& s = state("start");
  const ProcessOptions& options = s.options;
  if (s.started) {
    throw UsageError(fmt::format("nodal::Process::start: {} was started already; a Process starts once", options.name));
  }
  void (*const* plain)() = s.target.target<void (*)()>();
  if (options.start_method == StartMethod::forkserver && plain == nullptr) {
    throw UsageError(fmt::format(
        "nodal::Process::start(StartMethod::forkserver) for {}: the target must hold a plain function pointer "
        "(void (*)(): a function, or a captureless lambda converted with unary +). The fork server is a copy of "
        "the program made before this closure existed, so it cannot run it (Python's forkserver needs a picklable "
        "target for the same reason); use StartMethod::spawn or StartMethod::fork for closures",
        options.name));
  }
  if (options.start_method == StartMethod::spawn && detail::in_child()) {
    throw UsageError(fmt::format(
        "nodal::Process::start(StartMethod::spawn) for {} inside a child's function: a re-executed child replays "
        "main(), which never reaches a start made inside another child. Use StartMethod::fork or "
        "StartMethod::forkserver there",
        options.name));
  }

  const std::function<void(int)> fn = [&s](int) { s.target(); };
  const int call = detail::count_start(fn, 1);
  if (call == 0) {  // a re-executed child replaying a start its parent made
    s.started = true;
    return;
  }

  reap_abandoned();
  const detail::ChildTarget target{fn, plain != nullptr ? reinterpret_cast<void (*)(int)>(*plain) : nullptr,
                                   &run_forkserver_process};
  s.child = std::make_unique<detail::ChildGroup>(options.start_method, target, 1, call, "nodal::Process::start");
  s.started = true;  // not before: a start that threw left nothing that could pass for an exit
  enroll(state_);
}

bool Process::join(std::optional<std::chrono::milliseconds> timeout) {
  State& s = state("join");
  if (!s.started) throw UsageError(fmt::format("nodal::Process::join: {} was not started", s.options.name));
  std::optional<Clock::time_point> deadline;
  if (timeout) deadline = Clock::now() + std::max(*timeout, std::chrono::milliseconds(0));
  if (!s.update(deadline)) return false;
  forget(&s);
  if (std::exception_ptr failure = s.failure()) std::rethrow_exception(failure);
  return true;
}

bool Process::is_alive() {
  State& s = state("is_alive");
  if (!s.started || !s.child) return false;
  if (!s.update(Clock::now())) return true;
  forget(&s);
  return false;
}

std::optional<int> Process::exitcode() {
  State& s = state("exitcode");
  if (!s.started) return std::nullopt;
  if (!s.child) return 0;
  if (!s.update(Clock::now())) return std::nullopt;
  forget(&s);
  const int status = *s.wait_status;
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

std::optional<pid_t> Process::pid() const {
  const State& s = state("pid");
  if (!s.child) return std::nullopt;
  return s.pid();
}

namespace {

void end_child(Process::State& s, int sig, const char* call) {
  if (!s.started) throw UsageError(fmt::format("nodal::Process::{}: {} was not started", call, s.options.name));
  if (!s.child || s.update(Clock::now())) return;  // exited already: how it ended stands
  s.ended_by_parent = true;
  s.child->signal_all(sig);
}

}  // namespace

void Process::join_or_kill(std::chrono::steady_clock::time_point kill_at) noexcept {
  try {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(kill_at - std::chrono::steady_clock::now());
    if (join(std::max(left, std::chrono::milliseconds(0)))) return;
    kill();
    join();
  } catch (...) {
    // A failed child, a server that died, or no child: nothing left to end.
  }
}

void Process::terminate() { end_child(state("terminate"), SIGTERM, "terminate"); }

void Process::kill() { end_child(state("kill"), SIGKILL, "kill"); }

const std::string& Process::name() const { return state("name").options.name; }

bool Process::daemon() const { return state("daemon").options.daemon; }

void Process::set_daemon(bool daemon) {
  State& s = state("set_daemon");
  if (s.started) throw UsageError(fmt::format("nodal::Process::set_daemon: {} was started already", s.options.name));
  s.options.daemon = daemon;
}

}  // namespace nodal
