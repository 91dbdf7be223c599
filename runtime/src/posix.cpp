#include <nodal/detail/posix.hpp>

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <system_error>

#include <fmt/format.h>

namespace nodal::detail {

void throw_errno(std::string_view call) {
  throw std::system_error(errno, std::generic_category(), std::string(call));
}

int thread_count() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

std::string signal_name(int sig) {
  if (const char* abbrev = sigabbrev_np(sig)) return fmt::format("SIG{}", abbrev);
  return fmt::format("signal {}", sig);
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("killed by {}{}", signal_name(WTERMSIG(status)),
                       WCOREDUMP(status) ? " (core dumped)" : "");
  }
  return fmt::format("wait status {:#x}", status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void set_cloexec(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFD);
  if (flags < 0) throw_errno("fcntl(F_GETFD)");
  flags = on ? (flags | FD_CLOEXEC) : (flags & ~FD_CLOEXEC);
  if (::fcntl(fd, F_SETFD, flags) < 0) throw_errno("fcntl(F_SETFD)");
}

void die_with_parent(pid_t expected_parent) noexcept {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The parent may have died between fork() and prctl(): then we were already re-parented.
  if (::getppid() != expected_parent) ::_exit(128 + SIGKILL);
}

bool write_all(int fd, std::string_view buf) noexcept {
  while (!buf.empty()) {
    ssize_t n = ::write(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    buf.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

int parse_int(std::string_view text) noexcept {
  int value = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < 0) return -1;
  return value;
}

std::string getenv_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

bool send_with_fd(int socket, const iovec* parts, std::size_t count, int fd) noexcept {
  return send_with_fds(socket, parts, count, &fd, fd >= 0 ? 1 : 0);
}

bool send_with_fds(int socket, const iovec* parts, std::size_t count, const int* fds, std::size_t nfds) noexcept {
  if (nfds > kMaxSentFds) {
    errno = EINVAL;
    return false;
  }
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(parts);
  msg.msg_iovlen = count;
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxSentFds * sizeof(int))] = {};
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* header = CMSG_FIRSTHDR(&msg);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(header), fds, nfds * sizeof(int));
  }
  for (;;) {
    if (::sendmsg(socket, &msg, MSG_NOSIGNAL) >= 0) return true;
    if (errno != EINTR) return false;
  }
}

bool process_alive(int pid) noexcept { return pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH; }

bool process_exited(int pid) noexcept {
  if (pid <= 0) return false;
  if (!process_alive(pid)) return true;
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;  // reaped meanwhile
  char stat[512];
  const ssize_t got = ::read(fd, stat, sizeof stat - 1);
  ::close(fd);
  if (got <= 0) return false;
  stat[got] = '\0';
  // "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'.
  const char* end = std::strrchr(stat, ')');
  return end != nullptr && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X');
}

}  // namespace nodal::detail
