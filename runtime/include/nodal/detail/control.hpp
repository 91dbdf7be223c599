// The control channel from ranks to their supervisor (nodalrun, or the parent of nodal::spawn).
// One AF_UNIX SOCK_DGRAM socket pair per job: the supervisor reads one end, every rank inherits
// the other, so each report is one datagram and reports of different ranks never mix. A message
// may carry one descriptor (SCM_RIGHTS): the job's fd broker (fd_broker.hpp) rides on it. Internal.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace nodal::detail {

enum class ControlKind : std::uint32_t {
  exception = 1,     ///< text: "<type>: <what>\n<stack trace>"; the rank exits with code 1 next
  forked = 2,        ///< a forkserver zygote forked `rank` as `pid`
  zygote_error = 3,  ///< text: why the forkserver zygote refused to fork the ranks
  fd_publish = 4,    ///< `rank` publishes the attached descriptor under `key`
  fd_fetch = 5,      ///< asks for what rank `rank` published under `key`; attached: the reply socket
  fd_reply = 6,      ///< on a reply socket: the descriptor attached, or none and `text` says why
  wait_stack = 7,    ///< text: "thread <tid> in <call>\n<stack>", a waiting thread's answer to a stack request
};

/// A descriptor owned by its holder: closed when it goes, unless release()d first.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) noexcept : fd_(fd) {}
  OwnedFd(OwnedFd&& other) noexcept : fd_(other.release()) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept;
  ~OwnedFd() { reset(); }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset() noexcept;

 private:
  int fd_ = -1;
};

struct ControlMessage {
  ControlKind kind{};
  std::int32_t rank = -1;
  std::int32_t pid = -1;
  std::string text;
  std::uint64_t key = 0;  ///< fd_publish, fd_fetch: the broker's key
  /// Received messages only: the descriptor the message carried (-1 when none), closed with the
  /// message unless its handler takes it. To send one, pass it to send_control.
  OwnedFd fd{};
};

/// Longest text a message carries; longer texts are cut (a stack trace is a few KiB).
inline constexpr std::size_t kMaxControlText = 48 * 1024;

/// Creates the socket pair: first is the supervisor's end (non-blocking, close-on-exec), second
/// the ranks' end (inheritable). Throws std::system_error.
std::pair<int, int> make_control_pair();

/// Sends one message, with `attached` (not consumed) passed along when it is >= 0. Never throws
/// and allocates only for the datagram: safe in a terminate handler. Returns false when the
/// supervisor is gone, or when a non-blocking socket is full.
bool send_control(int fd, const ControlMessage& message, int attached = -1) noexcept;

/// Receives one message without blocking; nullopt when none is queued. A descriptor the message
/// carries arrives close-on-exec in ControlMessage::fd. Give `peer_closed` only for a
/// SOCK_SEQPACKET socket: when its peer has closed its end, returns nullopt and sets it.
std::optional<ControlMessage> receive_control(int fd, bool* peer_closed = nullptr);

/// This rank's end of its job's control socket (-1 before nodal::init(), and in a process that
/// nodalrun did not start) and its rank, as nodal::init() found them. Defined by the runtime.
struct ControlEndpoint {
  int fd = -1;
  int rank = 0;
};
ControlEndpoint control_endpoint() noexcept;

}  // namespace nodal::detail
