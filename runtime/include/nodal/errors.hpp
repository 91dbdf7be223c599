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

/// The other end of a Pipe closed: everything it sent has been received (Python's EOFError on
/// recv, BrokenPipeError on send). Not a failure of the job.
class EndOfStream : public Error {
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

/// nodal::spawn, nodal::Process: a child process let an exception escape its function.
/// Like torch.multiprocessing's ProcessRaisedException: carries the child's rank and the
/// exception's type, message and stack trace as text (the object itself lives in another process).
class ProcessRaisedError : public Error {
 public:
  /// `name`: how the message names the child; empty means "rank <rank>".
  ProcessRaisedError(int rank, int pid, std::string child_report, std::string name = {});
  /// The child's rank in its spawn call; 0 for a nodal::Process.
  int rank() const noexcept { return rank_; }
  int pid() const noexcept { return pid_; }
  /// "rank <rank>" for a child of nodal::spawn, the Process's name for a nodal::Process.
  const std::string& name() const noexcept { return name_; }
  /// "<type>: <what()>" followed by the child's stack trace, as the child reported it.
  const std::string& child_report() const noexcept { return child_report_; }

 private:
  int rank_;
  int pid_;
  std::string name_;
  std::string child_report_;
};

/// nodal::spawn, nodal::Process: a child process exited with a non-zero code or died by a signal.
/// Like torch.multiprocessing's ProcessExitedException. Exactly one of exit_code() and
/// signal() is non-zero.
class ProcessExitedError : public Error {
 public:
  /// `name`: how the message names the child; empty means "rank <rank>".
  ProcessExitedError(int rank, int pid, int exit_code, int signal, std::string name = {});
  /// The child's rank in its spawn call; 0 for a nodal::Process.
  int rank() const noexcept { return rank_; }
  int pid() const noexcept { return pid_; }
  /// "rank <rank>" for a child of nodal::spawn, the Process's name for a nodal::Process.
  const std::string& name() const noexcept { return name_; }
  int exit_code() const noexcept { return exit_code_; }
  int signal() const noexcept { return signal_; }

 private:
  int rank_;
  int pid_;
  std::string name_;
  int exit_code_;
  int signal_;
};

}  // namespace nodal
