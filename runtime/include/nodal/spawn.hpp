// nodal::spawn: run a function in N child processes and join them.
// The idea and the semantics come from torch.multiprocessing.spawn (torch/multiprocessing/spawn.py).
#pragma once

#include <nodal/process_context.hpp>

#include <chrono>
#include <functional>

namespace nodal {

/// How nodal::spawn and nodal::Process make their children (torch.multiprocessing's start methods).
enum class StartMethod {
  /// Re-execute this program (/proc/self/exe, same argv and environment). The child runs main()
  /// again up to the same start (counted in program order: the nodal::spawn calls and
  /// Process::start calls that passed their argument checks), runs the function there and exits;
  /// earlier starts start nothing in the child (spawn returns at once, an earlier Process reads as
  /// exited with code 0). Safe with threads. Like Python's spawn, the code before the start must
  /// reach it the same way in the child; a child that ends without reaching it fails as
  /// ProcessRaisedError. The child inherits stdin, stdout and stderr, no other descriptor. Not
  /// available inside a child's function (the child could not replay its way there): UsageError.
  spawn,
  /// Fork from a single-threaded fork server started before the program's threads
  /// (nodal::start_forkserver(), or the first forkserver start while still single-threaded).
  /// The function must be a plain function pointer (a function, or a captureless lambda converted
  /// with unary +): the server cannot see closures made after it started (Python's forkserver
  /// needs a picklable function for the same reason). Starts may overlap (several Processes, or
  /// contexts not yet joined, at once).
  forkserver,
  /// fork() this process directly. Refused with UsageError when the caller runs threads.
  fork,
};

struct SpawnOptions {
  StartMethod start_method = StartMethod::spawn;
  /// When a child fails, the others get SIGTERM, then SIGKILL after this long.
  std::chrono::milliseconds grace{5000};
  /// torch's join argument: true waits for the children before returning; false returns their
  /// ProcessContext at once, for the caller to join.
  bool join = true;
};

/// Runs fn(rank) for rank = 0..nprocs-1, each in its own child process; with options.join (the
/// default) waits for all, as torch.multiprocessing.spawn does, and returns the joined context
/// (which may be ignored). spawn(fn, n, {.join = false}) returns the running children's
/// ProcessContext instead; spawn with join is that context joined to the end.
///
/// Join semantics are torch's (ProcessContext::join): the first child to fail decides the error,
/// the other children are terminated (SIGTERM, grace, SIGKILL), and join throws
/// - ProcessRaisedError (the child's rank, exception type, message, stack) when fn threw, or
/// - ProcessExitedError (the child's rank and exit code or signal) when a child exited non-zero
///   or died by a signal.
/// The child's report has its stack as it was where the child caught the exception. A child
/// exits with _exit after fn, flushing stdio first: the caller's atexit handlers and static
/// destructors run in the parent only. Children die with the parent (PR_SET_PDEATHSIG), and
/// every child is reaped before spawn returns or throws (with join), or by the context.
/// Throws UsageError for nprocs < 1, an empty fn, fork with threads running, forkserver with a
/// closure or with no server and threads running; std::system_error when a child cannot be
/// started (fork, pidfd_open), nodal::Error when the fork server died.
ProcessContext spawn(const std::function<void(int rank)>& fn, int nprocs, const SpawnOptions& options = {});

/// Starts the process-wide fork server used by StartMethod::forkserver. Call it at the top of
/// main(), before any thread starts. Idempotent. Throws UsageError when threads already run.
void start_forkserver();

}  // namespace nodal
