#include <nodal/errors.hpp>
#include <nodal/spawn.hpp>
#include <nodal/detail/control.hpp>
#include <nodal/detail/forkserver.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/verbose.hpp>

#include <fcntl.h>
#include <poll.h>
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
#include <deque>
#include <iostream>
#include <list>
#include <memory>
#include <atomic>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace nodal {
namespace detail {
namespace {

/// The program's request for one job. Two descriptors ride along (SCM_RIGHTS): the server's end
/// of the job's own socket, on which the server sends the job's news, and the ranks' end of the
/// job's control socket, on which the server's children report exceptions straight to the program.
struct Request {
  std::uintptr_t entry;
  std::uintptr_t fn;
  std::int32_t nprocs;
};

enum class ReplyKind : std::int32_t { forked = 1, exited = 2, fork_failed = 3, pidfd_failed = 4 };

/// The server's news, on the job's socket. A forked child's pidfd rides along.
struct Reply {
  ReplyKind kind;
  std::int32_t rank;
  std::int32_t pid;
  std::int32_t value;  ///< exited: the wait status; *_failed: errno
};

/// Sends one message with fds[0..nfds) attached. Returns false when the peer is gone.
bool send_message(int socket, const void* data, std::size_t size, const int* fds = nullptr,
                  std::size_t nfds = 0) noexcept {
  const iovec part{const_cast<void*>(data), size};
  return send_with_fds(socket, &part, 1, fds, nfds);
}

/// Receives one message into data[size] and up to fds.size() descriptors attached to it
/// (close-on-exec; -1 where none came; any beyond are closed). Returns the message's size, 0 when
/// the peer closed its end, or -1 with errno set.
ssize_t receive_message(int socket, void* data, std::size_t size, std::span<int> fds, int flags) noexcept {
  std::fill(fds.begin(), fds.end(), -1);
  iovec part{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxSentFds * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &part;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(socket, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  std::size_t taken = 0;
  for (cmsghdr* header = CMSG_FIRSTHDR(&msg); header != nullptr; header = CMSG_NXTHDR(&msg, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
      if (taken < fds.size()) {
        fds[taken++] = fd;
      } else {
        ::close(fd);
      }
    }
  }
  return n;
}

// ---- The server process --------------------------------------------------------------------

/// A child of the server that has not been reaped yet.
struct ServerChild {
  std::int32_t rank = -1;
  pid_t pid = -1;  ///< -1 once reaped
  int pidfd = -1;
};

/// One job in the server.
struct ServerJob {
  int socket = -1;      ///< the server's end of the job's socket (non-blocking); -1 once the program closed its end
  int control_fd = -1;  ///< the ranks' end of the job's control socket, which the children inherit
  std::vector<ServerChild> running;
  /// News the socket had no room for: a program that does not read a job's news yet (a Process
  /// nobody joins) must not stall the server, and with it every other job.
  std::deque<std::pair<Reply, OwnedFd>> backlog;
};

/// The server: one thread, one poll loop over the program's socket (requests), each job's socket
/// (the program closing its end ends the job) and each child's pidfd (exits).
class Server {
 public:
  Server(int socket, const struct sigaction& program_sigint)
      : socket_(socket), program_sigint_(program_sigint), pid_(::getpid()) {}

  [[noreturn]] void run() {
    std::vector<pollfd> fds;
    std::vector<std::pair<ServerJob*, ServerChild*>> watched;  // fds[i + 1]'s job, and child (null: its socket)
    for (;;) {
      fds.assign(1, pollfd{socket_, POLLIN, 0});
      watched.clear();
      for (ServerJob& job : jobs_) {
        if (job.socket >= 0) {
          // POLLHUP and POLLERR are always reported: the program closed its end.
          fds.push_back({job.socket, static_cast<short>(job.backlog.empty() ? 0 : POLLOUT), 0});
          watched.emplace_back(&job, nullptr);
        }
        for (ServerChild& child : job.running) {
          fds.push_back({child.pidfd, POLLIN, 0});
          watched.emplace_back(&job, &child);
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        ::_exit(1);
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto [job, child] = watched[i - 1];
        if (child == nullptr) {
          if ((fds[i].revents & (POLLHUP | POLLERR)) != 0) {
            abandon(*job);
          } else {
            flush(*job);
          }
        } else {
          reap(*job, *child);
        }
      }
      forget_finished();
      if (fds[0].revents != 0) accept_request();
    }
  }

 private:
  void accept_request() {
    Request request{};
    int fds[2];
    const ssize_t n = receive_message(socket_, &request, sizeof request, fds, 0);
    if (n < 0 && errno == EINTR) return;
    if (n != static_cast<ssize_t>(sizeof request) || fds[0] < 0 || fds[1] < 0) ::_exit(0);  // the program has gone
    ServerJob& job = jobs_.emplace_back();
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    job.socket = fds[0];
    job.control_fd = fds[1];
    start(job, request);
  }

  /// Forks the job's children, reporting each with its pidfd.
  void start(ServerJob& job, const Request& request) {
    // The addresses came from the program, of which the server is a fork.
    const auto entry = reinterpret_cast<ForkServerEntry>(request.entry);  // NOLINT(performance-no-int-to-ptr)
    const auto fn = reinterpret_cast<void (*)(int)>(request.fn);          // NOLINT(performance-no-int-to-ptr)
    for (int rank = 0; rank < request.nprocs && job.socket >= 0; ++rank) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        close_server_fds(job);
        ::sigaction(SIGINT, &program_sigint_, nullptr);
        die_with_parent(pid_);
        entry(fn, rank, job.control_fd);
        ::_exit(1);  // not reached: entry never returns
      }
      if (pid < 0) {
        const int error = errno;
        reply(job, {ReplyKind::fork_failed, rank, -1, error});
        kill_all(job);  // the program, told why, closes the job
        return;
      }
      // Opened before the child can be reaped, so it names this very process.
      const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      if (pidfd < 0) {
        const int error = errno;
        ::kill(pid, SIGKILL);  // our unreaped child: the pid is still its own
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        reply(job, {ReplyKind::pidfd_failed, rank, pid, error});
        kill_all(job);
        return;
      }
      job.running.push_back({rank, pid, pidfd});
      reply(job, {ReplyKind::forked, rank, pid, 0}, pidfd);
    }
  }

  /// In a child: the server's descriptors are none of the child's business (other jobs' sockets
  /// kept open there would hide the program's end closing). Only its job's control socket stays.
  void close_server_fds(const ServerJob& own) const noexcept {
    ::close(socket_);
    for (const ServerJob& job : jobs_) {
      if (job.socket >= 0) ::close(job.socket);
      if (&job != &own) ::close(job.control_fd);
      for (const ServerChild& child : job.running) ::close(child.pidfd);
      for (const auto& queued : job.backlog) ::close(queued.second.get());
    }
  }

  /// Sends news to the program; a program that closed the job's end abandoned the job.
  void reply(ServerJob& job, Reply news, int fd = -1) {
    if (job.socket < 0) return;
    if (job.backlog.empty()) {
      if (send_message(job.socket, &news, sizeof news, &fd, fd >= 0 ? 1 : 0)) return;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        abandon(job);
        return;
      }
    }
    // A copy of the pidfd: the child may be reaped, and its pidfd closed, before this goes out.
    job.backlog.emplace_back(news, OwnedFd(fd >= 0 ? ::fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1));
  }

  /// Sends the news the socket had no room for, as room comes.
  void flush(ServerJob& job) {
    while (job.socket >= 0 && !job.backlog.empty()) {
      const auto& [news, attached] = job.backlog.front();
      const int fd = attached.get();
      if (!send_message(job.socket, &news, sizeof news, &fd, fd >= 0 ? 1 : 0)) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) abandon(job);
        return;
      }
      job.backlog.pop_front();
    }
  }

  /// The program gave the job up (closed its end: an error, or a ProcessContext destroyed before
  /// it joined): its children are killed, and reaped as their exits come.
  void abandon(ServerJob& job) noexcept {
    if (job.socket < 0) return;
    ::close(job.socket);
    job.socket = -1;
    job.backlog.clear();
    kill_all(job);
  }

  static void kill_all(const ServerJob& job) noexcept {
    for (const ServerChild& child : job.running) {
      if (child.pid > 0) ::syscall(SYS_pidfd_send_signal, child.pidfd, SIGKILL, nullptr, 0);
    }
  }

  void reap(ServerJob& job, ServerChild& child) {
    int status = 0;
    pid_t reaped = -1;
    do {
      reaped = ::waitpid(child.pid, &status, WNOHANG);
    } while (reaped < 0 && errno == EINTR);
    if (reaped == 0) return;
    if (reaped < 0) status = W_EXITCODE(255, 0);  // reaped by nobody else in this process: cannot happen
    const pid_t pid = child.pid;
    child.pid = -1;
    reply(job, {ReplyKind::exited, child.rank, pid, status});
  }

  /// Drops reaped children, and the jobs that have none left.
  void forget_finished() {
    for (ServerJob& job : jobs_) {
      std::erase_if(job.running, [](const ServerChild& child) {
        if (child.pid > 0) return false;
        ::close(child.pidfd);
        return true;
      });
    }
    jobs_.remove_if([](ServerJob& job) {
      if (!job.running.empty() || (job.socket >= 0 && !job.backlog.empty())) return false;
      if (job.socket >= 0) ::close(job.socket);
      ::close(job.control_fd);
      return true;
    });
  }

  int socket_;
  struct sigaction program_sigint_;
  pid_t pid_;
  std::list<ServerJob> jobs_;  ///< a list: children and watches point into it while others are added
};

[[noreturn]] void serve(int socket) noexcept {
  // Ctrl-C reaches the whole foreground process group. What an interrupt means is the program's
  // business; the server must outlive it (Python's forkserver ignores SIGINT too). Its children
  // get the program's disposition back.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction program_sigint {};
  ::sigaction(SIGINT, &ignore, &program_sigint);
  Server(socket, program_sigint).run();
}

// ---- The program's side --------------------------------------------------------------------

/// The program's view of its server.
struct ServerState {
  std::mutex mutex;  ///< held while the server starts, takes a request, or is retired
  pid_t pid = -1;    ///< -1: no server
  int fd = -1;       ///< the program's end of the SOCK_SEQPACKET pair
  std::uint64_t number = 0;  ///< in start order, from 1; 0: no server
};

ServerState g_server;
/// Servers this process started (a child of a fork starts from its parent's count, harmlessly).
std::atomic<std::uint64_t> g_servers_started{0};

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
  g_server.number = 0;
  return status;
}

/// The error for server `pid` that stopped answering, which is retired first unless another job
/// did it already (and a new server may run by now).
Error server_lost_locked(pid_t pid) {
  const std::string how = g_server.pid == pid ? describe_wait_status(retire_server_locked()) : "died";
  return Error(
      fmt::format("nodal: the fork server (pid {}) {} and its children died with it; the next forkserver start "
                  "starts a new server if the program then runs one thread",
                  pid, how));
}

Error server_lost(pid_t pid) {
  std::lock_guard lock(g_server.mutex);
  return server_lost_locked(pid);
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
  // The job's arena first: the server and its children must map this process's arena, not make
  // arenas of their own (outside nodalrun it is made on first use, which may come later).
  job_arena();

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
  g_server.number = ++g_servers_started;
  note_step(fmt::format("{}: fork server started (pid {})", caller, pid), started);
}

}  // namespace

std::uint64_t forkservers_started() noexcept { return g_servers_started.load(); }

std::uint64_t running_forkserver() noexcept {
  std::lock_guard lock(g_server.mutex);
  return g_server.number;
}

void flush_stdio() noexcept {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
}

ForkServerJob::ForkServerJob(std::string_view caller, ForkServerEntry entry, void (*fn)(int rank), int nprocs,
                             int control_fd) {
  std::lock_guard lease(g_server.mutex);
  // The server first: a server forked after the job's socket was made would hold a copy of the
  // program's end, and never see the program close it.
  start_server_locked(caller);
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) throw_errno("socketpair");
  fd_ = pair[0];
  const OwnedFd server_end(pair[1]);  // the server has its own copy once the request is sent
  server_ = g_server.pid;
  pending_ = nprocs;
  // Addresses are valid in the server: it is a fork of this process.
  const Request request{reinterpret_cast<std::uintptr_t>(entry), reinterpret_cast<std::uintptr_t>(fn), nprocs};
  const int attached[2] = {server_end.get(), control_fd};
  if (!send_message(g_server.fd, &request, sizeof request, attached, 2)) {
    ::close(fd_);
    throw server_lost_locked(server_);
  }
}

ForkServerJob::~ForkServerJob() { ::close(fd_); }

std::optional<ForkServerEvent> ForkServerJob::receive() {
  Reply reply{};
  int fd = -1;
  const ssize_t n = receive_message(fd_, &reply, sizeof reply, std::span<int>(&fd, 1), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return std::nullopt;
  if (n == 0 && pending_ == 0) return std::nullopt;  // the server closed a finished job's socket
  if (n != static_cast<ssize_t>(sizeof reply)) {
    if (fd >= 0) ::close(fd);
    throw server_lost(server_);
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
  throw server_lost(server_);
}

}  // namespace detail

void start_forkserver() {
  std::lock_guard lease(detail::g_server.mutex);
  detail::start_server_locked("nodal::start_forkserver");
}

}  // namespace nodal
