// The control channel from ranks to their supervisor (nodalrun, or the parent of nodal::spawn).
// One AF_UNIX SOCK_DGRAM socket pair per job: the supervisor reads one end, every rank inherits
// the other, so each report is one datagram and reports of different ranks never mix. Internal.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace nodal::detail {

enum class ControlKind : std::uint32_t {
  exception = 1,     ///< text: "<type>: <what>\n<stack trace>"; the rank exits with code 1 next
  forked = 2,        ///< a forkserver zygote forked `rank` as `pid`
  zygote_error = 3,  ///< text: why the forkserver zygote refused to fork the ranks
};

struct ControlMessage {
  ControlKind kind{};
  std::int32_t rank = -1;
  std::int32_t pid = -1;
  std::string text;
};

/// Longest text a message carries; longer texts are cut (a stack trace is a few KiB).
inline constexpr std::size_t kMaxControlText = 48 * 1024;

/// Creates the socket pair: first is the supervisor's end (non-blocking, close-on-exec), second
/// the ranks' end (inheritable). Throws std::system_error.
std::pair<int, int> make_control_pair();

/// Sends one message. Never throws and allocates only for the datagram: safe in a terminate
/// handler. Returns false when the supervisor is gone.
bool send_control(int fd, const ControlMessage& message) noexcept;

/// Receives one message without blocking; nullopt when none is queued.
std::optional<ControlMessage> receive_control(int fd);

}  // namespace nodal::detail
