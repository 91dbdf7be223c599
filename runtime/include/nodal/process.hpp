// nodal::Process: one function run in one child process, started and joined by hand.
// The idea and the semantics come from Python's multiprocessing.Process, which
// torch.multiprocessing re-exports; errors come back as nodal::spawn reports them.
#pragma once

#include <nodal/spawn.hpp>

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace nodal {

struct ProcessOptions {
  /// How the child is made (see StartMethod). forkserver needs `target` to hold a plain function
  /// pointer, void (*)().
  StartMethod start_method = StartMethod::spawn;
  /// Empty: "Process-N", N counting the Process objects this program made, from 1 (Python's).
  std::string name{};
  /// Python's daemon flag. At the parent's normal exit (return from main, std::exit) a daemonic
  /// child still running is terminated (SIGTERM, then SIGKILL after `grace`), and a non-daemonic
  /// one is joined: the exit waits for it. Either way, a child dies (SIGKILL) when its parent dies
  /// abnormally (PR_SET_PDEATHSIG), so nothing is left running behind a crashed parent.
  bool daemon = false;
  /// For a daemonic child at exit: how long after SIGTERM it gets SIGKILL.
  std::chrono::milliseconds grace{5000};
};

/// One child process running `target()`, like Python's multiprocessing.Process:
///
///   nodal::Process worker(&serve_requests, {.start_method = nodal::StartMethod::forkserver});
///   worker.start();
///   ...
///   worker.terminate();
///   worker.join();  // true; worker.exitcode() == -SIGTERM
///
/// Unlike Python's, join() reports a failed child: an exception that escaped target() comes back
/// as ProcessRaisedError (type, message, the child's stack), a bad exit as ProcessExitedError.
/// A child is reaped as soon as its Process sees it exit (join, is_alive, exitcode, destructor);
/// one whose Process was destroyed while it ran keeps running, daemon rules applying at exit, and
/// is reaped at the next start or at exit: no zombies. A failure nobody joined goes to stderr
/// ("nodal: not joined: ...") rather than nowhere. Like Python's, a Process object is for one thread at a time. Children started by fork or
/// spawn die (PR_SET_PDEATHSIG) when the thread that started them exits: start them from a
/// thread that outlives them (main), or use StartMethod::forkserver.
class Process {
 public:
  /// Throws UsageError for an empty target.
  explicit Process(std::function<void()> target, ProcessOptions options = {});
  Process(Process&& other) noexcept;
  /// Throws nothing; a child this object had keeps running, as for the destructor.
  Process& operator=(Process&& other) noexcept;
  ~Process();

  /// Starts the child. Throws UsageError when called twice, for forkserver with a closure, for
  /// spawn inside a child's function, for fork with threads running; std::system_error when the
  /// child cannot be started, nodal::Error when the fork server died.
  void start();

  /// Waits for the child to exit, at most `timeout` (none: for as long as it runs; zero: only
  /// looks). Returns false when the timeout passed with the child running, true once it has exited
  /// (and was reaped), unless the exit was a failure; then every call throws:
  /// - ProcessRaisedError (name(), pid, exception type, message, stack) when target() threw;
  /// - ProcessExitedError (name(), pid, exit code or signal) when the child exited non-zero or
  ///   died by a signal, unless this Process ended it with terminate() or kill().
  /// Throws UsageError before start(); nodal::Error when the fork server died, or when the child
  /// was reaped behind nodal's back (SIGCHLD ignored, waitpid(-1) on another thread).
  bool join(std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  /// Whether the child runs: started and not exited (false before start).
  bool is_alive();

  /// Python's exitcode: nullopt before start() and while the child runs; then its exit code
  /// (0 clean, 1 when target() threw) or -N when signal N ended it.
  std::optional<int> exitcode();

  /// The child's pid; nullopt before start() (and in a re-executed child for a Process its parent
  /// started, which runs nothing there).
  std::optional<pid_t> pid() const;

  /// Sends SIGTERM / SIGKILL to the child (nothing when it has exited already); its exit is then
  /// not an error for join(). Throws UsageError before start().
  void terminate();
  void kill();
  /// Waits for the child until `kill_at`, then kills it (SIGKILL) and waits again: how a caller
  /// that has told a child to stop (closed its input, terminate()) ends it for sure. A failed
  /// exit is not reported (the caller has what it needed from the child, or nothing); throws
  /// nothing.
  void join_or_kill(std::chrono::steady_clock::time_point kill_at) noexcept;

  const std::string& name() const;
  bool daemon() const;
  /// Throws UsageError once started (Python asserts the same).
  void set_daemon(bool daemon);

  struct State;  ///< internal

 private:
  /// This object's claim on its child ends (destructor, move assignment): the child is reaped if
  /// it has exited, else left to the registry.
  void release() noexcept;
  State& state(const char* call) const;

  std::shared_ptr<State> state_;  ///< shared with the registry that joins children at exit
};

}  // namespace nodal
