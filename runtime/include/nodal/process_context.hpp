// nodal::ProcessContext: the children of one nodal::spawn call, joined as a group.
// The idea and the semantics come from torch.multiprocessing's ProcessContext
// (torch/multiprocessing/spawn.py), which spawn(..., join=False) returns.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

namespace nodal {

class ProcessContext;

namespace detail {
class ChildGroup;
/// Made by nodal::spawn only.
ProcessContext make_process_context(std::unique_ptr<ChildGroup> children, std::chrono::milliseconds grace);
}  // namespace detail

/// The running children of nodal::spawn(fn, nprocs, {.join = false}), rank r being fn(r).
/// Move-only. Like torch's ProcessContext: join until it returns true,
///
///   nodal::ProcessContext context = nodal::spawn(fn, 4, {.join = false});
///   while (!context.join(std::chrono::seconds(1))) report_progress();
///
/// Not thread-safe: one thread at a time calls a context's members. Children started by fork or
/// spawn die (PR_SET_PDEATHSIG) when the thread that started them exits: keep that thread alive
/// while they run, or use StartMethod::forkserver, whose children are the fork server's.
class ProcessContext {
 public:
  /// A context with no children: join() returns true. nodal::spawn returns one in a child
  /// re-executed by StartMethod::spawn for the calls its parent made before the child's own.
  ProcessContext() noexcept;
  ProcessContext(ProcessContext&& other) noexcept;
  /// Kills (SIGKILL) and reaps the children this context still has, then takes other's.
  ProcessContext& operator=(ProcessContext&& other) noexcept;
  /// Kills (SIGKILL) and reaps the children still running: a context dropped before it joined
  /// leaves neither orphans nor zombies.
  ~ProcessContext();

  /// Waits for the children, at most `timeout` (none: until they have all exited; zero: only
  /// looks). Returns true once every child has exited with code 0, false when the timeout passed
  /// with some still running. On the first failure it sends SIGTERM to the others, SIGKILL after
  /// the spawn's grace, reaps them all (ignoring the timeout; the grace bounds the wait) and
  /// throws, as torch's join raises:
  /// - ProcessRaisedError (the child's rank, pid, exception type, message and stack) when fn threw,
  /// - ProcessExitedError (its rank, pid, and exit code or signal) for a non-zero exit or a signal.
  /// Once it has thrown, every later call throws the same error again. Also throws
  /// std::system_error, and nodal::Error when the fork server died or a child was reaped behind
  /// its back (SIGCHLD ignored, waitpid(-1) on another thread).
  bool join(std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  /// The children's pids, by rank (empty for a context without children). They stay valid
  /// names only while the children have not been reaped, that is until join() has seen them exit.
  std::vector<pid_t> pids() const;

 private:
  struct State;
  friend ProcessContext detail::make_process_context(std::unique_ptr<detail::ChildGroup> children,
                                                     std::chrono::milliseconds grace);
  explicit ProcessContext(std::unique_ptr<State> state) noexcept;
  std::unique_ptr<State> state_;
};

}  // namespace nodal
