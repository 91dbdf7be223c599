#include "shm_guard.hpp"

#include <nodal/detail/posix.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace nodal::launcher {

ShmGuard::ShmGuard(std::string path) : path_(std::move(path)) {
  int fds[2];
  // Close-on-exec: no rank may hold the write end, or the guard would wait for the ranks too.
  if (::pipe2(fds, O_CLOEXEC) < 0) detail::throw_errno("pipe2");
  pid_ = ::fork();
  if (pid_ < 0) detail::throw_errno("fork");
  if (pid_ == 0) {
    ::close(fds[1]);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    char byte;
    while (::read(fds[0], &byte, 1) != 0 && (errno == EINTR || errno == 0)) {
    }
    ::unlink(path_.c_str());
    ::_exit(0);
  }
  ::close(fds[0]);
  pipe_write_ = fds[1];
}

ShmGuard::~ShmGuard() {
  ::unlink(path_.c_str());
  if (pipe_write_ >= 0) ::close(pipe_write_);
  if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
}

}  // namespace nodal::launcher
