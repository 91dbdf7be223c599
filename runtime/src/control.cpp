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
  std::uint32_t reserved;  ///< zero: no uninitialised padding goes on the wire
  std::uint64_t key;
};

/// Room for more descriptors than a message ever carries: a sender that attaches several still
/// gets all of them closed here, instead of some silently kept open in our table.
constexpr std::size_t kMaxReceivedFds = 8;

/// The descriptors an SCM_RIGHTS message brought: the first goes to `keep`, the others are closed.
void take_descriptors(msghdr& msg, OwnedFd& keep) {
  for (cmsghdr* header = CMSG_FIRSTHDR(&msg); header != nullptr; header = CMSG_NXTHDR(&msg, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    std::size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
      if (keep.get() < 0) {
        keep = OwnedFd(fd);
      } else {
        ::close(fd);
      }
    }
  }
}

}  // namespace

OwnedFd& OwnedFd::operator=(OwnedFd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void OwnedFd::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

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

bool send_control(int fd, const ControlMessage& message, int attached) noexcept {
  Header header{static_cast<std::uint32_t>(message.kind), message.rank, message.pid, 0, message.key};
  std::size_t text_size = std::min(message.text.size(), kMaxControlText);
  iovec parts[2] = {{&header, sizeof header},
                    {const_cast<char*>(message.text.data()), text_size}};
  return send_with_fd(fd, parts, 2, attached);
}

std::optional<ControlMessage> receive_control(int fd, bool* peer_closed) {
  std::vector<char> buf(sizeof(Header) + kMaxControlText);
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxReceivedFds * sizeof(int))];
  for (;;) {
    iovec part{buf.data(), buf.size()};
    msghdr msg{};
    msg.msg_iov = &part;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;
      throw_errno("recvmsg(control)");
    }
    ControlMessage message;
    take_descriptors(msg, message.fd);  // owned from here on: a dropped message closes them
    if (n == 0 && peer_closed != nullptr) {  // SOCK_SEQPACKET: end of file (we never send empty messages)
      *peer_closed = true;
      return std::nullopt;
    }
    if (static_cast<std::size_t>(n) < sizeof(Header)) continue;  // not ours: drop it
    Header header;
    std::memcpy(&header, buf.data(), sizeof header);
    message.kind = static_cast<ControlKind>(header.kind);
    message.rank = header.rank;
    message.pid = header.pid;
    message.key = header.key;
    message.text.assign(buf.data() + sizeof header, static_cast<std::size_t>(n) - sizeof header);
    return message;
  }
}

}  // namespace nodal::detail
