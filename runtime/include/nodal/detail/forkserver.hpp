// The fork server behind StartMethod::forkserver (nodal::spawn, nodal::Process). Internal.
//
// fork() copies only the calling thread, so a program that runs threads cannot fork safely. The
// fork server is a copy of the program forked while it was still single-threaded; every
// forkserver start asks it to fork the children from that clean copy, whatever threads the
// program runs by then. Only a parent can wait for its children, so the server reports each
// child's pid (with a pidfd, opened before the child can be reaped, so signals sent through it
// never reach a process that reused the pid) and, later, its wait status. Each job (one start's
// children) has a socket of its own to the server, so jobs run side by side: a Process started
// while another runs, a ProcessContext not yet joined.
// The idea is Python's multiprocessing.forkserver; the difference is that ours is a fork of the
// program, not a fresh interpreter, so a child can only run a function that existed when the
// server started: a plain function pointer, valid in the server because it is a copy of us.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace nodal::detail {

/// What a child of the server runs (it never returns): the user's fn as `rank`, reporting an
/// exception on control_fd (see control.hpp).
using ForkServerEntry = void (*)(void (*fn)(int rank), int rank, int control_fd);

/// The server's news about one child of a job: forked (with its pidfd) or exited.
struct ForkServerEvent {
  int rank = -1;
  pid_t pid = -1;
  int pidfd = -1;                  ///< forked: a pidfd of the child, now the caller's to close
  std::optional<int> wait_status;  ///< exited: the status the server reaped (waitpid's format)
};

/// Fork servers this process has started so far, and the number of the one running now (they
/// are numbered 1, 2, ... in start order; 0: none runs). An object made when
/// forkservers_started() was k exists in a server numbered above k (a fork made after it), not in
/// one numbered k or below: how nodal::data::DataLoader knows its dataset is there.
std::uint64_t forkservers_started() noexcept;
std::uint64_t running_forkserver() noexcept;

/// Flushes stdio and std::cout/std::cerr. Before a fork, so that the child does not write the
/// parent's buffered output a second time; before a child's _exit, so that its output is not lost.
void flush_stdio() noexcept;

/// One job on the process's fork server: nprocs children running entry(fn, rank, control_fd).
/// Starts the server first when none runs (see nodal::start_forkserver); `caller` names the call
/// in its errors ("nodal::spawn(StartMethod::forkserver)").
class ForkServerJob {
 public:
  /// Throws UsageError when the server must start but threads run, nodal::Error when the server
  /// died, std::system_error.
  ForkServerJob(std::string_view caller, ForkServerEntry entry, void (*fn)(int rank), int nprocs, int control_fd);
  /// Closes the job's socket: the server SIGKILLs the job's children still running and reaps them.
  ~ForkServerJob();
  ForkServerJob(const ForkServerJob&) = delete;
  ForkServerJob& operator=(const ForkServerJob&) = delete;

  /// Readable (POLLIN) when the server has news for this job.
  int fd() const noexcept { return fd_; }
  /// The next event, without blocking; nullopt when none is queued. Throws std::system_error when
  /// the server could not fork a child, nodal::Error when the server died.
  std::optional<ForkServerEvent> receive();

 private:
  int fd_ = -1;        ///< the program's end of the job's socket
  pid_t server_ = -1;  ///< the server that runs the job
  int pending_ = 0;    ///< children not yet reported exited: the server closes the socket after the last
};

}  // namespace nodal::detail
