// nodal::spawn: run a function in N child processes and join them.
// The idea and the semantics come from torch.multiprocessing.spawn (torch/multiprocessing/spawn.py).
#pragma once

#include <chrono>
#include <functional>

namespace nodal {

/// How nodal::spawn makes its children (torch.multiprocessing's start methods).
enum class StartMethod {
  /// Re-execute this program (/proc/self/exe, same argv and environment). The child runs main()
  /// again up to the same nodal::spawn call (counted in program order), runs fn(rank) there and
  /// exits; earlier nodal::spawn calls return at once in the child. Safe with threads. Like
  /// Python's spawn, the code before the call must reach it the same way in the child.
  spawn,
  /// Fork from a single-threaded fork server started before the program's threads
  /// (nodal::start_forkserver(), or the first forkserver spawn while still single-threaded).
  /// fn must be a plain function pointer: the server cannot see closures made after it started
  /// (Python's forkserver needs a picklable function for the same reason).
  forkserver,
  /// fork() this process directly. Refused with UsageError when the caller runs threads.
  fork,
};

struct SpawnOptions {
  StartMethod start_method = StartMethod::spawn;
  /// When a child fails, the others get SIGTERM, then SIGKILL after this long.
  std::chrono::milliseconds grace{5000};
};

/// Runs fn(rank) for rank = 0..nprocs-1, each in its own child process, and waits for all.
///
/// Join semantics are torch's: the first child to fail decides the error, the other children are
/// terminated (SIGTERM, grace, SIGKILL), and spawn throws
/// - ProcessRaisedError (the child's rank, exception type, message, stack) when fn threw, or
/// - ProcessExitedError (the child's rank and exit code or signal) when a child exited non-zero
///   or died by a signal.
/// Children die with the parent (PR_SET_PDEATHSIG). Throws UsageError for nprocs < 1, for fork
/// with threads running, or for forkserver with a closure.
void spawn(const std::function<void(int rank)>& fn, int nprocs, const SpawnOptions& options = {});

/// Starts the process-wide fork server used by StartMethod::forkserver. Call it at the top of
/// main(), before any thread starts. Idempotent. Throws UsageError when threads already run.
void start_forkserver();

}  // namespace nodal
