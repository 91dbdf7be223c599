#include "launch.hpp"

#include <nodal/detail/posix.hpp>

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>

namespace nodal::launcher {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

[[noreturn]] void exec_child(const LaunchSpec& spec, char* const* argv, char* const* envp, pid_t launcher) {
  ::setpgid(0, 0);
  nodal::detail::die_with_parent(launcher);
  // nodalrun blocks the signals it reads through signalfd and ignores SIGPIPE; a program must
  // start with the defaults.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  // Ranks are in their own process groups: one reading a terminal would be stopped (SIGTTIN)
  // for good. Like mpirun's ranks other than 0, they read /dev/null.
  if (int null_fd = ::open("/dev/null", O_RDONLY); null_fd >= 0) {
    ::dup2(null_fd, STDIN_FILENO);
    if (null_fd != STDIN_FILENO) ::close(null_fd);
  }
  if (spec.stdout_fd >= 0) ::dup2(spec.stdout_fd, STDOUT_FILENO);
  if (spec.stderr_fd >= 0) ::dup2(spec.stderr_fd, STDERR_FILENO);
  // Only what the rank is given crosses exec: libraries' descriptors opened without
  // close-on-exec (libpmix's accepted client sockets) stay behind.
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  for (int fd : spec.inherit_fds) ::fcntl(fd, F_SETFD, 0);
  if (spec.cpuset) ::sched_setaffinity(0, sizeof(cpu_set_t), spec.cpuset);
  ::execve(spec.program.c_str(), argv, envp);
  int error = errno;
  const char* what = ::strerror(error);  // not async-signal-safe in theory; the text is static in glibc
  nodal::detail::write_all(STDERR_FILENO, "nodalrun: execve ");
  nodal::detail::write_all(STDERR_FILENO, spec.program);
  nodal::detail::write_all(STDERR_FILENO, ": ");
  nodal::detail::write_all(STDERR_FILENO, what);
  nodal::detail::write_all(STDERR_FILENO, "\n");
  ::_exit(error == ENOENT ? 127 : 126);
}

}  // namespace

pid_t launch(const LaunchSpec& spec) {
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);
  const pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) nodal::detail::throw_errno("fork");
  if (pid == 0) exec_child(spec, argv.data(), envp.data(), launcher);
  ::setpgid(pid, pid);  // also in the child: whichever runs first, the group exists before we signal it
  return pid;
}

}  // namespace nodal::launcher
