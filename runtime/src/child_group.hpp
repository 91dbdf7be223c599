// The children of one start (a nodal::spawn call, a nodal::Process::start): started by fork, by
// re-executing the program (StartMethod::spawn) or by the fork server, then watched: their exits
// and the exception reports they send before exiting. nodal::ProcessContext (torch's first-failure
// join) and nodal::Process (Python's one child) are two policies over it. Internal.
#pragma once

#include <poll.h>

#include <nodal/spawn.hpp>
#include <nodal/detail/control.hpp>
#include <nodal/detail/forkserver.hpp>

#include <sys/types.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nodal::detail {

// ---- In a child ----------------------------------------------------------------------------

/// Runs fn(rank) in a child, then exits: 0 when fn returns, 1 after reporting on control_fd when
/// it throws (the report: "<type>: <what>\n<stack>", the stack taken where the exception was
/// caught). Before exiting it joins the child's own nodal::Process children as a normal exit
/// would (Python's Process._bootstrap does the same). Never returns: the frames above belong to
/// the parent's copy of the program, and _exit skips the atexit handlers and static destructors
/// that are the parent's to run.
[[noreturn]] void run_child(const std::function<void(int rank)>& fn, int rank, int control_fd) noexcept;

/// True in a child while it runs its function (a start there is the child's own).
bool in_child() noexcept;

/// Counts a start (a spawn call or Process::start that passed its argument checks) in program
/// order, which a child re-executed by StartMethod::spawn replays to find the start that made it.
/// Returns the start's number, from 1. In such a child, a start made before the child's own
/// returns 0 (the parent made it: it starts nothing here), and the child's own start runs
/// fn(rank) and exits (run_child) instead of returning.
int count_start(const std::function<void(int rank)>& fn, int nprocs);

/// Python multiprocessing's exit handler: terminates the daemonic nodal::Process children still
/// running, then joins every one. Runs at the normal exit of a program that started a Process,
/// and at the end of a child's run_child. Defined with nodal::Process.
void join_children_at_exit() noexcept;

// ---- In the parent -------------------------------------------------------------------------

/// One thing learnt about a child: it raised (fn threw: its report) or it exited.
struct ChildEvent {
  int rank = -1;
  pid_t pid = -1;
  std::optional<std::string> raised;  ///< fn threw: the child's report. Otherwise it exited:
  int wait_status = 0;
};

/// The error an event means, as torch.multiprocessing reports it: ProcessRaisedError for a
/// report, ProcessExitedError for an exit with a non-zero code or by a signal; null for a clean
/// exit. `name` names the child in the message (empty: "rank <rank>").
std::exception_ptr failure_of(const ChildEvent& event, const std::string& name = {});

/// What the children of a start run.
struct ChildTarget {
  /// fork and spawn: fn(rank).
  std::function<void(int rank)> fn;
  /// forkserver: the plain function the server's child passes to entry (the server is a fork of
  /// the program made earlier: it knows functions, not closures made since).
  void (*plain)(int rank) = nullptr;
  ForkServerEntry entry = nullptr;
};

/// The children of one start, by rank. Signals go through pidfds: a pidfd names one process for
/// good, so a signal never reaches an unrelated process that reused a child's pid.
class ChildGroup {
 public:
  /// Starts nprocs children running `target` (the caller checked it fits the method); `call` is
  /// the start's number (count_start), `caller` names the call in errors. Returns once every
  /// child's pid is known. Throws UsageError (fork with threads or CUDA, a fork server that cannot
  /// start), std::system_error (fork, pidfd_open, ...), nodal::Error (the fork server died). When
  /// it throws, the children it started are killed and reaped.
  ChildGroup(StartMethod method, const ChildTarget& target, int nprocs, int call, std::string_view caller);
  /// Kills (SIGKILL) the children still running and reaps them: no orphans, no zombies. Does
  /// nothing to them in a forked copy of the parent, whose children they are not.
  ~ChildGroup();
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;

  int size() const noexcept;
  /// Children not yet seen exited by wait().
  int running() const noexcept;
  /// The children's pids, by rank.
  std::vector<pid_t> pids() const;

  /// Waits until there is news or `deadline` passes (nullopt: no deadline; a past deadline: does
  /// not block), then appends what is known: exception reports first, then exits (a child reports
  /// before it exits, so a report is never seen after its exit). An exit reaps the child. Throws
  /// std::system_error, nodal::Error when a child was reaped behind our back or the fork server
  /// died.
  void wait(std::optional<std::chrono::steady_clock::time_point> deadline, std::vector<ChildEvent>& events);

  /// Sends sig to every child still running.
  void signal_all(int sig) noexcept;

 private:
  class Children;
  void start_by_fork(const std::function<void(int)>& fn, OwnedFd ranks_end, std::string_view caller);
  void start_by_exec(int call, OwnedFd ranks_end);
  void start_by_forkserver(const ChildTarget& target, OwnedFd ranks_end, std::string_view caller);
  void collect_exits(std::vector<ChildEvent>& exits);
  /// poll() for wait(); a blocking one is shown in the job's wait table while it lasts.
  void poll_recorded(std::vector<pollfd>& fds, int timeout_ms);

  OwnedFd control_;                      ///< the parent's end of the control socket: exception reports
  std::vector<ChildEvent> early_exits_;  ///< exits the fork server reported while the start waited for pids
  std::optional<ForkServerJob> job_;
  std::unique_ptr<Children> children_;  ///< declared last: destroyed first, killing before the job closes
};

}  // namespace nodal::detail
