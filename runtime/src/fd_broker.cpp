// The ranks' half of the job's fd broker (fd_broker.hpp); nodalrun's half is launcher/src/fd_registry.
#include <nodal/detail/fd_broker.hpp>

#include <nodal/errors.hpp>
#include <nodal/detail/control.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/wait.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <system_error>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

/// How long a requester sleeps in poll() between two looks at the abort word and the deadline.
constexpr auto kPollSlice = std::chrono::milliseconds(20);

int duplicate(int fd) {
  int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) throw_errno("fcntl(F_DUPFD_CLOEXEC)");
  return copy;
}

// ---- Without nodalrun: the process is its own broker ------------------------------------------

struct LocalTable {
  std::mutex mutex;
  std::condition_variable published;
  std::map<std::uint64_t, OwnedFd> fds;
};

LocalTable& local_table() {
  static auto* table = new LocalTable;  // never destroyed: a static destructor may still publish
  return *table;
}

void publish_locally(std::uint64_t key, int fd) {
  LocalTable& table = local_table();
  std::lock_guard lock(table.mutex);
  if (table.fds.count(key)) return;  // the first descriptor stays
  table.fds.emplace(key, OwnedFd(duplicate(fd)));
  table.published.notify_all();
}

int fetch_locally(const std::string& what, std::uint64_t key, Deadline deadline) {
  LocalTable& table = local_table();
  std::unique_lock lock(table.mutex);
  auto ready = [&] { return table.fds.count(key) > 0; };
  if (!deadline.at) {
    table.published.wait(lock, ready);
  } else if (!table.published.wait_until(lock, *deadline.at, ready)) {
    throw TimeoutError(fmt::format("{} timed out", what));
  }
  return duplicate(table.fds.at(key).get());
}

// ---- Under nodalrun: ask the supervisor ---------------------------------------------------------

/// Sends the request with a fresh reply socket attached; returns our end of it.
OwnedFd send_request(const ControlEndpoint& endpoint, int owner, std::uint64_t key) {
  int pair[2];
  // SEQPACKET: the reply arrives whole with its descriptor, and nodalrun closing the socket
  // unanswered (the job ended) reads as end-of-file. Non-blocking: nodalrun must never wait on it.
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) < 0) throw_errno("socketpair");
  OwnedFd ours(pair[0]);
  OwnedFd theirs(pair[1]);
  ControlMessage request{ControlKind::fd_fetch, owner, static_cast<std::int32_t>(::getpid()), {}, key, {}};
  if (!send_control(endpoint.fd, request, theirs.get())) {
    const int error = errno;
    check_job_alive();
    throw PeerFailure(fmt::format("rank {}: nodalrun is gone (sending to its control socket failed: {})",
                                  endpoint.rank, std::strerror(error)));
  }
  return ours;
}

/// Waits on the reply socket in slices, checking the abort word and the deadline between them.
int await_reply(int socket, const std::string& what, Deadline deadline) {
  Waiter waiter(deadline, what);
  for (;;) {
    waiter.check();  // PeerFailure, TimeoutError
    auto slice = std::chrono::duration_cast<std::chrono::milliseconds>(kPollSlice);
    if (deadline.at) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline.at - Clock::now());
      slice = std::clamp(left, std::chrono::milliseconds(0), slice);
    }
    pollfd entry{socket, POLLIN, 0};
    if (::poll(&entry, 1, static_cast<int>(slice.count())) < 0 && errno != EINTR) throw_errno("poll");
    bool closed = false;
    std::optional<ControlMessage> reply = receive_control(socket, &closed);
    if (reply && reply->kind == ControlKind::fd_reply && reply->fd.get() >= 0) return reply->fd.release();
    if (reply || closed) {
      check_job_alive();  // a failed job explains an empty or missing answer best
      if (closed) throw PeerFailure(fmt::format("{}: nodalrun ended the job before answering", what));
      throw UsageError(fmt::format("{}: {}", what, reply->text));
    }
  }
}

}  // namespace

void publish_fd(std::uint64_t key, int fd) {
  const ControlEndpoint endpoint = control_endpoint();
  if (endpoint.fd < 0) return publish_locally(key, fd);
  ControlMessage message{ControlKind::fd_publish, endpoint.rank, static_cast<std::int32_t>(::getpid()), {}, key, {}};
  if (!send_control(endpoint.fd, message, fd)) {
    throw std::system_error(errno, std::generic_category(), "publish_fd: sendmsg(control)");
  }
}

int fetch_fd(int owner, std::uint64_t key, std::optional<std::chrono::nanoseconds> timeout) {
  const ControlEndpoint endpoint = control_endpoint();
  const std::string what = fmt::format("rank {}: fetch_fd(owner {}, key {})", endpoint.rank, owner, key);
  const Deadline deadline = Deadline::after(timeout);
  if (endpoint.fd >= 0) {
    OwnedFd reply_socket = send_request(endpoint, owner, key);
    return await_reply(reply_socket.get(), what, deadline);
  }
  if (owner != endpoint.rank) {
    throw UsageError(fmt::format("{} needs nodalrun: no fd broker in a process started without it", what));
  }
  return fetch_locally(what, key, deadline);
}

}  // namespace nodal::detail
