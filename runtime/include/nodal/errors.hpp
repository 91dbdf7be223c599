// nodal's exceptions. Every error nodal throws derives from nodal::Error, so a rank can catch
// them all at once; messages say what failed, on which rank, and what to do about it.
// Failures of system calls are std::system_error carrying errno and the call's name (as fmt does).
#pragma once

#include <stdexcept>
#include <string>

namespace nodal {

/// Base of every nodal exception.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The caller used nodal wrongly: bad arguments, a call in the wrong state, a start method that
/// cannot work here (fork with threads running, say).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// Another rank of the job failed; this rank cannot go on with the job.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

/// A blocking call waited longer than its timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// Shared memory could not be had: too little /dev/shm or arena space (says needed and available).
class ShmError : public Error {
 public:
  using Error::Error;
};

/// A CUDA or NCCL call failed.
class CudaError : public Error {
 public:
  using Error::Error;
};

/// nodal::spawn: a child process let an exception escape `fn`.
/// Like torch.multiprocessing's ProcessRaisedException: carries the child's rank and the
/// exception's type, message and stack trace as text (the object itself lives in another process).
class ProcessRaisedError : public Error {
 public:
  ProcessRaisedError(int rank, int pid, std::string child_report);
  int rank() const noexcept { return rank_; }
  int pid() const noexcept { return pid_; }
  /// "<type>: <what()>" followed by the child's stack trace, as the child reported it.
  const std::string& child_report() const noexcept { return child_report_; }

 private:
  int rank_;
  int pid_;
  std::string child_report_;
};

/// nodal::spawn: a child process exited with a non-zero code or died by a signal.
/// Like torch.multiprocessing's ProcessExitedException. Exactly one of exit_code() and
/// signal() is non-zero.
class ProcessExitedError : public Error {
 public:
  ProcessExitedError(int rank, int pid, int exit_code, int signal);
  int rank() const noexcept { return rank_; }
  int pid() const noexcept { return pid_; }
  int exit_code() const noexcept { return exit_code_; }
  int signal() const noexcept { return signal_; }

 private:
  int rank_;
  int pid_;
  int exit_code_;
  int signal_;
};

}  // namespace nodal
