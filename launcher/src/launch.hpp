// Starting one process the way nodalrun needs it: fork + execve with per-process setup.
// Why not Boost.Process: between fork and exec a rank needs its own process group,
// PR_SET_PDEATHSIG tied to nodalrun, a CPU binding, an unblocked signal mask and chosen fds made
// inheritable; Boost.Process 1.81 offers no stable hook for all of these, so this is POSIX.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace nodal::launcher {

struct LaunchSpec {
  std::string program;                ///< resolved path
  std::vector<std::string> argv;      ///< argv[0] included
  std::vector<std::string> env;       ///< NAME=VALUE, complete
  int stdout_fd = -1;                 ///< becomes fd 1
  int stderr_fd = -1;                 ///< becomes fd 2
  /// The descriptors above stderr that cross exec (every other one is closed there).
  std::vector<int> inherit_fds;
  const cpu_set_t* cpuset = nullptr;  ///< bound before exec when set
};

/// fork()s and execs spec in a new process group that dies with nodalrun, stdin on /dev/null.
/// Returns the pid.
/// The child does only async-signal-safe work; if execve fails it writes why to its stderr and
/// exits 127 (ENOENT) or 126. Throws std::system_error when fork fails.
pid_t launch(const LaunchSpec& spec);

}  // namespace nodal::launcher
