#include <nodal/errors.hpp>
#include <nodal/spawn.hpp>
#include <nodal/detail/forkserver.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/verbose.hpp>

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

namespace nodal {
namespace detail {
namespace {

/// The program's request for one job. The ranks' end of the job's control socket rides along
/// (SCM_RIGHTS): the server's children report exceptions straight to the program.
struct Request {
  std::uintptr_t entry;
  std::uintptr_t fn;
  std::int32_t nprocs;
};

enum class ReplyKind : std::int32_t { forked = 1, exited = 2, fork_failed = 3, pidfd_failed = 4 };

/// The server's news. A forked child's pidfd rides along.
struct Reply {
  ReplyKind kind;
  std::int32_t rank;
  std::int32_t pid;
  std::int32_t value;  ///< exited: the wait status; *_failed: errno
};

/// Sends one message with `fd` attached (none when -1). Returns false when the peer is gone.
bool send_message(int socket, const void* data, std::size_t size, int fd) noexcept {
  const iovec part{const_cast<void*>(data), size};
  return send_with_fd(socket, &part, 1, fd);
}

/// Receives one message into data[size] and the fd attached to it (close-on-exec; -1 when none).
/// Returns the message's size, 0 when the peer closed its end, or -1 with errno set.
ssize_t receive_message(int socket, void* data, std::size_t size, int& fd, int flags) noexcept {
  fd = -1;
  iovec part{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &part;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(socket, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* header = CMSG_FIRSTHDR(&msg); header != nullptr; header = CMSG_NXTHDR(&msg, header)) {
    if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&fd, CMSG_DATA(header), sizeof fd);
    }
  }
  return n;
}

// ---- The server process --------------------------------------------------------------------

/// Forks the job's children, reports each, then reaps them and reports each exit. Exits when
/// the program is gone or a child cannot be started (the children die with the server).
void run_job(int socket, const Request& request, int control_fd, const struct sigaction& program_sigint) {
  // The addresses came from the program, of which the server is a fork.
  const auto entry = reinterpret_cast<ForkServerEntry>(request.entry);  // NOLINT(performance-no-int-to-ptr)
  const auto fn = reinterpret_cast<void (*)(int)>(request.fn);          // NOLINT(performance-no-int-to-ptr)
  const pid_t server = ::getpid();
  auto reply = [socket](Reply news, int fd = -1) {
    if (!send_message(socket, &news, sizeof news, fd)) ::_exit(0);
  };
  std::vector<pid_t> pids(static_cast<std::size_t>(request.nprocs), -1);
  for (int rank = 0; rank < request.nprocs; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(socket);
      ::sigaction(SIGINT, &program_sigint, nullptr);
      die_with_parent(server);
      entry(fn, rank, control_fd);
      ::_exit(1);  // not reached: entry never returns
    }
    if (pid < 0) {
      const int error = errno;
      reply({ReplyKind::fork_failed, rank, -1, error});
      ::_exit(1);
    }
    // Opened before the child can be reaped, so it names this very process.
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) {
      const int error = errno;
      reply({ReplyKind::pidfd_failed, rank, pid, error});
      ::_exit(1);
    }
    pids[static_cast<std::size_t>(rank)] = pid;
    reply({ReplyKind::forked, rank, pid, 0}, pidfd);
    ::close(pidfd);
  }
  for (int left = request.nprocs; left > 0;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      ::_exit(1);
    }
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;  // a child of an earlier job that was retired: cannot happen
    reply({ReplyKind::exited, static_cast<std::int32_t>(it - pids.begin()), pid, status});
    --left;
  }
}

[[noreturn]] void serve(int socket) noexcept {
  // Ctrl-C reaches the whole foreground process group. What an interrupt means is the program's
  // business; the server must outlive it (Python's forkserver ignores SIGINT too). Its children
  // get the program's disposition back.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction program_sigint {};
  ::sigaction(SIGINT, &ignore, &program_sigint);
  for (;;) {
    Request request{};
    int control_fd = -1;
    const ssize_t n = receive_message(socket, &request, sizeof request, control_fd, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof request) || control_fd < 0) ::_exit(0);  // the program has gone
    run_job(socket, request, control_fd, program_sigint);
    ::close(control_fd);
  }
}

// ---- The program's side --------------------------------------------------------------------

/// The program's view of its server.
struct ServerState {
  std::mutex mutex;  ///< held by the running job
  pid_t pid = -1;    ///< -1: no server
  int fd = -1;       ///< the program's end of the SOCK_SEQPACKET pair
};

ServerState g_server;

/// pthread_atfork child handler. A forked child (of any start method, or of the server) copies
/// the state, perhaps with `mutex` held by a thread that does not exist in the child, and the
/// server is its parent's anyway: the child starts with no server. Async-signal-safe: no
/// allocation (a fork of a threaded program runs it too).
void forget_inherited_server() noexcept {
  if (g_server.fd >= 0) ::close(g_server.fd);
  // Re-created in place: the copied mutex may be locked and must not be unlocked or destroyed.
  std::construct_at(&g_server);
}

/// Kills and reaps the server; its children die with it (die_with_parent). Returns its status.
int retire_server_locked() {
  int status = 0;
  if (g_server.pid > 0) {
    ::kill(g_server.pid, SIGKILL);
    while (::waitpid(g_server.pid, &status, 0) < 0 && errno == EINTR) {
    }
    ::close(g_server.fd);
  }
  g_server.pid = -1;
  g_server.fd = -1;
  return status;
}

/// The error for a server that stopped answering, which is retired first.
Error server_lost() {
  const pid_t pid = g_server.pid;
  const int status = retire_server_locked();
  return Error(
      fmt::format("nodal::spawn: the fork server (pid {}) {} and its children died with it; the next "
                  "forkserver spawn starts a new server if the program then runs one thread",
                  pid, describe_wait_status(status)));
}

/// Starts the server unless one runs. The caller holds g_server.mutex.
void start_server_locked(std::string_view caller) {
  if (g_server.pid > 0) return;
  const auto started = std::chrono::steady_clock::now();
  // Checked before the threads: CUDA's runtime may have started threads of its own, and the
  // reason to give then is CUDA. A server started before CUDA was used is a clean copy, and
  // stays usable whatever the program does with CUDA afterwards.
  if (detail::gpu::cuda_initialized()) {
    throw UsageError(fmt::format(
        "{}: CUDA was initialised in this process before fork (by nodal::cuda::available(), a cuda tensor, a "
        "GPU copy, ...): CUDA does not survive fork, and the fork server and its children would get a broken "
        "CUDA. Call nodal::start_forkserver() at the top of main(), before any use of CUDA, and use CUDA in the "
        "spawned function; or use StartMethod::spawn",
        caller));
  }
  if (const int threads = thread_count(); threads > 1) {
    throw UsageError(fmt::format(
        "{}: the fork server must start while the program runs one thread, but it runs {} (fork copies only "
        "the calling thread). Call nodal::start_forkserver() at the top of main(), before any thread "
        "starts, or use StartMethod::spawn",
        caller, threads));
  }
  static std::once_flag atfork_registered;
  std::call_once(atfork_registered, [] { ::pthread_atfork(nullptr, nullptr, &forget_inherited_server); });

  int fds[2];
  // SEQPACKET: whole messages, fds attached to them, and end-of-file when the other side exits.
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) < 0) throw_errno("socketpair");
  const pid_t program = ::getpid();
  flush_stdio();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    errno = error;
    throw_errno("fork (the fork server)");
  }
  if (pid == 0) {
    ::close(fds[0]);
    die_with_parent(program);
    serve(fds[1]);
  }
  ::close(fds[1]);
  g_server.pid = pid;
  g_server.fd = fds[0];
  note_step(fmt::format("{}: fork server started (pid {})", caller, pid), started);
}

}  // namespace

void flush_stdio() noexcept {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

ForkServerJob::ForkServerJob(ForkServerEntry entry, void (*fn)(int rank), int nprocs, int control_fd)
    : lease_(g_server.mutex) {
  start_server_locked("nodal::spawn(StartMethod::forkserver)");
  // Addresses are valid in the server: it is a fork of this process.
  const Request request{reinterpret_cast<std::uintptr_t>(entry), reinterpret_cast<std::uintptr_t>(fn), nprocs};
  if (!send_message(g_server.fd, &request, sizeof request, control_fd)) throw server_lost();
  pending_ = nprocs;
}

ForkServerJob::~ForkServerJob() {
  if (pending_ > 0) retire_server_locked();
}

int ForkServerJob::fd() const noexcept { return g_server.fd; }

std::optional<ForkServerEvent> ForkServerJob::receive() {
  Reply reply{};
  int fd = -1;
  const ssize_t n = receive_message(g_server.fd, &reply, sizeof reply, fd, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return std::nullopt;
  if (n != static_cast<ssize_t>(sizeof reply)) {
    if (fd >= 0) ::close(fd);
    throw server_lost();
  }
  switch (reply.kind) {
    case ReplyKind::forked:
      return ForkServerEvent{reply.rank, reply.pid, fd, std::nullopt};
    case ReplyKind::exited:
      --pending_;
      return ForkServerEvent{reply.rank, reply.pid, -1, reply.value};
    case ReplyKind::fork_failed:
      throw std::system_error(reply.value, std::generic_category(),
                              fmt::format("fork (in the fork server, for rank {})", reply.rank));
    case ReplyKind::pidfd_failed:
      throw std::system_error(reply.value, std::generic_category(),
                              fmt::format("pidfd_open (in the fork server, for rank {})", reply.rank));
  }
  if (fd >= 0) ::close(fd);
  throw server_lost();
}

}  // namespace detail

void start_forkserver() {
  std::lock_guard lease(detail::g_server.mutex);
  detail::start_server_locked("nodal::start_forkserver");
}

}  // namespace nodal
