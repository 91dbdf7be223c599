#include <nodal/detail/control.hpp>
#include <nodal/detail/posix.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace nodal::detail {
namespace {

struct Header {
  std::uint32_t kind;
  std::int32_t rank;
  std::int32_t pid;
};

}  // namespace

std::pair<int, int> make_control_pair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, fds) < 0) throw_errno("socketpair");
  // The supervisor's end never blocks its event loop; the ranks' end must survive exec.
  if (::fcntl(fds[0], F_SETFL, O_NONBLOCK) < 0) throw_errno("fcntl(O_NONBLOCK)");
  set_cloexec(fds[1], false);
  // Room for a few full stack traces queued at once (64 ranks throwing together).
  int size = 4 << 20;
  ::setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  return {fds[0], fds[1]};
}

bool send_control(int fd, const ControlMessage& message) noexcept {
  Header header{static_cast<std::uint32_t>(message.kind), message.rank, message.pid};
  std::size_t text_size = std::min(message.text.size(), kMaxControlText);
  iovec parts[2] = {{&header, sizeof header},
                    {const_cast<char*>(message.text.data()), text_size}};
  msghdr msg{};
  msg.msg_iov = parts;
  msg.msg_iovlen = 2;
  for (;;) {
    if (::sendmsg(fd, &msg, MSG_NOSIGNAL) >= 0) return true;
    if (errno != EINTR) return false;
  }
}

std::optional<ControlMessage> receive_control(int fd) {
  std::vector<char> buf(sizeof(Header) + kMaxControlText);
  for (;;) {
    ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;
      throw_errno("recv(control)");
    }
    if (static_cast<std::size_t>(n) < sizeof(Header)) continue;  // not ours: drop it
    Header header;
    std::memcpy(&header, buf.data(), sizeof header);
    ControlMessage message;
    message.kind = static_cast<ControlKind>(header.kind);
    message.rank = header.rank;
    message.pid = header.pid;
    message.text.assign(buf.data() + sizeof header, static_cast<std::size_t>(n) - sizeof header);
    return message;
  }
}

}  // namespace nodal::detail
