// Removing the job's named shared memory however nodalrun ends, SIGKILL included: a small child
// process waits for nodalrun's end and then unlinks. The idea is Python multiprocessing's
// resource_tracker, which does the same for named semaphores and shared memory.
#pragma once

#include <sys/types.h>

#include <string>

namespace nodal::launcher {

class ShmGuard {
 public:
  /// Forks the guard for `path` (nothing exists there yet, or the guard removes it at the end).
  /// The guard ignores SIGINT/SIGTERM/SIGHUP (a Ctrl-C to the terminal's process group must not
  /// end it before nodalrun) and unlinks `path` when the pipe from nodalrun reports end of file,
  /// which the kernel does when nodalrun exits for any reason. Throws std::system_error.
  explicit ShmGuard(std::string path);
  /// Unlinks now and lets the guard go.
  ~ShmGuard();
  ShmGuard(const ShmGuard&) = delete;
  ShmGuard& operator=(const ShmGuard&) = delete;

  pid_t pid() const noexcept { return pid_; }

 private:
  std::string path_;
  pid_t pid_ = -1;
  int pipe_write_ = -1;
};

}  // namespace nodal::launcher
