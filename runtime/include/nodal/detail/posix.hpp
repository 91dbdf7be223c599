// Small POSIX helpers shared by the runtime, nodal::spawn and nodalrun. Internal.
#pragma once

#include <cstddef>

#include <sys/types.h>

#include <string>
#include <string_view>

struct iovec;  // <sys/uio.h>

namespace nodal::detail {

/// Throws std::system_error(errno) whose message names the call that failed.
[[noreturn]] void throw_errno(std::string_view call);

/// Threads in this process (from /proc/self/status); fork() copies only the calling one.
int thread_count();

/// "SIGSEGV" for 11; "signal 99" when the number has no name.
std::string signal_name(int sig);

/// A wait status in words: "exited with code 3", "killed by SIGSEGV (core dumped)".
std::string describe_wait_status(int status);

/// The shell's convention: the exit code, or 128 + the signal number.
int exit_code_of(int status);

/// Sets or clears FD_CLOEXEC.
void set_cloexec(int fd, bool on);

/// In a freshly forked child: SIGKILL this process when its parent dies, and die at once if the
/// parent is already gone (getppid() differs from expected_parent). Async-signal-safe.
void die_with_parent(pid_t expected_parent) noexcept;

/// Writes all of buf, retrying on EINTR and short writes. Returns false on error (EPIPE...).
bool write_all(int fd, std::string_view buf) noexcept;

/// Sends one message of parts[0..count) on a Unix socket with `fd` attached (SCM_RIGHTS; none when
/// -1), retrying on EINTR, never raising SIGPIPE. Returns false with errno set when it fails (the
/// peer is gone, or a non-blocking socket is full).
bool send_with_fd(int socket, const struct iovec* parts, std::size_t count, int fd) noexcept;

/// send_with_fd with fds[0..nfds) attached, at most kMaxSentFds of them (the fork server's requests
/// carry two). Returns false with errno set (EINVAL for too many).
inline constexpr std::size_t kMaxSentFds = 4;
bool send_with_fds(int socket, const struct iovec* parts, std::size_t count, const int* fds, std::size_t nfds) noexcept;

/// Parses a non-negative decimal int; -1 when the text is not one.
int parse_int(std::string_view text) noexcept;

/// Reads an environment variable; empty when unset.
std::string getenv_or_empty(const char* name);

/// Whether process `pid` may still exist (true for pid <= 0, which names nobody; a zombie counts):
/// how process-shared locks tell a dead holder from a slow one.
bool process_alive(int pid) noexcept;

/// Whether process `pid` has exited: gone, or a zombie not yet reaped (state Z or X in
/// /proc/<pid>/stat). False for pid <= 0. Unlike process_alive a zombie counts: for a wait on a
/// peer that could still touch this process's memory, which a zombie cannot. Two limits: a
/// process whose main thread called pthread_exit while others run reads as a zombie, and a pid
/// reused by a new process reads as running.
bool process_exited(int pid) noexcept;

}  // namespace nodal::detail
